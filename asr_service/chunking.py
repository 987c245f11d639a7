"""Cut long audio into windows the model can take, at quiet points.

Rule: each chunk ends at most ``max_seconds`` after it starts; the cut goes in the middle of
the quietest ``window_seconds`` RMS window within the last ``search_seconds`` before that
limit. Every window of the search region is considered, the one ending exactly at the limit
included (the anchor implementation skips it). Offsets are true sample positions, so
timestamps never drift by chunk index.

With the speech gate, a window joins stretches of speech and leaves out the long silences
between them (speech_windows): its samples then come from several places in the audio, and
the window maps its own time back to the audio's (AudioChunk.source_seconds).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class AudioChunk:
    """Samples the model decodes as one window, and where in the request's audio they come
    from: ``samples[0]`` is the audio's sample ``start_sample``, and the samples run on
    contiguously except at each ``joins`` entry (offset into ``samples``, audio sample), where a
    later stretch of the audio begins (the silence before it was left out). ``join_margin``:
    the samples of silence (the padding around speech) kept on each side of a join.
    ``samples`` is None in a released window (``released``): its map without its samples."""

    start_sample: int
    samples: np.ndarray | None
    sample_rate: int
    joins: tuple[tuple[int, int], ...] = ()
    join_margin: int = 0
    length: int = 0  # samples in the window: taken from ``samples`` where they are given

    def __post_init__(self) -> None:
        if self.samples is not None:
            object.__setattr__(self, "length", self.samples.shape[0])

    @property
    def start(self) -> float:
        return self.start_sample / self.sample_rate

    @property
    def duration(self) -> float:
        """Seconds of samples (the window's own time; the audio it spans may be longer)."""
        return self.length / self.sample_rate

    @property
    def stretches(self) -> list[tuple[int, int]]:
        """The sample ranges of the audio that the window holds, end to end."""
        starts = [(0, self.start_sample)] + list(self.joins)
        ends = [offset for offset, _ in self.joins] + [self.length]
        return [(source, source + end - offset) for (offset, source), end in zip(starts, ends)]

    def released(self) -> AudioChunk:
        """The window's map without its samples. A window joined across pauses holds a copy of
        its stretches of the audio; what is kept of a decoded window until the response is
        assembled (the map) need not keep that copy, which for a long file would be a second
        copy of its speech. ``rebuilt`` makes the samples again."""
        return replace(self, samples=None)

    def rebuilt(self, audio: np.ndarray) -> AudioChunk:
        """The window again, with its samples, from the request's audio."""
        return AudioChunk.joined(audio, self.stretches, self.sample_rate, self.join_margin)

    @property
    def end(self) -> float:
        """Where in the audio the window's last sample ends (seconds)."""
        return self.source_seconds(self.duration, closing=True)

    @property
    def join_offsets(self) -> list[int]:
        """Where (samples into the window) each later stretch begins."""
        return [offset for offset, _ in self.joins]

    def source_sample(self, offset: int, closing: bool = False) -> int:
        """The audio's sample at ``offset`` into the window, for a time that opens something (a
        segment's or a word's start) or, with ``closing``, ends it. Around a join the window
        holds only the kept silence (``join_margin`` each side) and Whisper's times are a few
        hundred milliseconds loose, so an opening time in the silence before a join belongs to
        the speech after it, and a closing time in the silence after a join to the speech
        before it: either maps to that side of the join. (Times in the silence on their own
        side stay: the VAD hears speech begin a little late, so a start in the silence just
        before the speech is often the better one; word_timing.snap_to_speech_onsets bounds
        it.) An opening time at a join is the next stretch's first sample, a closing one the
        end of the stretch before."""
        offsets = self.join_offsets
        if closing:
            k = bisect_left(offsets, offset)  # the joins before the offset
            if k and offset - offsets[k - 1] <= self.join_margin:
                offset, k = offsets[k - 1], k - 1
        else:
            k = bisect_right(offsets, offset)  # the joins at or before the offset
            if k < len(offsets) and offsets[k] - offset <= self.join_margin:
                offset, k = offsets[k], k + 1
        base_offset, base_source = (0, self.start_sample) if k == 0 else self.joins[k - 1]
        return base_source + offset - base_offset

    def source_seconds(self, seconds: float, closing: bool = False) -> float:
        """The audio's time at ``seconds`` into the window (see source_sample), to the sample."""
        return self.source_sample(round(seconds * self.sample_rate), closing) / self.sample_rate

    def source_span(self, start: float, end: float) -> tuple[float, float]:
        """The audio's times of something that cannot run across a left-out pause (a word):
        one that spans a join in the window's time is given to the side of the join that holds
        more of it, from or to the edge of the speech on that side. DTW readily stretches a
        word over the silence before it."""
        rate, first, last = self.sample_rate, round(start * self.sample_rate), round(end * self.sample_rate)
        for join, _ in self.joins:
            if first < join < last:
                if join - first <= last - join:
                    first = min(join + self.join_margin, last)
                else:
                    last = max(join - self.join_margin, first)
        opening, closing = self.source_sample(first), self.source_sample(last, closing=True)
        return opening / rate, max(opening, closing) / rate

    def tail(self, offset: int) -> AudioChunk:
        """The window from ``offset`` (samples into it) on, with its map."""
        k = bisect_right(self.join_offsets, offset)
        base_offset, base_source = (0, self.start_sample) if k == 0 else self.joins[k - 1]
        later = tuple((o - offset, source) for o, source in self.joins[k:])
        return AudioChunk(base_source + offset - base_offset, self.samples[offset:], self.sample_rate, later,
                          self.join_margin)

    def split(self, at: list[int]) -> list[AudioChunk]:
        """The window cut at some of its joins (offsets into it), each part a window of its own."""
        parts, rest, done = [], self, 0
        for offset in sorted(at):
            head = AudioChunk(rest.start_sample, rest.samples[: offset - done], self.sample_rate,
                              tuple(j for j in rest.joins if j[0] < offset - done), self.join_margin)
            parts.append(head)
            rest, done = rest.tail(offset - done), offset
        return parts + [rest]

    @classmethod
    def joined(cls, audio: np.ndarray, stretches: list[tuple[int, int]], sample_rate: int,
               join_margin: int = 0) -> AudioChunk:
        """One window of the audio's ``stretches`` (sorted sample ranges) end to end."""
        joins, offset = [], 0
        for i, (start, end) in enumerate(stretches):
            if i:
                joins.append((offset, start))
            offset += end - start
        samples = np.concatenate([audio[start:end] for start, end in stretches])
        return cls(stretches[0][0], samples, sample_rate, tuple(joins), join_margin)


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
    return [_padded(regions, i, pad, length) for i in range(len(regions))]


def _padded(regions: list[tuple[int, int]], i: int, pad: int, length: int) -> tuple[int, int]:
    """Region ``i`` padded (pad_regions): it depends on the regions on either side alone."""
    start, end = regions[i]
    before = (regions[i - 1][1] + start) // 2 if i else 0
    after = (end + regions[i + 1][0]) // 2 if i + 1 < len(regions) else length
    return max(start - pad, before), min(end + pad, after)


def speech_windows(audio: np.ndarray, speech: list[tuple[int, int]], sample_rate: int = 16000,
                   max_seconds: float = 30.0, pad_seconds: float = 0.4, long_pause_seconds: float = 1.8,
                   kept_pause_seconds: float = 1.2, join_long_pauses: bool = True,
                   first_seconds: float | None = None) -> list[AudioChunk]:
    """Windows of at most ``max_seconds`` of samples that hold the ``speech`` regions (sorted
    sample ranges as the VAD heard them), each padded by ``pad_seconds`` (pad_regions), packed
    as full as they go. A pause shorter than ``long_pause_seconds`` stays in its window as it
    is; a longer one is left out but for ``kept_pause_seconds`` of it (at least the padding on
    either side), half before the join and half after, so windows are shorter than the audio
    they span and map their time back (AudioChunk.joined). Every window starts and ends in the
    padding around speech; the silence between windows is not decoded at all. Without
    ``join_long_pauses`` a long pause ends a window instead (each window then holds speech
    that runs on, as one speaker's turn or one language does). Only a region longer than
    ``max_seconds`` (speech with no pause) is cut inside, at its quietest point in the last
    LONG_SPEECH_SEARCH_S before each limit (split_audio). ``first_seconds``: the first window
    holds at most this much (unless its first region alone is longer), the later ones as
    before.

    Packing matters because every window costs a whole encoder pass however little speech it
    holds: audio with a pause every few seconds would otherwise take a window for each
    utterance. Leaving long silences out matters too: Whisper tends to end its decode at a long
    silence and leave the speech after it undecoded, or to invent words inside it. A kept pause
    a little longer than the padding (1.2 s, not 0.8) measured a few word errors fewer over six
    long files, greedy and with beams (docs/long-form.md)."""
    return SpeechWindowPacker(audio, sample_rate, max_seconds, pad_seconds, long_pause_seconds,
                              kept_pause_seconds, join_long_pauses, first_seconds).finish(speech)


class SpeechWindowPacker:
    """speech_windows for regions found a part of the audio at a time (a long file's VAD scan,
    block by block): ``windows_final`` hands out the windows that speech found later cannot
    change, ``finish`` the rest once every region is known; together they are speech_windows'
    windows. A region's padding depends on the next region, and a window is closed by the
    first piece that does not fit in it, so a region is packed once the one after it is known."""

    def __init__(self, audio: np.ndarray, sample_rate: int, max_seconds: float, pad_seconds: float,
                 long_pause_seconds: float, kept_pause_seconds: float, join_long_pauses: bool,
                 first_seconds: float | None = None):
        rate = sample_rate
        self._audio, self._rate, self._max_seconds = audio, rate, max_seconds
        self._pad = round(pad_seconds * rate)
        self._max_len = int(max_seconds * rate)
        # The first window's bound, when shorter: it decodes first and alone, so a request's
        # first text comes early (transcription.Transcriber.run).
        self._first_max_len = int(min(first_seconds or max_seconds, max_seconds) * rate)
        self._closed = 0  # windows handed out so far
        self._long_gap = max(0, round(long_pause_seconds * rate) - 2 * self._pad)  # a long pause between padded regions
        # silence kept each side of a join
        self._margin = max(self._pad, round(min(kept_pause_seconds, long_pause_seconds) * rate / 2))
        self._join_long_pauses = join_long_pauses
        self._packed = 0  # regions packed so far
        self._stretches: list[list[int]] = []  # the open window's contiguous [start, end] ranges
        self._length = 0  # samples in the open window

    def windows_final(self, regions: list[tuple[int, int]]) -> list[AudioChunk]:
        """The windows closed by packing every region of ``regions`` (the regions found so far,
        in order; a later call's list extends this one's) that has one after it."""
        return self._pack(regions, len(regions) - 1)

    def finish(self, regions: list[tuple[int, int]]) -> list[AudioChunk]:
        """The windows left once ``regions`` is all the speech in the audio."""
        windows = self._pack(regions, len(regions))
        if self._stretches:
            windows.append(self._window())
            self._stretches = []
        return windows

    def _pack(self, regions: list[tuple[int, int]], upto: int) -> list[AudioChunk]:
        closed = []
        while self._packed < upto:
            start, end = _padded(regions, self._packed, self._pad, self._audio.shape[0])
            self._packed += 1
            for c in split_audio(self._audio[start:end], self._rate, self._max_seconds, LONG_SPEECH_SEARCH_S):
                piece_start, piece_end = start + c.start_sample, start + c.start_sample + c.samples.shape[0]
                if not self._fits(piece_start, piece_end):
                    if self._stretches:
                        closed.append(self._window())
                    self._stretches, self._length = [[piece_start, piece_end]], piece_end - piece_start
        return closed

    def _fits(self, start: int, end: int) -> bool:
        """Add the piece to the open window if it fits there (False: it opens the next one)."""
        if not self._stretches:
            return False
        gap = start - self._stretches[-1][1]
        widen = min(self._margin - self._pad, gap // 2) if gap >= self._long_gap else 0  # more of a long pause kept, each side
        grown = self._length + (end - start) + (gap if gap < self._long_gap else 2 * widen)
        if grown > (self._max_len if self._closed else self._first_max_len) or (gap >= self._long_gap
                                                                              and not self._join_long_pauses):
            return False
        if gap < self._long_gap:
            self._stretches[-1][1] = end
        else:
            self._stretches[-1][1] += widen
            self._stretches.append([start - widen, end])
        self._length = grown
        return True

    def _window(self) -> AudioChunk:
        self._closed += 1
        return AudioChunk.joined(self._audio, [(start, end) for start, end in self._stretches], self._rate, self._margin)


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
