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
        from silero_vad.utils_vad import get_speech_timestamps_from_probs

        found = get_speech_timestamps_from_probs(self._frame_probabilities(samples), sampling_rate=SAMPLE_RATE,
                                                 threshold=self.threshold if threshold is None else threshold,
                                                 min_speech_duration_ms=round(self._min_frames * FRAME * 1000 / SAMPLE_RATE),
                                                 min_silence_duration_ms=round(min_silence_seconds * 1000),
                                                 speech_pad_ms=0, audio_length_samples=len(samples))
        return [(int(r["start"]), int(r["end"])) for r in found]

    def _frame_probabilities(self, samples: np.ndarray) -> list[float]:
        """Silero's speech probability for every frame (the last one zero-padded), scanned as
        parallel streams (module docstring), ``streams_per_scan`` at a time. Each scan's input
        is overlapping views into one copy of its stretch of audio, so what a scan holds beyond
        the file is bounded by that stretch, not by the file's length (uploads may be hours)."""
        audio = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
        frames = -(-audio.shape[0] // FRAME)
        block = self.streams_per_scan * STREAM_FRAMES
        probabilities = []
        with self._lock, torch.inference_mode(), one_torch_thread():
            for first in range(0, frames, block):
                heard = _stream_inputs(audio, first, min(frames, first + block))
                scanned = torch.empty(heard.shape[:2])  # [streams, steps]
                self._model.reset_states()
                for step in range(heard.shape[1]):
                    scanned[:, step] = self._model(heard[:, step], SAMPLE_RATE)[:, 0]
                probabilities.append(scanned[:, WARM_UP_FRAMES:].flatten())
        return torch.cat(probabilities)[:frames].tolist() if probabilities else []

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
            for start in range(0, audio.shape[0] - FRAME + 1, FRAME):
                if float(self._model(audio[start : start + FRAME], SAMPLE_RATE)) >= threshold:
                    run += 1
                    if run >= self._min_frames:
                        return start - (run - 1) * FRAME
                else:
                    run = 0
        return None


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
