"""The request pipeline: audio -> chunks -> adapter prompts -> engine -> adapter parsing -> result.

Chunks of one request are submitted together, so they decode concurrently in the engine's
batch; results are put back in order with their true time offsets.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from adapters.base import TranscriptionAdapter

from .chunking import AudioChunk, split_audio
from .engine.batch_engine import BatchEngine
from .engine.params import DecodeParams, SequenceResult


@dataclass(frozen=True)
class TranscriptionOptions:
    task: str = "transcribe"
    language: str | None = None  # None: fused detection in the same decode
    timestamps: bool = False
    previous_text: str | None = None
    candidate_languages: tuple[str, ...] | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    # "fused" (one decode per chunk) or "two-stage" (a detection decode, then the
    # transcription: a baseline for bench/, never the default).
    detection: str = "fused"


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    language: str | None


@dataclass
class TranscriptionResult:
    task: str
    text: str
    language: str | None
    language_probability: float | None
    duration: float
    segments: list[Segment] = field(default_factory=list)
    # Why language detection failed on some chunk (None when it did not).
    detection_failure: str | None = None


@dataclass
class _ChunkOutcome:
    chunk: AudioChunk
    params: DecodeParams
    result: SequenceResult
    language_probs: dict[str, float]


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


class Transcriber:
    def __init__(self, engine: BatchEngine, adapter: TranscriptionAdapter):
        self.engine = engine
        self.adapter = adapter

    def chunks(self, audio: np.ndarray) -> list[AudioChunk]:
        cfg = self.adapter.config
        if not cfg.chunking:
            return [AudioChunk(0, audio[: int(cfg.max_clip_seconds * cfg.sample_rate)], cfg.sample_rate)]
        return split_audio(audio, cfg.sample_rate, cfg.max_clip_seconds)

    def params_for(self, options: TranscriptionOptions, language: str | None = None) -> DecodeParams:
        language = language or options.language
        if language is not None:
            params = self.adapter.build_prompt(language, options.task, options.timestamps, options.previous_text)
        else:
            params = self.adapter.build_fused_autodetect_params(
                options.task, options.timestamps, options.candidate_languages, options.previous_text
            )
        changes = {"temperature": options.temperature, "seed": options.seed, "top_k": options.top_k, "top_p": options.top_p}
        if options.max_new_tokens is not None:
            changes["max_new_tokens"] = min(params.max_new_tokens, options.max_new_tokens)
        return replace(params, **changes)

    async def _detect_two_stage(self, chunk: AudioChunk, options: TranscriptionOptions) -> str | None:
        params = replace(self.params_for(options, None), max_new_tokens=1)
        result = await self.engine.submit(chunk.samples, params).collect()
        probs = self.adapter.language_probabilities(result.probe_probs, options.candidate_languages)
        return max(probs, key=probs.get) if probs else None

    async def _decode_chunk(self, chunk: AudioChunk, options: TranscriptionOptions) -> _ChunkOutcome:
        language = None
        if options.language is None and options.detection == "two-stage":
            language = await self._detect_two_stage(chunk, options)
        params = self.params_for(options, language)
        stream = self.engine.submit(chunk.samples, params)
        try:
            result = await stream.collect()
        finally:
            stream.cancel()  # no-op when finished; frees the slot if the caller was cancelled
        return self.outcome(chunk, params, result, options)

    def outcome(self, chunk: AudioChunk, params: DecodeParams, result: SequenceResult,
                options: TranscriptionOptions) -> "_ChunkOutcome":
        probs = self.adapter.language_probabilities(result.probe_probs, options.candidate_languages)
        return _ChunkOutcome(chunk, params, result, probs)

    async def transcribe(
        self, audio: np.ndarray, options: TranscriptionOptions = TranscriptionOptions(),
        on_chunk_done: Callable[[AudioChunk], None] | None = None,
    ) -> TranscriptionResult:
        chunks = self.chunks(audio)

        async def run(chunk: AudioChunk) -> _ChunkOutcome:
            outcome = await self._decode_chunk(chunk, options)
            if on_chunk_done:
                on_chunk_done(chunk)
            return outcome

        outcomes = await asyncio.gather(*(run(c) for c in chunks))
        return self.assemble(outcomes, options, audio.shape[0] / self.adapter.config.sample_rate)

    def assemble(self, outcomes: list[_ChunkOutcome], options: TranscriptionOptions, duration: float) -> TranscriptionResult:
        adapter = self.adapter
        segments: list[Segment] = []
        chunk_texts: list[tuple[str | None, str]] = []
        failures: list[str] = []
        votes: dict[str, float] = {}
        for outcome in outcomes:
            chunk, result = outcome.chunk, outcome.result
            if result.finish_reason in ("error", "cancelled"):
                raise RuntimeError(f"decode {result.finish_reason}: {result.error or 'no result'}")
            parsed = adapter.parse_output(result.token_ids, outcome.params)
            if parsed.failure is not None:
                failures.append(f"chunk at {chunk.start:.2f}s: {parsed.failure}")
                continue
            for code, p in outcome.language_probs.items():
                votes[code] = votes.get(code, 0.0) + p * chunk.duration
            text_logprobs = result.logprobs[parsed.prefix_length :]
            avg_logprob = sum(text_logprobs) / max(1, len(text_logprobs))
            no_speech = adapter.no_speech_probability(result.probe_probs)
            for s in parsed.segments:
                start = chunk.start + (s.start or 0.0)
                end = chunk.start + s.end if s.end is not None else chunk.end
                segments.append(Segment(
                    id=len(segments), seek=chunk.start_sample // 160, start=round(start, 3),
                    end=round(max(end, start), 3), text=s.text, tokens=s.token_ids,
                    temperature=options.temperature, avg_logprob=avg_logprob,
                    compression_ratio=compression_ratio(s.text), no_speech_prob=no_speech,
                    language=parsed.language,
                ))
            chunk_texts.append((parsed.language, parsed.text or ""))

        if options.language is not None:
            language = options.language
        elif votes:
            language = max(votes, key=votes.get)
        else:
            language = None
        total = sum(votes.values())
        probability = round(votes[language] / total, 4) if language in votes and total > 0 else None
        joiner = adapter.joiner(language)
        text = joiner.join(t for _, t in chunk_texts if t).strip()
        return TranscriptionResult(
            task=options.task, text=text, language=language, language_probability=probability,
            duration=round(duration, 3), segments=segments,
            detection_failure="; ".join(failures) if failures else None,
        )
