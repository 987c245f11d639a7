"""StreamItems -> SSE payloads, in OpenAI's event schema or the vLLM/SGLang chunk schema."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import AsyncIterator

from ..engine.params import DecodeFailed, EngineUnavailable
from ..formats import diarized_segment, logprobs, to_verbose_json
from ..streaming import StreamDelta, StreamDone, StreamFailed, StreamItem, StreamSegment
from .errors import OpenAIError

log = logging.getLogger(__name__)


def _data(payload: dict) -> dict:
    return {"data": json.dumps(payload, ensure_ascii=False)}


def _failure(item: StreamFailed) -> dict:
    return _data(OpenAIError(500, item.message, code=item.code, type="server_error").body())


async def _guarded(items: AsyncIterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """Turn a failure inside the pipeline into one StreamFailed (a backend that failed: its own
    code), so the client still gets an error event and [DONE] instead of a cut connection."""
    try:
        async for item in items:
            yield item
    except EngineUnavailable as e:
        yield StreamFailed(f"The decoding backend failed: {e}", code="backend_unavailable")
    except DecodeFailed as e:
        log.warning("stream's decode failed: %s", e)
        yield StreamFailed(f"The decode failed: {e}", code="decode_failed")
    except Exception as e:  # noqa: BLE001 - reported to the client, logged by the caller's logger
        log.exception("stream failed")
        yield StreamFailed(f"transcription failed: {type(e).__name__}: {e}", code="internal_error")


# verbose_json's fields that a done event carries beside its own (text, logprobs, usage).
VERBOSE_FIELDS = ("task", "language", "source_language", "language_probability", "duration", "segments", "words")


def _verbose_fields(item: StreamDone, with_segments: bool) -> dict:
    body = to_verbose_json(item.result, with_segments)
    return {k: body[k] for k in VERBOSE_FIELDS if k in body}


async def openai_events(items: AsyncIterator[StreamItem], verbose: bool = False,
                        with_segments: bool = True) -> AsyncIterator[dict]:
    """``transcript.text.delta`` events (a diarized stream: then its ``transcript.text.segment``
    events), then ``transcript.text.done``, then ``[DONE]``. A ``verbose`` (verbose_json)
    stream's done event also carries verbose_json's segments (unless not ``with_segments``),
    words, language and duration."""
    async for item in _guarded(items):
        if isinstance(item, StreamDelta):
            yield _data({"type": "transcript.text.delta", "delta": item.text})
        elif isinstance(item, StreamSegment):  # the SDK's TranscriptionTextSegmentEvent
            yield _data(diarized_segment(item.segment))
        elif isinstance(item, StreamFailed):
            yield _failure(item)
            break
        elif isinstance(item, StreamDone):
            yield _data({
                "type": "transcript.text.done",
                "text": item.text,
                **logprobs(item.result),
                "usage": {"type": "tokens", "input_tokens": item.result.prompt_tokens,
                          "output_tokens": item.result.output_tokens,
                          "total_tokens": item.result.prompt_tokens + item.result.output_tokens},
                **(_verbose_fields(item, with_segments) if verbose else {}),
            })
    yield {"data": "[DONE]"}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def chunk_events(items: AsyncIterator[StreamItem], model: str, include_usage: bool,
                       continuous_usage: bool = False) -> AsyncIterator[dict]:
    """vLLM/SGLang's ``transcription.chunk`` objects with ``choices[0].delta.content``; with
    ``continuous_usage`` (vLLM's stream_continuous_usage_stats) every chunk carries the usage so far."""
    base = {"id": f"trsc-{uuid.uuid4().hex}", "object": "transcription.chunk", "created": int(time.time()), "model": model}
    async for item in _guarded(items):
        if isinstance(item, StreamDelta):
            chunk = {**base, "choices": [{"delta": {"content": item.text}, "finish_reason": None, "stop_reason": None}]}
            if continuous_usage:
                chunk["usage"] = _usage(item.prompt_tokens, item.completion_tokens)
            yield _data(chunk)
        elif isinstance(item, StreamFailed):
            yield _failure(item)
            break
        elif isinstance(item, StreamDone):
            usage = _usage(item.result.prompt_tokens, item.result.output_tokens)
            finish = {**base, "choices": [{"delta": {}, "finish_reason": item.result.finish_reason, "stop_reason": None}]}
            yield _data({**finish, "usage": usage} if continuous_usage else finish)
            if include_usage:
                yield _data({**base, "choices": [], "usage": usage})
    yield {"data": "[DONE]"}
