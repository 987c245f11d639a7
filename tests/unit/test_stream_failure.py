"""A stream whose forced prefix does not parse (where the full response would be the same
error) ends in one error event, never in made-up text or an empty success: the pipeline's
events through the real renderer and SSE code, read by the real OpenAI SDK.

With the embedded engine the grammar makes such a decode all but impossible (the token budget
no longer counts the prefix), so the events are built here; a remote engine that broke the
constraint would send them (SGLang servers are checked by a canary first)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from asr_service.formats import to_verbose_json
from asr_service.server.sse import chunk_events, openai_events
from asr_service.streaming import render_stream
from asr_service.transcription_types import ChunkDone, Finished, TranscriptionResult

pytestmark = pytest.mark.unit


async def failing_pipeline():
    yield ChunkDone(0, "", prompt_tokens=4, completion_tokens=3)
    yield Finished(TranscriptionResult(task="transcribe", text="", language=None, language_probability=None,
                                       duration=1.0, detection_failure="chunk at 0.00s: the forced prefix did not parse"))


def sse_bytes(events) -> bytes:
    async def collect():
        return [e async for e in events]
    return b"".join(f"data: {e['data']}\n\n".encode() for e in asyncio.run(collect()))


def test_a_prefix_that_does_not_parse_ends_the_stream_with_an_error_event():
    items = asyncio.run(_items())
    assert [type(i).__name__ for i in items] == ["StreamFailed"]
    assert items[-1].code == "language_detection_failed" and "did not parse" in items[-1].message
    for events in (openai_events(render_stream(failing_pipeline())),
                   chunk_events(render_stream(failing_pipeline()), "whisper-1", include_usage=True)):
        payloads = sse_bytes(events).decode().split("\n\n")[:-1]
        assert payloads[-1] == "data: [DONE]"
        error = json.loads(payloads[-2][len("data: "):])["error"]
        assert error["code"] == "language_detection_failed" and error["message"].startswith("language auto-detect failed")


async def _items() -> list:
    return [i async for i in render_stream(failing_pipeline())]


def test_the_openai_sdk_raises_on_that_error_event():
    body = sse_bytes(openai_events(render_stream(failing_pipeline())))
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body,
                                                                   headers={"content-type": "text/event-stream"}))
    client = openai.OpenAI(base_url="http://asr.test/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=transport))
    stream = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"RIFF"), stream=True)
    with pytest.raises(openai.APIError, match="language auto-detect failed"):
        list(stream)



def test_a_verbose_json_stream_reports_the_failure_as_its_full_response_does():
    """verbose_json answers a failed detection with a 200 whose language is null; its stream's
    done event is that body's fields, not an error."""
    async def collect():
        return [e async for e in openai_events(render_stream(failing_pipeline(), failed_detection_is_error=False),
                                               verbose=True)]
    payloads = [e["data"] for e in asyncio.run(collect())]
    assert payloads[-1] == "[DONE]"
    done = json.loads(payloads[-2])
    full = to_verbose_json(asyncio.run(_result()))
    assert done["type"] == "transcript.text.done" and done["text"] == full["text"] == ""
    assert done["language"] is full["language"] is None and done["segments"] == full["segments"]


async def _result() -> TranscriptionResult:
    async for event in failing_pipeline():
        if isinstance(event, Finished):
            return event.result
