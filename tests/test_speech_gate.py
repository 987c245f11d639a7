"""The speech gate's region scan: parallel streams, Silero's own region rules."""

import numpy as np
import pytest
import torch

from asr_service.speech_gate import FRAME, STREAM_FRAMES, SpeechGate
from support.clips import all_clips, load_clip

pytestmark = pytest.mark.model

SR = 16000


def test_parallel_scan_finds_the_regions_a_sequential_scan_finds():
    """Speech from several voices and languages, pauses of 0.3-3 s and a little noise, long enough
    for many streams: the same regions as Silero's own one-stream scan, each boundary within
    three frames (~0.1 s: a stream's first frames differ slightly from a scan that heard
    everything before)."""
    from silero_vad import get_speech_timestamps, load_silero_vad

    rng = np.random.default_rng(0)
    parts = []
    for i, (lang, name) in enumerate(all_clips()[:10]):
        parts += [np.zeros(int([0.3, 0.8, 1.5, 3.0][i % 4] * SR), np.float32), load_clip(lang, name)]
    audio = np.concatenate(parts + [np.zeros(SR, np.float32)])
    audio += (0.003 * rng.standard_normal(audio.shape[0])).astype(np.float32)
    assert audio.shape[0] > 4 * STREAM_FRAMES * FRAME

    parallel = SpeechGate().speech_regions(audio, min_silence_seconds=0.5)
    sequential = [(r["start"], r["end"]) for r in get_speech_timestamps(
        torch.from_numpy(audio), load_silero_vad(), threshold=0.5, sampling_rate=SR, min_speech_duration_ms=256,
        min_silence_duration_ms=500, speech_pad_ms=0)]
    assert len(parallel) == len(sequential) >= 8
    for (start, end), (want_start, want_end) in zip(parallel, sequential):
        assert abs(start - want_start) <= 3 * FRAME and abs(end - want_end) <= 3 * FRAME


def test_regions_of_audio_shorter_than_a_frame_and_of_silence():
    gate = SpeechGate()
    assert gate.speech_regions(np.zeros(100, np.float32), 0.5) == []
    assert gate.speech_regions(np.zeros(20 * SR, np.float32), 0.5) == []
