"""Server VAD for realtime sessions: where speech starts and stops in a live stream.

Silero VAD's own streaming helper (``silero_vad.VADIterator``) runs the state machine: speech
starts at the first 32 ms frame scoring at or above ``threshold`` and stops once frames have
scored below ``threshold - 0.15`` for ``silence_duration_ms``. Each session gets its own copy
of the model, because the model carries recurrent state from frame to frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..pcm import SAMPLE_RATE
from ..speech_gate import one_torch_thread

FRAME = 512  # samples per Silero step at 16 kHz


@dataclass(frozen=True)
class TurnDetectionSettings:
    """OpenAI's ``server_vad`` fields, with its defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300  # audio kept from before the detected start
    silence_duration_ms: int = 500  # this much silence ends the turn

    def describe(self) -> dict:
        return {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms}


@dataclass(frozen=True)
class SpeechBoundary:
    kind: str  # "start" or "stop"
    sample: int  # position in the session's stream, in 16 kHz samples


class TurnDetector:
    def __init__(self, vad_model: torch.nn.Module, settings: TurnDetectionSettings, start_sample: int = 0):
        """``vad_model``: this detector's own Silero model; ``start_sample``: the stream position
        of the first sample it will be fed."""
        from silero_vad import VADIterator

        self.settings = settings
        self._iterator = VADIterator(vad_model, threshold=settings.threshold,
                                     sampling_rate=SAMPLE_RATE,
                                     min_silence_duration_ms=settings.silence_duration_ms, speech_pad_ms=0)
        self._carry = np.zeros(0, dtype=np.float32)  # samples short of a whole frame
        self._start = start_sample

    @property
    def in_speech(self) -> bool:
        return bool(self._iterator.triggered)

    @property
    def pause_start(self) -> int | None:
        """Where the silence began that may end the open turn (None: no turn, or speech goes on)."""
        iterator = self._iterator
        return self._start + int(iterator.temp_end) if iterator.triggered and iterator.temp_end else None

    def feed(self, samples: np.ndarray) -> list[SpeechBoundary]:
        """Boundaries found in these samples (CPU work, ~0.25 ms per frame: call off the event loop)."""
        audio = np.concatenate([self._carry, samples]) if self._carry.size else samples
        whole = audio.shape[0] - audio.shape[0] % FRAME
        self._carry = audio[whole:].copy()
        found = []
        with torch.inference_mode(), one_torch_thread():
            frames = torch.from_numpy(np.ascontiguousarray(audio[:whole], dtype=np.float32))
            for start in range(0, whole, FRAME):
                event = self._iterator(frames[start : start + FRAME])
                if event:
                    kind, at = next(iter(event.items()))
                    found.append(SpeechBoundary("start" if kind == "start" else "stop", self._start + int(at)))
        return found
