"""When a chunk's decode is not good enough: temperature fallback and no-speech decisions.

Pure policy over a finished decode's figures, as faster-whisper and openai/whisper define it:
a decode whose text compresses too well (a repetition loop) or whose tokens are on average
unlikely is tried again at the next temperature; a window the model thinks holds no speech,
decoded with low confidence, yields no text at all (and is not retried).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class QualityThresholds:
    compression_ratio: float | None = 2.4  # above: a repetition loop
    log_prob: float | None = -1.0  # average log-probability below: unreliable text
    no_speech: float | None = 0.6  # no-speech probability above (with low log-prob): silence


@dataclass(frozen=True)
class DecodeFigures:
    """What the policy looks at in one decode of one chunk."""

    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    parsed: bool  # the output parsed (a fused prefix that came apart always retries)
    speech_found: bool = True  # False: the speech gate heard none, and nothing was decoded


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def is_silent(f: DecodeFigures, t: QualityThresholds) -> bool:
    """No speech: the speech gate heard none, or the no-speech probability is high and the
    text is not confidently decoded."""
    if not f.speech_found:
        return True
    if t.no_speech is None or f.no_speech_prob is None or f.no_speech_prob <= t.no_speech:
        return False
    return t.log_prob is None or f.avg_logprob < t.log_prob


# The rules that reject a decode and send it to the fallback, by the names the metrics and the
# log give them.
UNPARSED = "unparsed"  # the fused prefix (language, task, timestamps) came apart
COMPRESSION_RATIO = "compression_ratio"  # the text compresses like a repetition loop
LOG_PROB = "avg_logprob"  # the text's tokens are on average unlikely


def rejection(f: DecodeFigures, t: QualityThresholds) -> str | None:
    """The rule the decode fails (it is tried again hotter), or None: it is kept."""
    if not f.parsed:
        return UNPARSED
    if is_silent(f, t):
        return None  # a hotter decode of silence only invents more confidently
    if t.compression_ratio is not None and f.compression_ratio > t.compression_ratio:
        return COMPRESSION_RATIO
    if t.log_prob is not None and f.avg_logprob < t.log_prob:
        return LOG_PROB
    return None


def pick_best(attempts: list[DecodeFigures], t: QualityThresholds) -> int:
    """Index of the decode to keep: the first that passes; if none does, the most likely one
    among those that are not loops (faster-whisper's choice), else the most likely of all.

    The trade-off: speech that really repeats a sentence compresses like a loop, and then a
    worse sampled decode is kept. Preferring decodes the model ended by itself would keep
    timestamp-mode loops that run to the window's end, so loops lose: faster-whisper's rule."""
    for i, f in enumerate(attempts):
        if rejection(f, t) is None:
            return i
    candidates = [i for i, f in enumerate(attempts) if f.parsed]
    if t.compression_ratio is not None:
        not_loops = [i for i in candidates if attempts[i].compression_ratio <= t.compression_ratio]
        candidates = not_loops or candidates
    if not candidates:
        return 0
    return max(candidates, key=lambda i: attempts[i].avg_logprob)
