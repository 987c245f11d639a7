"""Whether a decode's text accounts for the speech under it, and where to cut a window that
must be decoded again in parts.

Pure functions over a chunk's speech regions (SpeechGate.speech_regions: unpadded sample ranges
of speech) and its parsed decode; window_decode.WindowDecode runs the VAD and acts on them.

A segment is *thin* when it lies over at least THIN_MIN_SPEECH_S of speech and holds too few
text tokens for it, by either measure:
- fewer than THIN_TOKENS_PER_SPEECH_S a second: under a third of the slowest pace measured on
  the bench's speech (3.2-5.7 tokens a second of the VAD's speech, four voices and three
  recorded clips), so such a segment has skipped most of what was said: a sentence the decode
  left out because it had just written it, or a sampled retry's few words placed over many
  seconds;
- fewer than THIN_SHARE_OF_PACE of the pace of the window's other segments (their median, over
  at least two segments of a second of speech or more, with those of the window a part was cut
  from). A voice keeps its pace within a window, so a segment well below it most often holds
  one of two sentences said one after the other (or two of three): the decode wrote a repeat
  once.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from adapters.base import ParsedOutput

THIN_MIN_SPEECH_S = 3.0
THIN_TOKENS_PER_SPEECH_S = 1.0
THIN_SHARE_OF_PACE = 0.7
PACE_MIN_SPEECH_S = 1.0  # a segment over less speech than this says little about the pace

Regions = list[tuple[int, int]]  # sample ranges of speech, in order


def speech_in(regions: Regions, start: int, end: int) -> int:
    """Samples of speech between ``start`` and ``end``."""
    return sum(max(0, min(end, e) - max(start, s)) for s, e in regions)


@dataclass(frozen=True)
class DecodedSpan:
    """A decode of the audio from ``offset`` (samples into the window) to the window's end."""

    offset: int
    parsed: ParsedOutput
    length: int


def _segments(decodes: list[DecodedSpan], regions: Regions, sample_rate: int) -> list[tuple[int, int, int, float]]:
    """(start, end, text tokens, seconds of speech) of each segment of the decodes, in samples
    into the window. Without timestamps a decode's whole text is one segment over all of its
    audio; a segment a decode left open runs to the window's end."""
    out = []
    for decode in decodes:
        parsed, offset = decode.parsed, decode.offset
        if parsed.failure is not None:
            continue
        if parsed.segments and parsed.segments[0].start is not None:
            spans = [(offset + round(s.start * sample_rate),
                      offset + (decode.length if s.end is None else round(s.end * sample_rate)), len(s.token_ids))
                     for s in parsed.segments]
        else:
            spans = [(offset, offset + decode.length, sum(len(s.token_ids) for s in parsed.segments))]
        out += [(start, end, tokens, speech_in(regions, start, end) / sample_rate) for start, end, tokens in spans]
    return out


def may_be_thin(decodes: list[DecodedSpan], sample_rate: int) -> bool:
    """Whether any segment spans THIN_MIN_SPEECH_S or more: none can be thin otherwise (it holds
    no more speech than its length), and the VAD need not scan the window."""
    longest = THIN_MIN_SPEECH_S * sample_rate
    return any(end - start >= longest for start, end, _, _ in _segments(decodes, [], sample_rate))


def paces(decodes: list[DecodedSpan], regions: Regions, sample_rate: int) -> list[float]:
    """Text tokens per second of speech of each segment over at least PACE_MIN_SPEECH_S of it."""
    return [tokens / speech_s for _, _, tokens, speech_s in _segments(decodes, regions, sample_rate)
            if speech_s >= PACE_MIN_SPEECH_S]


def thin_spans(decodes: list[DecodedSpan], regions: Regions, sample_rate: int,
               reference: tuple[float, ...] = ()) -> list[tuple[int, int]]:
    """The (start, end) samples (into the window) of the thin segments of a window's decodes, in
    order. The pace they are held to is that of the window's other segments with ``reference``
    (paces of the same voice from a decode of audio around this one, such as the whole window
    this one is a part of)."""
    measured = _segments(decodes, regions, sample_rate)
    thin = []
    for i, (start, end, tokens, speech_s) in enumerate(measured):
        if speech_s < THIN_MIN_SPEECH_S:
            continue
        others = [n / s for j, (_, _, n, s) in enumerate(measured) if j != i and s >= PACE_MIN_SPEECH_S]
        others += reference
        slow = len(others) >= 2 and tokens / speech_s < THIN_SHARE_OF_PACE * statistics.median(others)
        if tokens < THIN_TOKENS_PER_SPEECH_S * speech_s or slow:
            thin.append((start, end))
    return thin


def pause_near(regions: Regions, target: int, low: int, high: int) -> int | None:
    """The middle of the pause between two speech regions nearest ``target`` that lies between
    ``low`` and ``high`` (samples), or None."""
    pauses = [(end + start) // 2 for (_, end), (start, _) in zip(regions, regions[1:])]
    inside = [p for p in pauses if low <= p <= high]
    return min(inside, key=lambda p: abs(p - target)) if inside else None
