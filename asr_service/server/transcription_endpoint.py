"""POST /v1/audio/transcriptions and /translations: read, admit, transcribe, respond.

The body is counted while it is read, so an upload past the limit is refused before it is all
in memory (a declared Content-Length past it is refused before reading anything). Work is
admitted against the backpressure bounds (429 with Retry-After beyond them) from the first byte
of its upload, its audio counted as it decodes (so a small file that decodes into hours is
refused as its audio grows, not after); the request's deadline covers the upload, its decoding
and the transcription, and an upload that pauses longer than the body timeout gets 408. A
client that leaves cancels its decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncGenerator, AsyncIterator

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.datastructures import FormData

from ..audio import AudioError, AudioTooLargeError, InvalidAudioError, decode_audio
from ..diarization.diarizer import Diarizer
from ..diarization.pipeline import diarizer_for, reference_clips, stream_with_speakers, transcribe_with_speakers
from ..engine.params import DecodeFailed, EngineUnavailable
from ..formats import REPORTS_FAILED_DETECTION, render, to_diarized_json, to_json, to_verbose_json
from ..request_options import OptionError
from ..streaming import StreamDone, StreamFailed, StreamItem, render_stream
from ..transcription_types import TranscriptionResult
from .admission import Overloaded, Ticket
from .errors import OpenAIError
from .gate import GRACE_OVER_MESSAGE, Door
from .model_pool import Lease
from .request_form import TranscriptionRequest, model_named, parse_transcription_form
from .sse import chunk_events, openai_events
from .state import ServerState

log = logging.getLogger(__name__)

FORM_OVERHEAD = 1024 * 1024  # multipart boundaries and the other fields, on top of the file
# Uploads decode on threads of their own: a burst of large or hostile files waits its turn here
# instead of taking every thread of the loop's default pool (realtime turn detection uses that).
UPLOAD_DECODERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="upload-decode")


class UploadTooLarge(Exception):
    pass


class UploadStalled(Exception):
    pass


def _counting(receive, limit: int, pause_limit: float):
    """``receive`` that stops the read once the body passes ``limit`` bytes, or when the next
    part of it takes longer than ``pause_limit`` seconds to arrive."""
    seen = 0

    async def wrapped():
        nonlocal seen
        try:
            async with asyncio.timeout(pause_limit):
                message = await receive()
        except TimeoutError:
            raise UploadStalled from None
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise UploadTooLarge
        return message

    return wrapped


async def _read_form(request: Request, state: ServerState) -> FormData:
    """The request's multipart form, its upload spooled (counted against the upload limit)."""
    limit = state.settings.limits.max_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + FORM_OVERHEAD:
        raise OpenAIError(413, f"Request body of {declared} bytes exceeds the upload limit of {limit} bytes",
                          param="file", code="file_too_large")
    pause_limit = state.settings.connections.body_timeout_s
    limited = Request(request.scope, _counting(request.receive, limit + FORM_OVERHEAD, pause_limit))
    try:
        form = await limited.form(max_files=1, max_fields=64)
    except UploadTooLarge:
        raise OpenAIError(413, f"Upload exceeds the limit of {limit} bytes (stopped reading at that point)",
                          param="file", code="file_too_large") from None
    except UploadStalled:
        raise OpenAIError(408, f"The upload stopped: nothing arrived for {pause_limit:g} s",
                          code="timeout", type="timeout_error") from None
    except Exception as e:  # malformed multipart, wrong content type
        raise OpenAIError(400, f"Could not parse the request as multipart/form-data: {e}",
                          code="invalid_request") from None
    return form


async def _lease_for(form: FormData, state: ServerState, deadline: float) -> Lease:
    """A hold on the model the form names, loaded by now (its load may take what is left of the
    request's deadline)."""
    name = model_named(form)
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            return await state.models.lease(name)
    except TimeoutError:
        raise OpenAIError(503, f"The model '{name}' was still loading when the request's deadline passed; retry "
                               "shortly", param="model", code="model_unavailable",
                          headers={"Retry-After": "10"}) from None


async def _parse_request(form: FormData, lease: Lease, state: ServerState,
                         task: str) -> tuple[TranscriptionRequest, bytes]:
    """The form's fields checked against the leased model, and the upload's bytes."""
    limit = state.settings.limits.max_bytes
    req = parse_transcription_form(form, lease.runtime.adapter, task, state.settings.detection,
                                   state.settings.default_stream_format, lease.runtime.default_beam_size)
    if req.file.size is not None and req.file.size > limit:
        raise OpenAIError(413, f"Upload of {req.file.size} bytes exceeds the limit of {limit} bytes",
                          param="file", code="file_too_large")
    return req, await req.file.read()


async def _decode(data: bytes, state: ServerState, ticket: Ticket, deadline: float):
    """The upload's samples, decoded off the event loop; the ticket grows as they decode."""
    try:
        return await asyncio.get_running_loop().run_in_executor(UPLOAD_DECODERS, decode_audio, data,
                                                                state.settings.limits, ticket.claim, deadline)
    except Overloaded as e:
        raise _busy(state, e) from None
    except TimeoutError:
        raise _timed_out(state.settings.request_timeout_s) from None
    except AudioTooLargeError as e:
        raise OpenAIError(413, str(e), param="file", code=e.code) from None
    except InvalidAudioError as e:
        raise OpenAIError(400, f"Invalid or unsupported audio file. ({e.detail})", param="file", code=e.code) from None
    except AudioError as e:
        raise OpenAIError(400, str(e), param="file", code=e.code) from None


async def _until_disconnected(request: Request, door: Door, work):
    """Run ``work``; if the client goes away first, or the caller is cancelled (the deadline),
    cancel it: its engine slots free at the next step. At the end of a shutdown's grace it is
    cancelled too, and the client gets a 503."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.1)
            if not done and door.grace_over.is_set():
                raise OpenAIError(503, GRACE_OVER_MESSAGE, code="shutting_down")
            if not done and await request.is_disconnected():
                return None
        return task.result()
    finally:  # left early (client gone, deadline, shutdown): the decode must not run on alone
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _until_grace_over(items: AsyncGenerator[StreamItem, None], door: Door) -> AsyncIterator[StreamItem]:
    """``items``, until a shutdown's grace is over: then a StreamFailed that says so (the client
    gets an error event and [DONE], not a cut stream)."""
    grace_over = asyncio.ensure_future(door.grace_over.wait())
    following: asyncio.Future | None = None  # the next item, awaited in a task of its own
    try:
        while True:
            following = asyncio.ensure_future(anext(items))
            await asyncio.wait({following, grace_over}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                yield StreamFailed(GRACE_OVER_MESSAGE, code="shutting_down")
                return
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:  # also when the client left mid-item: stop that item before closing what makes it
        grace_over.cancel()
        if following is not None and not following.done():
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await following
        elif following is not None and not following.cancelled():
            following.exception()  # it ended (an item, or the end) just as the client left: seen
        await items.aclose()


async def _with_deadline(items: AsyncGenerator[StreamItem, None], seconds: float,
                         timeout: float) -> AsyncIterator[StreamItem]:
    """``items`` for ``seconds`` (what is left of the request's ``timeout``)."""
    try:
        async with asyncio.timeout(seconds):
            async for item in items:
                yield item
    except TimeoutError:
        yield StreamFailed(f"Request timed out after {timeout:g} s of decoding", code="timeout")
    finally:
        await items.aclose()  # now, not at garbage collection: it cancels the engine work


def _timed_out(seconds: float) -> OpenAIError:
    return OpenAIError(504, f"Request timed out after {seconds:g} s of decoding; send shorter audio or retry",
                       code="timeout", type="timeout_error")


def _busy(state: ServerState, e: Overloaded) -> OpenAIError:
    state.metrics.rejected.labels("overloaded").inc()
    return OpenAIError(429, str(e), code="server_busy", type="rate_limit_error",
                       headers={"Retry-After": str(e.retry_after)})


async def handle_transcription(request: Request, state: ServerState, task: str) -> Response:
    state.require_ready()
    ticket = _admit(state)
    work = await _accept(request, state, task, ticket)
    if work.req.stream:
        return _stream_response(request, state, work)
    return await _full_response(request, state, work)


@dataclass
class _Work:
    """An accepted request, ready to transcribe: until it ends it holds its admission ticket
    and its lease on the model (``_release`` gives both back)."""

    req: TranscriptionRequest
    lease: Lease
    ticket: Ticket
    deadline: float
    audio: np.ndarray
    seconds: float  # the audio billed: the upload's and any speaker references'
    diarizer: Diarizer | None = None
    clips: dict[str, np.ndarray] = field(default_factory=dict)  # known speakers' reference audio


def _admit(state: ServerState) -> Ticket:
    """Pending from the upload's first byte (a slow upload is work the server holds), and
    refused before the costly part when the server is full."""
    try:
        return state.admission.admit()
    except Overloaded as e:  # answered at once; the connection drops the body as it arrives
        raise _busy(state, e) from None


async def _accept(request: Request, state: ServerState, task: str, ticket: Ticket) -> _Work:
    """Read the upload, lease its model, check the form and decode the audio, all within the
    request's deadline; on any failure the ticket and lease are given back."""
    timeout = state.settings.request_timeout_s
    deadline = time.monotonic() + timeout  # the whole request: upload, decoding, transcription
    lease: Lease | None = None
    try:
        try:
            async with asyncio.timeout(timeout):
                form = await _read_form(request, state)
        except TimeoutError:
            raise OpenAIError(408, f"The upload did not arrive within the request timeout of {timeout:g} s",
                              code="timeout", type="timeout_error") from None
        lease = await _lease_for(form, state, deadline)
        req, data = await _parse_request(form, lease, state, task)
        refusal = lease.runtime.transcriber.refusal(req.options)
        if refusal is not None:
            raise OpenAIError(400, f"Not supported by this server's engine: {refusal}", param=refusal.param,
                              code="unsupported_by_engine")
        audio = await _decode(data, state, ticket, deadline)
        seconds = audio.shape[0] / lease.runtime.adapter.config.sample_rate
        ticket.claim(seconds)
        work = _Work(req, lease, ticket, deadline, audio, seconds)
        if req.diarization is not None:
            await _add_speaker_references(work, state)
        return work
    except Overloaded as e:
        _release(ticket, lease)
        raise _busy(state, e) from None
    except BaseException:
        _release(ticket, lease)
        raise


async def _add_speaker_references(work: _Work, state: ServerState) -> None:
    """The diarizer and the known speakers' reference audio. Reference audio is work too: it
    counts toward admission and the request's limits."""
    runtime = work.lease.runtime
    try:
        work.diarizer = diarizer_for(runtime.transcriber)
        work.clips = await reference_clips(work.req.diarization, state.settings.limits, work.seconds,
                                           work.ticket.claim, work.deadline)
    except OptionError as e:
        raise OpenAIError(400, str(e), param=e.param, code=e.code) from None
    except AudioError as e:
        raise OpenAIError(400, str(e), param="known_speaker_references", code=e.code) from None
    except TimeoutError:
        raise _timed_out(state.settings.request_timeout_s) from None
    work.seconds += sum(clip.shape[0] for clip in work.clips.values()) / runtime.adapter.config.sample_rate


def _stream_response(request: Request, state: ServerState, work: _Work) -> Response:
    """The same decode as the full response, its text sent as each window is final."""
    req, transcriber = work.req, work.lease.runtime.transcriber
    timeout = state.settings.request_timeout_s
    remaining = max(0.0, work.deadline - time.monotonic())

    async def items():
        try:
            rendered = render_stream(transcriber.run(work.audio, req.options),
                                     req.response_format not in REPORTS_FAILED_DETECTION)
            if req.diarization is not None:
                rendered = stream_with_speakers(rendered, transcriber, work.diarizer, work.audio, req.diarization,
                                                work.clips)
            rendered = _until_grace_over(rendered, state.door)
            async for item in _with_deadline(rendered, remaining, timeout):
                if isinstance(item, StreamDone):
                    _count_decode(state, item.result, req)
                elif isinstance(item, StreamFailed) and item.code == "language_detection_failed":
                    state.metrics.detection(None)
                yield item
            state.metrics.audio_seconds.labels(request.url.path).inc(work.seconds)
        finally:
            _release(work.ticket, work.lease)

    events = (chunk_events(items(), work.lease.name, req.stream_include_usage, req.stream_continuous_usage_stats)
              if req.stream_format == "chunk"
              else openai_events(items(), req.response_format == "verbose_json", req.with_segments))
    # The release also runs after the response, for a stream that never started.
    return EventSourceResponse(events, background=BackgroundTask(_release, work.ticket, work.lease))


async def _full_response(request: Request, state: ServerState, work: _Work) -> Response:
    """The whole decode, then the response in its format (499 if the client left first)."""
    req, transcriber = work.req, work.lease.runtime.transcriber
    if req.diarization is None:
        decode = transcriber.transcribe(work.audio, req.options)
    else:
        decode = transcribe_with_speakers(transcriber, work.diarizer, work.audio, req.options, req.diarization,
                                          work.clips)
    try:
        async with asyncio.timeout(max(0.0, work.deadline - time.monotonic())):
            result = await _until_disconnected(request, state.door, decode)
    except TimeoutError:
        raise _timed_out(state.settings.request_timeout_s) from None
    except EngineUnavailable as e:
        raise OpenAIError(503, f"The decoding backend is unavailable: {e}", code="backend_unavailable",
                          headers={"Retry-After": "2"}) from None
    except DecodeFailed as e:
        log.warning("decode failed: %s", e)
        raise OpenAIError(500, f"The decode failed: {e}", code="decode_failed") from None
    finally:
        _release(work.ticket, work.lease)
    if result is None:
        return Response(status_code=499)
    state.metrics.audio_seconds.labels(request.url.path).inc(work.seconds)
    _count_decode(state, result, req)
    return _respond(result, req)


def _count_decode(state: ServerState, result: TranscriptionResult, req: TranscriptionRequest) -> None:
    """A finished decode in the metrics: its redecodes by rule, and its detected language."""
    state.metrics.redecoded(result.redecodes)
    if req.options.language is None:
        state.metrics.detection(result.language)


def _release(ticket: Ticket, lease: Lease | None) -> None:
    ticket.release()
    if lease is not None:
        lease.release()


def _respond(result, req: TranscriptionRequest) -> Response:
    if req.response_format == "verbose_json":
        return JSONResponse(to_verbose_json(result, req.with_segments))  # language is null when detection failed
    if req.response_format == "diarized_json":
        return JSONResponse(to_diarized_json(result))
    if result.detection_failure and not result.text:  # not REPORTS_FAILED_DETECTION
        param = "max_completion_tokens" if req.options.max_new_tokens is not None else None
        raise OpenAIError(400 if param else 500, f"Language auto-detect failed: {result.detection_failure}",
                          param=param, code="language_detection_failed")
    if req.response_format == "json":
        return JSONResponse(to_json(result))
    return PlainTextResponse(render(result, req.response_format))

