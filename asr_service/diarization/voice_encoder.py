"""Who is speaking in 1.6 s of audio: a 256-d voice embedding, close (by cosine) for the same
voice and far for different ones.

The weights are Resemblyzer's pretrained GE2E voice encoder (PyPI ``Resemblyzer``, Apache-2.0),
which ships them inside its wheel (``resemblyzer/pretrained.pt``), so nothing is downloaded at
run time. Its Python package is not imported: its import chain needs ``pkg_resources`` (gone from
current setuptools) and librosa; the network is small enough to run here on torch, batched over
many windows at once, from the package's data file. Its input, as it was trained: 40 mel bands
of power (not log) over 25 ms frames every 10 ms, at -30 dBFS or louder; its output, ReLU of a
linear layer over the last LSTM layer's final state, L2-normalised.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

import numpy as np
import torch

from ..engine.features import N_FFT, mel_filters
from ..pcm import SAMPLE_RATE

MEL_BANDS = 40
HOP = SAMPLE_RATE // 100  # 10 ms
WINDOW_FRAMES = 160  # the 1.6 s partials the encoder was trained on
WINDOW_SAMPLES = (WINDOW_FRAMES - 1) * HOP  # a centred STFT gives WINDOW_FRAMES frames
TARGET_DBFS = -30.0
EMBEDDING_SIZE = 256


def weights_path() -> Path:
    """The pretrained encoder inside the installed Resemblyzer distribution."""
    return Path(importlib.metadata.distribution("resemblyzer").locate_file("resemblyzer/pretrained.pt"))


class VoiceEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(MEL_BANDS, EMBEDDING_SIZE, num_layers=3, batch_first=True)
        self.linear = torch.nn.Linear(EMBEDDING_SIZE, EMBEDDING_SIZE)
        self.register_buffer("mel", mel_filters(MEL_BANDS), persistent=False)
        self.register_buffer("window", torch.hann_window(N_FFT), persistent=False)

    @classmethod
    @functools.cache
    def pretrained(cls) -> VoiceEncoder:
        """The packaged weights, loaded once per process (the module is only read from)."""
        encoder = cls()
        state = torch.load(weights_path(), map_location="cpu", weights_only=True)["model_state"]
        # The GE2E loss's scale and bias are saved too; embedding does not use them.
        encoder.load_state_dict({k: v for k, v in state.items() if k not in ("similarity_weight", "similarity_bias")})
        return encoder.eval()

    def embed(self, audio: np.ndarray, starts: list[int] | np.ndarray) -> np.ndarray:
        """Embeddings [len(starts), 256] of the WINDOW_SAMPLES-long windows of ``audio`` (16 kHz
        float32) starting at ``starts`` (windows past the end are zero-padded), each brought
        to TARGET_DBFS or louder first, as in training."""
        starts = np.asarray(starts, dtype=np.int64)
        if not starts.size:
            return np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)
        padded = np.zeros(int(starts.max()) + WINDOW_SAMPLES, dtype=np.float32)
        padded[: audio.shape[0]] = audio[: padded.shape[0]]
        windows = torch.from_numpy(padded).unfold(0, WINDOW_SAMPLES, 1)[torch.from_numpy(starts)]
        with torch.inference_mode():
            return self._forward(_louder(windows)).numpy()

    def embed_short(self, audio: np.ndarray) -> np.ndarray:
        """The embedding [256] of audio shorter than a window, from its own frames only (padding
        it with what is around it would mix in silence or another voice)."""
        with torch.inference_mode():
            clip = torch.from_numpy(np.ascontiguousarray(audio[:WINDOW_SAMPLES], dtype=np.float32))[None]
            return self._forward(_louder(clip)).numpy()[0]

    def _forward(self, windows: torch.Tensor) -> torch.Tensor:
        stft = torch.stft(windows, N_FFT, HOP, window=self.window, center=True, pad_mode="constant",
                          return_complex=True)
        power_mel = (self.mel @ stft.abs() ** 2).transpose(1, 2)  # [batch, frames, bands]
        _, (hidden, _) = self.lstm(power_mel)
        embedding = torch.relu(self.linear(hidden[-1]))
        return embedding / embedding.norm(dim=1, keepdim=True).clamp_min(1e-8)


def _louder(windows: torch.Tensor) -> torch.Tensor:
    """Each window raised to TARGET_DBFS when it is quieter (never lowered)."""
    dbfs = 10 * torch.log10((windows * windows).mean(dim=1, keepdim=True).clamp_min(1e-12))
    gain = torch.pow(10.0, ((TARGET_DBFS - dbfs) / 20).clamp_min(0.0))
    return windows * gain
