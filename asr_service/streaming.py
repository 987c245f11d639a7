"""Streaming transcription: text deltas as tokens arrive, held back until the forced prefix parses.

All chunks are submitted at once (they decode together in the engine's batch) and streamed
in order. Nothing reaches the caller before the adapter has parsed the prefix; deltas never
carry special tokens (the adapter decodes text tokens only); their concatenation is the final
text. A stream that ends before the prefix parses yields one StreamFailed, never an empty
success. A window whose no-speech probability is high holds its text until the decode ends
and sends it only if the decode was confident (silence gives no invented text). Streaming does
not retry hotter (temperature fallback): deltas are never taken back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np

from .engine.params import raise_if_failed
from .fallback import is_silent, may_be_silent
from .transcription import Transcriber, TranscriptionOptions, TranscriptionResult

DETECTION_FAILED = "language auto-detect failed: forced-prefix sentinel was not produced before stream end"


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StreamFailed:
    message: str
    code: str = "language_detection_failed"


@dataclass(frozen=True)
class StreamDone:
    text: str  # exactly the concatenation of the deltas
    result: TranscriptionResult
    prompt_tokens: int
    output_tokens: int


StreamItem = TextDelta | StreamFailed | StreamDone


def _visible(decoded: str) -> str:
    # A trailing U+FFFD is a multi-byte character cut between tokens: wait for the rest.
    # Leading and trailing whitespace is held back (the final text of a chunk is stripped).
    return decoded.rstrip("\ufffd").strip()


def _next_delta(decoded: str, sent: str, emitted: str, joiner: str) -> tuple[str, str]:
    """(delta to send, visible text of the chunk sent after it): only text that extends what
    was sent goes out; a chunk's first delta carries the joiner after earlier chunks."""
    visible = _visible(decoded)
    if not visible.startswith(sent) or len(visible) <= len(sent):
        return "", sent
    separator = joiner if not sent and emitted else ""
    return separator + visible[len(sent):], visible


async def stream_transcription(
    transcriber: Transcriber, audio: np.ndarray, options: TranscriptionOptions
) -> AsyncIterator[StreamItem]:
    adapter = transcriber.adapter
    params = transcriber.params_for(options)  # the same prompt and grammar for every chunk
    chunks = transcriber.chunks(audio)
    speech = await asyncio.gather(*(transcriber.hears_speech(c, options) for c in chunks))
    submitted = [(chunk, params, transcriber.engine.submit(chunk.samples, params) if heard else None)
                 for chunk, heard in zip(chunks, speech)]
    emitted = ""
    outcomes = []
    thresholds = options.thresholds
    try:
        for chunk, params, stream in submitted:
            if stream is None:  # no speech in this window: nothing decoded, nothing sent
                outcomes.append(transcriber.no_speech_outcome(chunk))
                continue
            need = adapter.forced_prefix_tokens(params)
            tokens: list[int] = []
            body_start: int | None = 0 if need == 0 else None
            language = options.language
            sent = ""  # visible text of this chunk already sent
            hold = False  # a window that may hold no speech: its text waits for the verdict
            async for event in stream:
                tokens.append(event.token_id)
                if len(tokens) == 1:  # the probe (no-speech probability) is in by the first token
                    hold = may_be_silent(adapter.no_speech_probability(stream.result.probe_probs), thresholds)
                if body_start is None:
                    if len(tokens) < need:
                        continue
                    head = adapter.parse_output(tokens, params)
                    if head.failure is not None:
                        yield StreamFailed(f"{DETECTION_FAILED} ({head.failure})")
                        return
                    body_start, language = head.prefix_length, head.language
                if not hold:
                    delta, sent = _next_delta(adapter.decode_text(tokens[body_start:]), sent, emitted, adapter.joiner(language))
                    if delta:
                        emitted += delta
                        yield TextDelta(delta)
            result = stream.result
            if result.finish_reason == "unavailable":
                yield StreamFailed(f"The decoding backend failed: {result.error}", code="backend_unavailable")
                return
            raise_if_failed(result)
            if body_start is None:
                yield StreamFailed(DETECTION_FAILED)
                return
            outcome = transcriber.outcome(chunk, params, result, options)
            outcomes.append(outcome)
            if hold and not is_silent(outcome.figures, thresholds):
                delta, sent = _next_delta(adapter.decode_text(tokens[body_start:]), sent, emitted, adapter.joiner(language))
                if delta:
                    emitted += delta
                    yield TextDelta(delta)
        final = transcriber.assemble(outcomes, options, audio.shape[0] / adapter.config.sample_rate)
        yield StreamDone(
            text=emitted,
            result=final,
            prompt_tokens=sum(len(p.prompt_ids) for _, p, s in submitted if s is not None),
            output_tokens=sum(len(s.result.token_ids) for _, _, s in submitted if s is not None),
        )
    finally:
        for _, _, stream in submitted:
            if stream is not None:
                stream.cancel()  # a caller that went away frees every slot of its request
