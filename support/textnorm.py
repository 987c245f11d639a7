"""Whisper-style text normalisation for WER: case, punctuation, English number words."""

from __future__ import annotations

import re
import unicodedata

_NUMBERS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[-‐–—]", " ", text)
    text = "".join(" " if unicodedata.category(c).startswith(("P", "S")) else c for c in text)
    words = [_NUMBERS.get(w, w) for w in text.split()]
    return " ".join(words)


def spoken(text: str) -> str:
    """Only the letters and digits, lower-cased: "1, 2, 3," and "123" say the same thing."""
    return "".join(c for c in text.lower() if c.isalnum())
