"""Which text of a growing utterance is safe to send: what two consecutive decodes agree on.

Deltas are never taken back, so a partial decode's text goes out only where the decode
before it (on less audio) said the same words. The unit is the word, or the character for
languages written without spaces (the adapter's joiner is "" for them). Units agree when
their letters and digits do: a decode that stops at the end of its audio punctuates and
capitalises its last words as an ending ("1 2 3 4" then "1, 2, 3, 4, 5,"; "The Quick Brown
Fist." then "The quick brown fox jumps"), and holding a word until its punctuation settles
would hold every word for a third decode. English units are compared after Whisper's English
normaliser as well, because the model writes numbers as words on a second of audio and as
digits once it hears more ("One, two, three." then "1, 2, 3, 4,"). The latest decode's spelling
is what goes out.
"""

from __future__ import annotations

import difflib
import re

# Whisper's own English normaliser (numbers, spelling variants); other languages have none that
# keeps a unit's meaning, so their units are compared on letters and digits only.
from whisper_normalizer.english import EnglishTextNormalizer

_ENGLISH = EnglishTextNormalizer()


def units(text: str, joiner: str) -> list[str]:
    return text.split() if joiner else list(text.replace(" ", ""))


def _letters(unit: str) -> str:
    return "".join(c for c in unit.lower() if c.isalnum())


def _key(unit: str, language: str | None) -> str:
    """What a unit says, for comparing it with another decode's: "1," "One," and "one" alike
    in English."""
    return _letters(_ENGLISH(unit) if language == "en" else unit)


def _same_words(a: list[str], b: list[str], language: str | None) -> int:
    """How many units ``a`` and ``b`` start with that say the same thing."""
    n = 0
    while n < min(len(a), len(b)) and _key(a[n], language) == _key(b[n], language):
        n += 1
    return n


MAX_LOOP_PERIOD = 4  # units


def before_loop(text: str, joiner: str) -> str:
    """A decode cut by its token budget is looping on audio cut mid-word ("7, 8, 7, 8, 7, ..."):
    its text up to the loop's first turn, which later decodes may agree with; "" when the
    repetition has no short period (nothing there to trust)."""
    found = units(text, joiner)
    letters = [_letters(u) for u in found]
    for period in range(1, MAX_LOOP_PERIOD + 1):
        repeated = 0  # trailing units that repeat the unit a period before them
        while (repeated < len(found) - period
               and letters[-1 - repeated] == letters[-1 - repeated - period]):
            repeated += 1
        if repeated >= 2 * period:  # the pattern came at least three times
            return joiner.join(found[: len(found) - repeated])
    return ""


def agreed(previous: str, latest: str, joiner: str, language: str | None) -> list[str]:
    """The units both decodes start with, as the latest spells them."""
    b = units(latest, joiner)
    return b[: _same_words(units(previous, joiner), b, language)]


def extension(sent: list[str], stable: list[str], joiner: str, language: str | None) -> str:
    """The delta that takes the sent units to ``stable``: its units past the sent ones. Where
    ``stable`` spells the sent part differently ("One, two," sent, "1, 2, 3, 4" agreed since),
    the sent units are aligned with it as the final text is (continuation), so the preview goes
    on instead of waiting for the final decode; empty when ``stable`` says nothing past them."""
    if len(stable) <= len(sent):
        return ""
    if _same_words(sent, stable, language) == len(sent):
        return (joiner if sent else "") + joiner.join(stable[len(sent):])
    return continuation(sent, joiner.join(stable), joiner, language)


def _parts(unit: str) -> int:
    """Words a unit says: "1-2-3-4." says four."""
    return max(1, sum(1 for part in re.split(r"[-‐–—]", unit) if _letters(part)))


def continuation(sent: list[str], final: str, joiner: str, language: str | None) -> str:
    """The part of the final text that comes after what was already sent.

    The final decode usually starts with the sent units. When it does not, the two are aligned
    unit by unit on what they say (_key: "1, 2, 3," sent and "1, 2, 3, 4" final; "but
    weather" sent and "The weather today" final): the final units after the last sent unit it
    also says, or after as many words as the sent units left after that say. Where nothing
    aligns (the final spells the sent part otherwise: "One, two, three," sent, "1-2-3-4-5"
    final), the sent text is taken to stand for as many of the final's words as it says. The
    sent text itself stands; a final unit only partly covered goes out whole, so words may be
    said twice but none is lost.
    """
    final_units = units(final, joiner)
    if final_units[: len(sent)] == sent:
        rest = final_units[len(sent):]
    else:
        sent_keys = [_key(u, language) for u in sent]
        final_keys = [_key(u, language) for u in final_units]
        blocks = [b for b in difflib.SequenceMatcher(None, sent_keys, final_keys, autojunk=False)
                  .get_matching_blocks() if b.size]
        start, words = (blocks[-1].b + blocks[-1].size, blocks[-1].a + blocks[-1].size) if blocks else (0, 0)
        left = sum(_parts(u) for u in sent[words:])  # words sent after the last aligned unit
        first = len(final_units)
        for i in range(start, len(final_units)):
            if left <= 0 or _parts(final_units[i]) > left:
                first = i
                break
            left -= _parts(final_units[i])
        rest = final_units[first:]
    if not rest:
        return ""
    return (joiner if sent else "") + joiner.join(rest)
