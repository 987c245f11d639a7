"""Streaming transcription: text deltas as tokens arrive, held back until the forced prefix parses.

All chunks are submitted at once (they decode together in the engine's batch) and streamed
in order. Nothing reaches the caller before the adapter has parsed the prefix; deltas never
carry special tokens (the adapter decodes text tokens only); their concatenation is the final
text. A stream that ends before the prefix parses yields one StreamFailed, never an empty
success.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np

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


async def stream_transcription(
    transcriber: Transcriber, audio: np.ndarray, options: TranscriptionOptions
) -> AsyncIterator[StreamItem]:
    adapter = transcriber.adapter
    params = transcriber.params_for(options)  # the same prompt and grammar for every chunk
    submitted = [(chunk, params, transcriber.engine.submit(chunk.samples, params))
                 for chunk in transcriber.chunks(audio)]
    emitted = ""
    outcomes = []
    try:
        for chunk, params, stream in submitted:
            need = adapter.forced_prefix_tokens(params)
            tokens: list[int] = []
            body_start: int | None = 0 if need == 0 else None
            language = options.language
            sent = ""  # visible text of this chunk already sent
            separator = ""
            async for event in stream:
                tokens.append(event.token_id)
                if body_start is None:
                    if len(tokens) < need:
                        continue
                    head = adapter.parse_output(tokens, params)
                    if head.failure is not None:
                        yield StreamFailed(f"{DETECTION_FAILED} ({head.failure})")
                        return
                    body_start, language = head.prefix_length, head.language
                visible = _visible(adapter.decode_text(tokens[body_start:]))
                if visible.startswith(sent) and len(visible) > len(sent):
                    if not sent and emitted:
                        separator = adapter.joiner(language)
                    delta = separator + visible[len(sent):]
                    separator, sent = "", visible
                    emitted += delta
                    yield TextDelta(delta)
            result = stream.result
            if result.finish_reason in ("error", "cancelled"):
                raise RuntimeError(f"decode {result.finish_reason}: {result.error or 'no result'}")
            if body_start is None:
                yield StreamFailed(DETECTION_FAILED)
                return
            outcomes.append(transcriber.outcome(chunk, params, result, options))
        final = transcriber.assemble(outcomes, options, audio.shape[0] / adapter.config.sample_rate)
        yield StreamDone(
            text=emitted,
            result=final,
            prompt_tokens=sum(len(p.prompt_ids) for _, p, _ in submitted),
            output_tokens=sum(len(s.result.token_ids) for _, _, s in submitted),
        )
    finally:
        for _, _, stream in submitted:
            stream.cancel()  # a caller that went away frees every slot of its request
