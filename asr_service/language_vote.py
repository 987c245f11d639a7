"""One language for a request whose chunks each detected their own.

Chunks decode concurrently, so each runs fused detection. The request's language is the
duration-weighted vote of the chunks' language probabilities; a chunk that disagrees with
the vote without being sure of itself is an outlier, decoded again with the vote's language.
"""

from __future__ import annotations

# A chunk at least this sure of a different language keeps it (genuine code-switching);
# below, its detection is treated as noise. Whisper base puts 0.9+ on clear speech.
OUTLIER_MAX_CONFIDENCE = 0.8


def vote(chunks: list[tuple[dict[str, float], float]], language: str | None = None) -> tuple[str | None, float | None]:
    """(language, share of the vote) from (language probabilities, seconds) per chunk; with
    ``language`` given (the request named it), that language's share."""
    totals: dict[str, float] = {}
    for probs, seconds in chunks:
        for code, p in probs.items():
            totals[code] = totals.get(code, 0.0) + p * seconds
    if not totals:
        return language, None
    language = language or max(totals, key=totals.get)
    whole = sum(totals.values())
    return language, (round(totals.get(language, 0.0) / whole, 4) if whole > 0 else None)


def is_outlier(chunk_language: str | None, probs: dict[str, float], request_language: str | None) -> bool:
    if chunk_language is None or request_language is None or chunk_language == request_language:
        return False
    return probs.get(chunk_language, 0.0) < OUTLIER_MAX_CONFIDENCE
