"""Which text of a growing utterance is safe to send: what two consecutive decodes agree on.

Deltas are never taken back, so a partial decode's text goes out only where the decode
before it (on less audio) said the same thing. The unit is the word, or the character for
languages written without spaces (the adapter's joiner is "" for them).
"""

from __future__ import annotations

import difflib


def units(text: str, joiner: str) -> list[str]:
    return text.split() if joiner else list(text.replace(" ", ""))


def agreed(previous: str, latest: str, joiner: str) -> list[str]:
    """The units both decodes start with."""
    a, b = units(previous, joiner), units(latest, joiner)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return b[:n]


def extension(sent: list[str], stable: list[str], joiner: str) -> str:
    """The delta that takes the sent units to ``stable``: empty unless ``stable`` extends them."""
    if len(stable) <= len(sent) or stable[: len(sent)] != sent:
        return ""
    return (joiner if sent else "") + joiner.join(stable[len(sent):])


def continuation(sent: list[str], final: str, joiner: str) -> str:
    """The part of the final text that comes after what was already sent.

    The final decode usually starts with the sent units. When it does not (a word the partial
    decodes agreed on and the last one changed), the sent units are matched against it and
    the text after their last match follows; the sent text itself stands.
    """
    final_units = units(final, joiner)
    if not sent:
        return joiner.join(final_units)
    if final_units[: len(sent)] == sent:
        rest = final_units[len(sent):]
    else:
        blocks = [b for b in difflib.SequenceMatcher(None, sent, final_units, autojunk=False).get_matching_blocks()
                  if b.size]
        if blocks:  # the unmatched tail of the sent text stands for as many final units
            last = blocks[-1]
            rest = final_units[last.b + last.size + len(sent) - (last.a + last.size):]
        else:
            rest = final_units[len(sent):]
    return (joiner + joiner.join(rest)) if rest else ""
