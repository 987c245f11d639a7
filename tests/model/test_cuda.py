"""The embedded engine on CUDA (float16). Skipped, saying why, where torch sees no GPU (CI);
the CPU-only checks of the device choice run everywhere."""

from __future__ import annotations

import asyncio

import jiwer
import pytest
import torch

from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions
from support.clips import load_clip, reference
from support.textnorm import normalize

pytestmark = pytest.mark.model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (torch.cuda.is_available() is False); "
                                       "the CUDA engine is exercised only on a machine with a GPU")


def test_device_choices_are_checked_before_loading():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            build_runtime(RuntimeSettings(device="cuda"))
    with pytest.raises(ValueError, match="unknown device"):
        build_runtime(RuntimeSettings(device="tpu"))
    with pytest.raises(ValueError, match="needs at least one --sglang-url"):
        build_runtime(RuntimeSettings(engine="sglang"))


@pytest.fixture(scope="module")
def cuda_runtime():
    rt = build_runtime(RuntimeSettings(device="cuda"))
    yield rt
    rt.close()


@needs_cuda
async def test_cuda_engine_transcribes_like_the_cpu_engine(cuda_runtime, runtime):
    engine = cuda_runtime.engine
    assert engine.device.type == "cuda" and engine.dtype == torch.float16
    for lang, name in (("en", "quick_brown_fox"), ("fr", "bonjour_monde"), ("es", "pangrama")):
        audio = load_clip(lang, name)
        gpu = await cuda_runtime.transcriber.transcribe(audio, TranscriptionOptions())
        cpu = await runtime.transcriber.transcribe(audio, TranscriptionOptions())
        assert gpu.language == cpu.language == lang
        assert jiwer.wer(reference(lang, name).lower(), gpu.text.lower()) <= jiwer.wer(
            reference(lang, name).lower(), cpu.text.lower()) + 0.15, (gpu.text, cpu.text)


@needs_cuda
async def test_cuda_batches_timestamps_words_beams_and_sampling(cuda_runtime):
    audio = load_clip("en", "quick_brown_fox")
    tr = cuda_runtime.transcriber
    variants = [TranscriptionOptions(timestamps=True, word_timestamps=True), TranscriptionOptions(beam_size=4),
                TranscriptionOptions(temperature=0.7, seed=3)] + [TranscriptionOptions()] * 12
    results = await asyncio.gather(*(tr.transcribe(audio, o) for o in variants))
    assert all("fox" in r.text.lower() for r in results)
    assert results[0].words and results[0].words[-1].end > results[0].words[0].start
    assert max(cuda_runtime.engine.batch_sizes) > 1  # the sequences were decoded together


async def test_half_precision_engine_on_the_cpu_gives_the_same_transcripts(runtime):
    """The dtype half of the CUDA path, where CI can run it: weights, caches and encoder output
    in float16 (logits taken to float32), the same engine code otherwise."""
    from adapters import WhisperAdapter
    from asr_service.engine.batch_engine import BatchEngine
    from asr_service.model_loading import load_model
    from asr_service.transcription import Transcriber

    loaded = load_model()
    loaded.model.to(dtype=torch.float16)
    engine = BatchEngine(loaded.model, threads=2)
    try:
        half = Transcriber(engine, WhisperAdapter.from_loaded(loaded), None)
        assert engine.dtype == torch.float16
        for lang, name in (("en", "hello_world"), ("fr", "bonjour_monde")):
            audio = load_clip(lang, name)
            options = TranscriptionOptions(timestamps=True, vad_filter=False)
            got = await half.transcribe(audio, options)
            expected = await runtime.transcriber.transcribe(audio, options)
            # The words, not their punctuation: float16 and the default precision round
            # differently, and a comma is where Whisper base is least sure ("Bonjour, le monde."
            # in one, "Bonjour le monde." in the other on some CPUs).
            assert got.language == expected.language == lang
            assert normalize(got.text) == normalize(expected.text) and len(got.segments) == len(expected.segments)
    finally:
        engine.shutdown()
