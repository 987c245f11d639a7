"""The speech gate's region scan: parallel streams, Silero's own region rules."""

import numpy as np
import pytest
import torch

from asr_service.speech_gate import FRAME, STREAM_FRAMES, WARM_UP_FRAMES, SpeechGate, SpeechScan, _stream_inputs
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


def test_a_file_scanned_a_few_streams_at_a_time_gives_the_regions_of_one_scan():
    """Long files are scanned a block of streams at a time so that the scan's memory does not
    grow with the file: blocks of one, two or three streams find the regions one scan of every
    stream finds, with every frame's probability within float rounding (the batch differs)."""
    rng = np.random.default_rng(1)
    parts = []
    for i, (lang, name) in enumerate(all_clips()[:8]):
        parts += [np.zeros(int([0.6, 2.0, 1.0][i % 3] * SR), np.float32), load_clip(lang, name)]
    audio = np.concatenate(parts) + (0.003 * rng.standard_normal(sum(p.shape[0] for p in parts))).astype(np.float32)
    assert audio.shape[0] > 5 * STREAM_FRAMES * FRAME  # several blocks, the last one partial

    whole = SpeechGate(streams_per_scan=1000)
    want = scanned(whole, audio).probabilities
    for streams in (1, 2, 3):
        gate = SpeechGate(streams_per_scan=streams)
        got = scanned(gate, audio).probabilities
        assert len(got) == len(want) == -(-audio.shape[0] // FRAME)
        assert np.abs(np.array(got) - np.array(want)).max() < 1e-4
        assert gate.speech_regions(audio, 0.5) == whole.speech_regions(audio, 0.5)


def scanned(gate: SpeechGate, audio: np.ndarray) -> SpeechScan:
    scan = SpeechScan(gate, audio, 0.5)
    while scan.scan_block():
        pass
    return scan


def test_regions_found_block_by_block_are_final_as_soon_as_they_are_handed_out():
    """A long file's windows are planned while it is still scanned, so the regions known after
    each block must be the first regions of the whole file's, none of them to change: a region
    still open at the end of what was scanned is held back until the speech after it is heard."""
    parts = []
    for i, (lang, name) in enumerate(all_clips()[:8]):
        parts += [np.zeros(int([0.6, 2.0, 1.0][i % 3] * SR), np.float32), load_clip(lang, name)]
    audio = np.concatenate(parts)
    gate = SpeechGate(streams_per_scan=2)  # blocks of 10 s: some end inside speech
    final = gate.speech_regions(audio, 0.5)
    scan, known, held_back = SpeechScan(gate, audio, 0.5), [], 0
    while scan.scan_block():
        regions = scan.regions()
        assert regions[: len(known)] == known  # what was handed out stays
        assert regions == final[: len(regions)]
        held_back += not scan.done and any(start < len(scan.probabilities) * FRAME <= end for start, end in final)
        known = regions
    assert known == final and scan.done
    assert held_back  # the blocks did end inside speech


def test_the_streams_of_a_scan_read_one_copy_of_its_audio():
    """Each stream's input (its warm-up and its frames) is a view into one copy of the block's
    stretch of audio, silent before the audio's start and past its end."""
    audio = torch.arange(10 * STREAM_FRAMES * FRAME + 100, dtype=torch.float32)
    frames = -(-audio.shape[0] // FRAME)
    heard = _stream_inputs(audio, 4 * STREAM_FRAMES, frames)
    steps = WARM_UP_FRAMES + STREAM_FRAMES
    assert heard.shape == (7, steps, FRAME)
    assert heard.untyped_storage().nbytes() == (WARM_UP_FRAMES + 7 * STREAM_FRAMES) * FRAME * 4
    for b in range(7):
        start = (4 * STREAM_FRAMES + b * STREAM_FRAMES - WARM_UP_FRAMES) * FRAME
        inside = audio[start : start + steps * FRAME]
        assert torch.equal(heard[b].flatten()[: inside.shape[0]], inside)
        assert not heard[b].flatten()[inside.shape[0] :].any()  # past the end: silence
    first = _stream_inputs(audio, 0, STREAM_FRAMES)[0].flatten()
    assert not first[: WARM_UP_FRAMES * FRAME].any()  # before the start: silence
    assert torch.equal(first[WARM_UP_FRAMES * FRAME :], audio[: STREAM_FRAMES * FRAME])


def test_regions_of_audio_shorter_than_a_frame_and_of_silence():
    gate = SpeechGate()
    assert gate.speech_regions(np.zeros(100, np.float32), 0.5) == []
    assert gate.speech_regions(np.zeros(20 * SR, np.float32), 0.5) == []
