"""Streaming transcription: the pipeline's events rendered as text deltas.

A renderer only: the pipeline (transcription.Transcriber.run with ``streamed=True``) decodes,
parses the forced prefix and holds back windows that may hold no speech; this turns what it
reports into deltas. Nothing reaches the caller before a chunk's prefix has parsed; deltas never
carry special tokens; their concatenation is the final text. A stream whose prefix does not
parse yields one StreamFailed, never an empty success.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from .transcription import ChunkDone, Finished, PipelineEvent, Segment, TokenTally, TranscriptionResult

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


async def render_stream(events: AsyncIterator[PipelineEvent], tally: TokenTally | None = None) -> AsyncIterator[StreamItem]:
    """StreamItems from a streamed run's ChunkText / ChunkDone / Finished events; each delta
    carries the run's ``tally`` as it stands when the delta goes out (so it never goes back)."""
    tally = TokenTally() if tally is None else tally
    emitted = ""  # every delta sent so far
    sent = ""  # visible text of the current chunk already sent
    try:
        async for event in events:
            if isinstance(event, Finished):
                yield StreamDone(text=emitted, result=event.result)
                continue
            if isinstance(event, ChunkDone) and event.failure is not None:
                yield StreamFailed(f"{DETECTION_FAILED} ({event.failure})")
                return
            delta, sent = _next_delta(event.text, sent, emitted, event.joiner)
            if delta:
                emitted += delta
                yield StreamDelta(delta, tally.prompt_tokens, tally.completion_tokens)
            if isinstance(event, ChunkDone):
                sent = ""  # the next chunk starts
    finally:
        await events.aclose()  # now, not at garbage collection: it cancels the engine work
