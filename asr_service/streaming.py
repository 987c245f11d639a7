"""Streaming transcription: the pipeline's finished windows released as text deltas.

A renderer only: the pipeline (transcription.Transcriber.run) decodes exactly as for a full
response and reports each window once it is final, in order; this releases each window's text
as deltas of a word each. So the deltas only ever append, their concatenation is the result's text, and the
done item carries the same result a request without ``stream`` gets. A request that the full
response would refuse as a failed language detection (no text at all, a forced prefix that did
not parse) ends in one StreamFailed, never an empty success; where the full response reports
the failure in its body instead (verbose_json: language null), so does the done item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import AsyncIterator

from .transcription_types import Finished, PipelineEvent, Segment, TranscriptionResult

DETECTION_FAILED = "language auto-detect failed: forced-prefix sentinel was not produced before stream end"


@dataclass(frozen=True)
class StreamDelta:
    text: str
    # The request's tokens when the delta went out (vLLM's continuous usage stats).
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class StreamFailed:
    message: str
    code: str = "language_detection_failed"


@dataclass(frozen=True)
class StreamDone:
    text: str  # exactly the concatenation of the deltas
    result: TranscriptionResult


@dataclass(frozen=True)
class StreamSegment:
    """A speaker-labelled segment of a diarized stream (diarization/pipeline.py), sent before
    the done item."""

    segment: Segment


StreamItem = StreamDelta | StreamFailed | StreamSegment | StreamDone


def _word_pieces(text: str) -> list[str]:
    """``text`` cut before each word (a word keeps the space before it); the pieces join to it."""
    pieces = re.findall(r"\s*\S+", text)
    rest = text[len("".join(pieces)):]
    return pieces + [rest] if rest else pieces


async def render_stream(events: AsyncIterator[PipelineEvent],
                        failed_detection_is_error: bool = True) -> AsyncIterator[StreamItem]:
    """StreamItems from a run's ChunkDone / Finished events; each delta carries the tokens of
    the windows released so far (vLLM's continuous usage stats: they never go back).
    ``failed_detection_is_error``: whether the full response answers a failed detection with
    no text as an error (formats.REPORTS_FAILED_DETECTION)."""
    emitted = ""  # every delta sent so far
    prompt_tokens = completion_tokens = 0
    try:
        async for event in events:
            if isinstance(event, Finished):
                result = event.result
                if failed_detection_is_error and result.detection_failure and not result.text:
                    yield StreamFailed(f"{DETECTION_FAILED} ({result.detection_failure})")
                    return
                yield StreamDone(text=emitted, result=result)
                continue
            prompt_tokens += event.prompt_tokens
            completion_tokens += event.completion_tokens
            for piece in _word_pieces(event.text):  # a word at a time: a page fills smoothly
                emitted += piece
                yield StreamDelta(piece, prompt_tokens, completion_tokens)
    finally:
        await events.aclose()  # now, not at garbage collection: it cancels the engine work
