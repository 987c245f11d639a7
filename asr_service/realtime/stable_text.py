"""Which text of a growing utterance is safe to send: what two consecutive decodes agree on.

Deltas are never taken back, so a partial decode's text goes out only where the decode
before it (on less audio) said the same words. The unit is the word, or the character for
languages written without spaces (the adapter's joiner is "" for them). Units agree when
their letters and digits do: a decode that stops at the end of its audio punctuates and
capitalises its last words as an ending ("1 2 3 4" then "1, 2, 3, 4, 5,"; "The Quick Brown
Fist." then "The quick brown fox jumps"), and holding a word until its punctuation settles
would hold every word for a third decode. The latest decode's spelling is what goes out.
"""

from __future__ import annotations

import difflib


def units(text: str, joiner: str) -> list[str]:
    return text.split() if joiner else list(text.replace(" ", ""))


def _letters(unit: str) -> str:
    return "".join(c for c in unit.lower() if c.isalnum())


def _same_words(a: list[str], b: list[str]) -> int:
    """How many units ``a`` and ``b`` start with that say the same thing."""
    n = 0
    while n < min(len(a), len(b)) and _letters(a[n]) == _letters(b[n]):
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


def agreed(previous: str, latest: str, joiner: str) -> list[str]:
    """The units both decodes start with, as the latest spells them."""
    b = units(latest, joiner)
    return b[: _same_words(units(previous, joiner), b)]


def extension(sent: list[str], stable: list[str], joiner: str) -> str:
    """The delta that takes the sent units to ``stable``: empty unless ``stable`` extends them."""
    if len(stable) <= len(sent) or _same_words(sent, stable) < len(sent):
        return ""
    return (joiner if sent else "") + joiner.join(stable[len(sent):])


def continuation(sent: list[str], final: str, joiner: str) -> str:
    """The part of the final text that comes after what was already sent.

    The final decode usually starts with the sent units. When it does not (punctuation, case or
    a word changed: "1, 2, 3," sent, "1-2-3" final), the two are aligned on their letters and
    digits alone, and the final units after the last one the sent text covers follow; the sent
    text itself stands.
    """
    final_units = units(final, joiner)
    if final_units[: len(sent)] == sent:
        rest = final_units[len(sent):]
    else:
        sent_letters = "".join(_letters(u) for u in sent)
        final_letters = [_letters(u) for u in final_units]
        blocks = [b for b in difflib.SequenceMatcher(None, sent_letters, "".join(final_letters),
                                                     autojunk=False).get_matching_blocks() if b.size]
        # Where the sent text ends in the final's letters: after the last match, plus the sent
        # letters that follow it unmatched.
        last = blocks[-1] if blocks else difflib.Match(0, 0, 0)
        covered = last.b + last.size + (len(sent_letters) - last.a - last.size)
        start, first = 0, len(final_units)
        for i, letters in enumerate(final_letters):
            if start + len(letters) / 2 >= covered:  # less than half of this unit was covered
                first = i
                break
            start += len(letters)
        rest = final_units[first:]
    if not rest:
        return ""
    return (joiner if sent else "") + joiner.join(rest)
