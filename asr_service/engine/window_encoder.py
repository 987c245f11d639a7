"""The encoder over audio windows: whole 30 s windows batched together, and audio-sized ones
(DecodeParams.audio_sized_encoder: realtime previews) over their own seconds only, the rest of
the window taken from a silent window's output."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..pcm import SAMPLE_RATE
from .features import CHUNK_SECONDS, N_FRAMES, log_mel_spectrogram
from .model import Whisper
from .phase_clock import PhaseClock

# An audio-sized encoding reads this much silence after the audio too, so the speech's last
# frames see the silence that follows them in a whole window.
AUDIO_SIZED_MARGIN_S = 1.0


class WindowEncoder:
    """(audio, sized) windows -> encoder outputs, timed as the engine's "encoder" phase.
    ``encoder_dtype``: autocast's dtype (bf16), None for the model's own precision."""

    def __init__(self, model: Whisper, encoder_dtype: torch.dtype | None, clock: PhaseClock):
        self.model = model
        self.device, self.dtype = model.decoder.positions.device, model.activation_dtype
        self.encoder_dtype = encoder_dtype
        self.clock = clock
        self._silent_window: torch.Tensor | None = None  # encoder output of a silent window, once needed

    def __call__(self, windows: list[tuple[np.ndarray, bool]]) -> torch.Tensor:
        """Encoder output per (audio, sized) window. Whole windows are encoded together; a sized
        one alone, over its own seconds only."""
        with self.clock.timing("encoder"):
            outputs: list[torch.Tensor | None] = [None] * len(windows)
            whole = [i for i, (_, sized) in enumerate(windows) if not sized]
            if whole:
                for i, output in zip(whole, self._encode([windows[i][0] for i in whole])):
                    outputs[i] = output
            for i, (audio, sized) in enumerate(windows):
                if sized:
                    outputs[i] = self._encode_audio_sized(audio)
            return torch.stack(outputs)

    def _encode(self, audios: list[np.ndarray], frames: int = N_FRAMES) -> torch.Tensor:
        mel = torch.stack([log_mel_spectrogram(a, self.model.dims.n_mels)[:, :frames] for a in audios])
        with torch.autocast(self.device.type, dtype=self.encoder_dtype or torch.bfloat16,
                            enabled=self.encoder_dtype is not None):
            return self.model.encoder(mel.to(self.device, self.dtype)).to(self.dtype)

    def _encode_audio_sized(self, audio: np.ndarray) -> torch.Tensor:
        """The encoder over the audio's whole seconds plus AUDIO_SIZED_MARGIN_S; the window's
        later positions are a silent window's output, so the decoder sees the window it knows
        (speech, then silence to 30 s) at a fraction of the encoder's work."""
        if self._silent_window is None:
            self._silent_window = self._encode([np.zeros(0, dtype=np.float32)])[0]
        seconds = min(CHUNK_SECONDS, math.ceil(audio.shape[0] / SAMPLE_RATE + AUDIO_SIZED_MARGIN_S))
        head = self._encode([audio], seconds * N_FRAMES // CHUNK_SECONDS)[0]
        return torch.cat([head, self._silent_window[head.shape[0]:]])
