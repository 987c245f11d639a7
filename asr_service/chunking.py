"""Cut long audio into windows the model can take, at quiet points.

Rule: each chunk ends at most ``max_seconds`` after it starts; the cut goes in the middle of
the quietest ``window_seconds`` RMS window within the last ``search_seconds`` before that
limit. Every window of the search region is considered, the one ending exactly at the limit
included (the anchor implementation skips it). Offsets are true sample positions, so
timestamps never drift by chunk index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AudioChunk:
    start_sample: int
    samples: np.ndarray
    sample_rate: int

    @property
    def start(self) -> float:
        return self.start_sample / self.sample_rate

    @property
    def duration(self) -> float:
        return self.samples.shape[0] / self.sample_rate

    @property
    def end(self) -> float:
        return self.start + self.duration


def find_cut(audio: np.ndarray, start: int, limit: int, search: int, window: int) -> int:
    """Sample index of the cut for a chunk starting at ``start`` that may not pass ``limit``."""
    region_start = max(start + window, limit - search)
    n_windows = (limit - region_start) // window
    if n_windows < 1:
        return limit
    first = limit - n_windows * window  # windows tile the region and end exactly at the limit
    frames = audio[first:limit].reshape(n_windows, window).astype(np.float64)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    quietest = int(np.argmin(rms))
    return first + quietest * window + window // 2


# Speech with no pause the VAD counts is cut at its quietest 0.1 s within this many seconds
# before the window's limit: far enough back to find a breath between sentences, rather than
# cutting a word.
LONG_SPEECH_SEARCH_S = 5.0


def pad_regions(regions: list[tuple[int, int]], pad: int, length: int) -> list[tuple[int, int]]:
    """Speech regions (sorted sample ranges) widened by ``pad`` samples on each side, within the
    audio; where two are closer than twice that, each takes half the silence between them
    (Silero's own rule for its padding)."""
    out = []
    for i, (start, end) in enumerate(regions):
        before = (regions[i - 1][1] + start) // 2 if i else 0
        after = (end + regions[i + 1][0]) // 2 if i + 1 < len(regions) else length
        out.append((max(start - pad, before), min(end + pad, after)))
    return out


def speech_windows(audio: np.ndarray, regions: list[tuple[int, int]], sample_rate: int = 16000,
                   max_seconds: float = 30.0, max_gap_seconds: float = 1.0) -> list[AudioChunk]:
    """Windows of at most ``max_seconds`` that hold the speech ``regions`` (sorted, padded
    sample ranges) and start and end where speech pauses: consecutive regions share a window
    while it fits and the silence between them is under ``max_gap_seconds`` (Whisper tends to
    end its decode at a long silence and leave the speech after it undecoded). The silence
    between windows is not decoded at all. Only a region longer than ``max_seconds`` (speech
    with no pause) is cut inside, at its quietest point in the last LONG_SPEECH_SEARCH_S before
    each limit (split_audio)."""
    max_len = int(max_seconds * sample_rate)
    max_gap = int(max_gap_seconds * sample_rate)
    spans: list[list[int]] = []
    for start, end in regions:
        if spans and end - spans[-1][0] <= max_len and start - spans[-1][1] < max_gap:
            spans[-1][1] = end
        else:
            spans.append([start, end])
    windows: list[AudioChunk] = []
    for start, end in spans:
        windows += [AudioChunk(start + c.start_sample, c.samples, sample_rate)
                    for c in split_audio(audio[start:end], sample_rate, max_seconds, LONG_SPEECH_SEARCH_S)]
    return windows


def split_audio(
    audio: np.ndarray,
    sample_rate: int = 16000,
    max_seconds: float = 30.0,
    search_seconds: float = 1.0,
    window_seconds: float = 0.1,
) -> list[AudioChunk]:
    max_len = int(max_seconds * sample_rate)
    search = int(search_seconds * sample_rate)
    window = int(window_seconds * sample_rate)
    chunks: list[AudioChunk] = []
    pos = 0
    while audio.shape[0] - pos > max_len:
        cut = find_cut(audio, pos, pos + max_len, search, window)
        chunks.append(AudioChunk(pos, audio[pos:cut], sample_rate))
        pos = cut
    if pos < audio.shape[0] or not chunks:
        chunks.append(AudioChunk(pos, audio[pos:], sample_rate))
    return chunks
