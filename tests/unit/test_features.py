import numpy as np
import pytest

from asr_service.engine.features import N_FRAMES, log_mel_spectrogram, mel_filters

pytestmark = pytest.mark.unit


def test_mel_filters_match_transformers_slaney_filterbank():
    audio_utils = pytest.importorskip("transformers.audio_utils")
    reference = audio_utils.mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0, max_frequency=8000.0,
        sampling_rate=16000, norm="slaney", mel_scale="slaney",
    ).T
    assert np.abs(mel_filters(80).numpy() - reference).max() < 1e-7


def test_log_mel_window_shape_and_range():
    t = np.arange(16000) / 16000
    mel = log_mel_spectrogram(np.sin(2 * np.pi * 440 * t).astype(np.float32), 80)
    assert mel.shape == (80, N_FRAMES)
    # Whisper's normalisation: at most 8 (log10 units) of dynamic range, scaled by 1/4.
    assert float(mel.max() - mel.min()) <= 2.0 + 1e-6
