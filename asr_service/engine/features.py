"""Whisper log-mel features in torch (16 kHz, n_fft 400, hop 160, Slaney mel scale)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..pcm import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    # Slaney scale: linear below 1 kHz, logarithmic above.
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_region = f >= 1000.0
    return np.where(log_region, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f = m * (200.0 / 3)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), f)


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> torch.Tensor:
    """Slaney-normalised triangular filters [n_mels, n_fft // 2 + 1], as Whisper was trained with."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


@functools.lru_cache(maxsize=1)
def _window() -> torch.Tensor:
    return torch.hann_window(N_FFT)


def log_mel_spectrogram(audio: np.ndarray, n_mels: int) -> torch.Tensor:
    """audio (float32, 16 kHz, at most 30 s) -> [n_mels, 3000] normalised log-mel window."""
    samples = torch.zeros(N_SAMPLES, dtype=torch.float32)
    clip = torch.from_numpy(np.ascontiguousarray(audio[:N_SAMPLES], dtype=np.float32))
    samples[: clip.shape[0]] = clip
    stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=_window(), return_complex=True)
    power = stft[:, :-1].abs() ** 2
    mel = mel_filters(n_mels) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0
