"""The two-stage detection baseline, vLLM's way: a one-token decode to find the language, then
the transcription with it. Never the default (``--detection-mode two-stage``); kept so bench/
can measure what fused detection saves, on the same engine and the same audio. The one-token
decode itself also names the language of a file with no speech (Transcriber)."""

from __future__ import annotations

from dataclasses import replace

from adapters.base import TranscriptionAdapter
from adapters.decode_request import DecodeParams

from .chunking import AudioChunk
from .engine.interface import Engine


async def detect_language(engine: Engine, adapter: TranscriptionAdapter, chunk: AudioChunk,
                          fused: DecodeParams, candidates: tuple[str, ...] | None) -> str | None:
    """The most probable language of ``chunk`` from a decode of ``fused``'s first token."""
    # A copy of the audio: the baseline is two requests, each encoding the audio (the engine
    # would otherwise reuse this pass's encoder output for the transcription).
    language, _ = await most_probable_language(engine, adapter, chunk.samples.copy(), fused, candidates)
    return language


async def most_probable_language(engine: Engine, adapter: TranscriptionAdapter, samples, fused: DecodeParams,
                                 candidates: tuple[str, ...] | None) -> tuple[str | None, float | None]:
    """The most probable language of ``samples`` and its probability, from the model's language
    probabilities at <|startoftranscript|> (a decode of ``fused``'s first token); (None, None)
    when the engine reports none."""
    stream = engine.submit(samples, replace(fused, max_new_tokens=1))
    try:
        result = await stream.collect()
    finally:
        stream.cancel()  # no-op when finished; frees the slot if the caller was cancelled
    probs = adapter.language_probabilities(result.probe_probs, candidates)
    if not probs:
        return None, None
    language = max(probs, key=probs.get)
    return language, probs[language]
