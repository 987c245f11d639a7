"""Is there any speech in this window? Silero VAD, before Whisper gets a chance to invent some.

Whisper answers silence, noise and music with fluent sentences ("you", "Thank you.",
"ご視聴ありがとうございました") that its own no-speech and log-probability figures do not
always catch. Silero VAD (the ``silero-vad`` PyPI package, which carries its weights) runs on
torch, rejects noise and tones, and is cheap next to a Whisper decode. The gate's scan stops at
the first stretch of speech, so windows with speech pay almost nothing and only windows without
it are scanned to the end, which then skip the Whisper decode entirely.

Finding every region of speech (speech_regions, for long audio) scans everything. Silero steps
one 32 ms frame at a time, and a step costs the same for one frame as for a batch of them, so
the audio is scanned as parallel streams of STREAM_FRAMES frames, each started WARM_UP_FRAMES
early so its recurrent state has heard the audio before its first frame (the probabilities near
a stream's start are close to, not the same as, a scan from the beginning), and Silero's own
region rules (get_speech_timestamps_from_probs) run on the joined probabilities.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from .pcm import SAMPLE_RATE

FRAME = 512  # samples per Silero step at 16 kHz
STREAM_FRAMES = 156  # ~5 s per parallel stream of speech_regions' scan
WARM_UP_FRAMES = 125  # ~4 s heard by each stream before its own frames
SCAN_STREAMS = 128  # streams scanned together (~10 minutes of audio): bounds the scan's memory
# A file's first block is this many streams (~80 s), each next one twice the one before up to
# SCAN_STREAMS: a block's scan costs about its streams' worth, so the first windows are known
# (and decode) after a fraction of a second, for a few extra blocks' fixed cost.
FIRST_SCAN_STREAMS = 16


@dataclass(frozen=True)
class VadSettings:
    """How long audio is cut into windows (a request's ``chunking_strategy``; chunking.speech_windows):
    speech scores at least ``threshold``; regions of speech are padded by ``pad_s`` on each
    side; a pause of ``long_pause_s`` or more is shortened to ``kept_pause_s`` (at least the
    padding on either side of it), a shorter one stays as it is; windows end only where the
    next stretch of speech would not fit."""

    threshold: float = 0.5
    long_pause_s: float = 1.8
    pad_s: float = 0.4
    kept_pause_s: float = 1.2

    @property
    def min_silence_s(self) -> float:
        """Pauses shorter than this stay inside a region of speech."""
        return min(0.5, self.long_pause_s)


class SpeechGate:
    def __init__(self, threshold: float = 0.5, min_speech_seconds: float = 0.25, streams_per_scan: int = SCAN_STREAMS):
        threads = torch.get_num_threads()
        from silero_vad import load_silero_vad  # its import sets torch's thread count to 1

        torch.set_num_threads(threads)
        with warnings.catch_warnings():  # its loader uses APIs its dependencies deprecate
            warnings.simplefilter("ignore", DeprecationWarning)
            self._model = load_silero_vad()
        self.threshold = threshold
        self._min_frames = max(1, round(min_speech_seconds * SAMPLE_RATE / FRAME))
        self.min_speech_ms = round(self._min_frames * FRAME * 1000 / SAMPLE_RATE)
        self.streams_per_scan = streams_per_scan
        self._lock = threading.Lock()  # the model carries recurrent state between frames
        # Callers on an event loop run the gate's scans here: one model, so one thread, of its
        # own, so the scans neither wait behind nor take the threads that other work uses.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speech-gate")

    def model_copy(self) -> torch.nn.Module:
        """A Silero model of the caller's own (streaming VAD keeps state in it)."""
        with self._lock:
            return copy.deepcopy(self._model)

    def speech_regions(self, samples: np.ndarray, min_silence_seconds: float,
                       threshold: float | None = None) -> list[tuple[int, int]]:
        """Where the speech is: (start, end) sample ranges as heard, without padding (callers pad:
        chunking.pad_regions), by Silero's own region rules over the parallel scan's
        probabilities (pauses shorter than ``min_silence_seconds`` stay inside)."""
        scan = SpeechScan(self, samples, min_silence_seconds, threshold)
        while scan.scan_block():
            pass
        return scan.regions()

    def frame_probabilities(self, audio: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """Silero's speech probability for frames ``first`` to ``end`` (the audio's last frame
        zero-padded), scanned as parallel streams (module docstring). The input is overlapping
        views into one copy of that stretch, so a scan holds a block's worth of audio, not the
        file's (uploads may be hours)."""
        with self._lock, torch.inference_mode(), one_torch_thread():
            heard = _stream_inputs(audio, first, end)
            scanned = torch.empty(heard.shape[:2])  # [streams, steps]
            self._model.reset_states()
            for step in range(heard.shape[1]):
                scanned[:, step] = self._model(heard[:, step], SAMPLE_RATE)[:, 0]
            return scanned[:, WARM_UP_FRAMES:].flatten()[: end - first]

    def has_speech(self, samples: np.ndarray, threshold: float | None = None) -> bool:
        return self.speech_start(samples, threshold) is not None

    def speech_start(self, samples: np.ndarray, threshold: float | None = None) -> int | None:
        """The sample where the first ``min_speech_seconds`` of consecutive frames scoring above
        the threshold begin; None when there are none. The scan stops there."""
        threshold = self.threshold if threshold is None else threshold
        audio = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
        run = 0
        with self._lock, torch.inference_mode(), one_torch_thread():
            self._model.reset_states()
            try:
                for start in range(0, audio.shape[0] - FRAME + 1, FRAME):
                    if float(self._model(audio[start : start + FRAME], SAMPLE_RATE)) >= threshold:
                        run += 1
                        if run >= self._min_frames:
                            return start - (run - 1) * FRAME
                    else:
                        run = 0
            finally:
                # Silero keeps the end of the last frame as context: a view of the caller's
                # samples, which would keep them (a whole window) alive until the next scan.
                self._model.reset_states()
        return None


class SpeechScan:
    """One file's speech regions, found a block of streams at a time (FIRST_SCAN_STREAMS first,
    then twice as many each block up to the gate's ``streams_per_scan``), so that its windows
    can be planned, and decoded, while the rest is still scanned.
    Silero's region rules run forward through the frames, so a region that has ended (a pause
    of ``min_silence_seconds`` heard after it) is final however much audio comes later; the
    one still open at the end of what was scanned is not, and waits for the next block."""

    def __init__(self, gate: SpeechGate, samples: np.ndarray, min_silence_seconds: float,
                 threshold: float | None = None):
        self._gate = gate
        self._audio = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
        self._frames = -(-self._audio.shape[0] // FRAME)
        self._min_silence_seconds = min_silence_seconds
        self._threshold = gate.threshold if threshold is None else threshold
        self.probabilities: list[float] = []  # each frame's, as far as scanned
        self._block_streams = min(FIRST_SCAN_STREAMS, gate.streams_per_scan)

    @property
    def done(self) -> bool:
        return len(self.probabilities) >= self._frames

    def scan_block(self) -> bool:
        """Scan the next block; False when everything was scanned already."""
        if self.done:
            return False
        first = len(self.probabilities)
        end = min(self._frames, first + self._block_streams * STREAM_FRAMES)
        self._block_streams = min(2 * self._block_streams, self._gate.streams_per_scan)
        self.probabilities += self._gate.frame_probabilities(self._audio, first, end).tolist()
        return True

    def regions(self) -> list[tuple[int, int]]:
        """The regions of speech known so far, in order, all of them once ``done``: each later
        call's list extends the one before (Silero's rules, get_speech_timestamps_from_probs)."""
        from silero_vad.utils_vad import get_speech_timestamps_from_probs

        heard = self._audio.shape[0] if self.done else len(self.probabilities) * FRAME
        found = get_speech_timestamps_from_probs(
            self.probabilities, sampling_rate=SAMPLE_RATE, threshold=self._threshold,
            min_speech_duration_ms=self._gate.min_speech_ms,
            min_silence_duration_ms=round(self._min_silence_seconds * 1000), speech_pad_ms=0,
            audio_length_samples=heard)
        regions = [(int(r["start"]), int(r["end"])) for r in found]
        if not self.done and regions and regions[-1][1] >= heard:  # still open: may run on
            regions.pop()
        return regions


def _stream_inputs(audio: torch.Tensor, first: int, end: int) -> torch.Tensor:
    """[streams, WARM_UP_FRAMES + STREAM_FRAMES, FRAME]: the input of the streams that start at
    frames ``first``, ``first + STREAM_FRAMES``, ... before ``end``; row b holds the frames from
    WARM_UP_FRAMES before stream b's start on, silent outside the audio (its last frame
    zero-padded). The rows are overlapping views of one copy of that stretch of audio."""
    streams = -(-(end - first) // STREAM_FRAMES)
    steps = WARM_UP_FRAMES + STREAM_FRAMES
    span_start = (first - WARM_UP_FRAMES) * FRAME  # in samples; before the audio's start: silence
    span = torch.zeros((WARM_UP_FRAMES + streams * STREAM_FRAMES) * FRAME)
    low, high = max(0, span_start), min(audio.shape[0], span_start + span.shape[0])
    span[low - span_start : high - span_start] = audio[low:high]
    return span.unfold(0, steps * FRAME, STREAM_FRAMES * FRAME).unflatten(1, (steps, FRAME))


@contextlib.contextmanager
def one_torch_thread():
    """Run Silero's small per-frame ops on the calling thread alone. Called from a worker thread
    (the gate's own, or a realtime session's), torch otherwise starts a second thread team next
    to the engine's, whose threads spin between the tiny ops: a scan runs several times slower
    and burns a second core. The setting is the calling thread's, and is restored; the
    process-wide count it also sets meanwhile is why the engine sets its own
    (batch_engine.BatchEngine._run)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
