"""The two-stage detection baseline, vLLM's way: a one-token decode to find the language, then
the transcription with it. Never the default (``--detection-mode two-stage``); kept so bench/
can measure what fused detection saves, on the same engine and the same audio."""

from __future__ import annotations

from dataclasses import replace

from adapters.base import TranscriptionAdapter

from .chunking import AudioChunk
from .engine.interface import Engine
from .engine.params import DecodeParams


async def detect_language(engine: Engine, adapter: TranscriptionAdapter, chunk: AudioChunk,
                          fused: DecodeParams, candidates: tuple[str, ...] | None) -> str | None:
    """The most probable language of ``chunk`` from a decode of ``fused``'s first token."""
    # A copy of the audio: the baseline is two requests, each encoding the audio (the engine
    # would otherwise reuse this pass's encoder output for the transcription).
    result = await engine.submit(chunk.samples.copy(), replace(fused, max_new_tokens=1)).collect()
    probs = adapter.language_probabilities(result.probe_probs, candidates)
    return max(probs, key=probs.get) if probs else None
