import numpy as np
import pytest

from asr_service.chunking import pad_regions, speech_windows, split_audio
from asr_service.word_timing import Word, snap_to_speech_onsets

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


def _spans(windows):
    return [(w.start_sample / SR, (w.start_sample + w.samples.shape[0]) / SR) for w in windows]


def test_speech_windows_pack_regions_and_skip_the_silence_between():
    audio = noise(120)
    s = lambda a, b: (int(a * SR), int(b * SR))  # noqa: E731 - seconds to samples
    # Turns with short pauses, a long silence, then more turns.
    regions = [s(15, 20), s(20.5, 27), s(27.6, 40), s(40.5, 46), s(60, 65), s(65.4, 70)]
    windows = speech_windows(audio, regions)
    assert _spans(windows) == [(15, 40), (40.5, 46), (60, 70)]  # each <= 30 s, cut between turns
    assert all(np.array_equal(w.samples, audio[w.start_sample : w.start_sample + w.samples.shape[0]]) for w in windows)


def test_a_long_pause_ends_a_window_even_when_more_would_fit():
    regions = [(0, 5 * SR), (int(6.5 * SR), 10 * SR), (12 * SR, 15 * SR)]
    assert _spans(speech_windows(noise(20), regions)) == [(0, 5), (6.5, 10), (12, 15)]
    assert _spans(speech_windows(noise(20), regions, max_gap_seconds=3.0)) == [(0, 15)]


def test_speech_with_no_pause_is_cut_inside_at_a_quiet_point():
    audio = noise(80)
    audio[50 * SR - 1600 : 50 * SR] = 0.0  # the quiet 100 ms before the 30 s limit of a window opening at 20 s
    windows = speech_windows(audio, [(20 * SR, 75 * SR)])
    assert len(windows) == 2 and windows[0].start_sample == 20 * SR
    assert windows[1].start_sample == 50 * SR - 800
    assert windows[1].start_sample + windows[1].samples.shape[0] == 75 * SR
    assert speech_windows(audio, []) == []
    breath = noise(80)
    breath[46 * SR - 1600 : 46 * SR] = 0.0  # 4 s before the limit: a breath between sentences is found
    assert speech_windows(breath, [(20 * SR, 75 * SR)])[1].start_sample == 46 * SR - 800


def test_padding_widens_regions_and_splits_a_short_silence_between_them():
    # Padded by 4 samples: the first at the audio's start, the gap of 6 between the second and
    # third (under twice the padding) shared half and half, the last at the audio's end.
    assert pad_regions([(2, 10), (20, 30), (36, 40)], 4, 42) == [(0, 14), (16, 33), (33, 42)]
    assert pad_regions([], 4, 42) == []


def test_a_word_that_opens_speech_never_starts_after_the_speech_does():
    words = [Word("Fine.", 1.50, 1.90, 0.9), Word("What", 2.00, 2.20, 0.9), Word("Good.", 4.30, 4.60, 0.9)]
    speech = [(1.00, 2.40), (4.00, 5.00)]
    snapped = snap_to_speech_onsets(words, speech)
    assert [w.start for w in snapped] == [1.00, 2.00, 4.00]  # late openers move back; "What" stays
    assert [w.end for w in snapped] == [w.end for w in words]
    early = [Word("I", 3.50, 4.20, 0.9)]  # starts in the pause before the speech: left (the VAD hears onsets late)
    assert snap_to_speech_onsets(early, speech) == early
    far = [Word("So", 6.30, 6.50, 0.9)]  # more than a second after the onset: not the word that opened it
    assert snap_to_speech_onsets(far, [(5.00, 7.00)]) == far
