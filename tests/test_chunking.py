import numpy as np
import pytest

from asr_service.chunking import split_audio

pytestmark = pytest.mark.unit

SR = 16000


def noise(seconds, seed=0, level=0.3):
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * SR))).astype(np.float32)


def test_short_audio_is_one_chunk():
    chunks = split_audio(noise(12))
    assert len(chunks) == 1 and chunks[0].start_sample == 0 and chunks[0].samples.shape[0] == 12 * SR


def test_cut_lands_in_the_quietest_window_including_the_last_one():
    audio = noise(45)
    # The only quiet 100 ms is the very last window before the 30 s limit.
    audio[30 * SR - 1600 : 30 * SR] = 0.0
    chunks = split_audio(audio)
    assert len(chunks) == 2
    cut = chunks[1].start_sample
    assert 30 * SR - 1600 <= cut < 30 * SR
    assert cut == 30 * SR - 800  # the middle of that window


def test_cut_at_a_quiet_spot_inside_the_last_second():
    audio = noise(70, seed=1)
    audio[int(29.3 * SR) : int(29.5 * SR)] *= 0.01
    audio[int(58.8 * SR) : int(59.0 * SR)] *= 0.01
    chunks = split_audio(audio)
    assert len(chunks) == 3
    assert 29.3 <= chunks[1].start <= 29.5
    assert 58.8 <= chunks[2].start <= 59.0
    # Chunks tile the input exactly: true offsets, no gaps, no overlap.
    assert sum(c.samples.shape[0] for c in chunks) == audio.shape[0]
    for a, b in zip(chunks, chunks[1:]):
        assert a.start_sample + a.samples.shape[0] == b.start_sample
    assert all(c.duration <= 30.0 for c in chunks)
