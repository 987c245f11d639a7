"""FastAPI app: /v1/audio/transcriptions, /v1/audio/translations, /v1/models, /health, the
/v1/realtime WebSocket, and the browser page at /.

Start-up loads the model and runs warmup in the background; until both are done every
route but /health answers 503 (OpenAI error shape) and /health says 503 too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse

from warmup import WarmupReport, run_warmup

from ..audio import AudioError, AudioLimits, AudioTooLargeError, InvalidAudioError, decode_audio
from ..formats import render, to_json, to_verbose_json
from ..model_loading import DEFAULT_MODEL
from ..realtime.session import RealtimeLimits
from ..runtime import Runtime, build_runtime
from ..streaming import stream_transcription
from .errors import OpenAIError, install_error_handlers
from .realtime_ws import SessionSlots, realtime_endpoint
from .request_form import TranscriptionRequest, parse_transcription_form
from .sse import chunk_events, openai_events

log = logging.getLogger(__name__)


@dataclass
class ServerSettings:
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None
    threads: int | None = None
    max_batch_size: int = 16
    # "two-stage" (a separate detection decode) exists only as a baseline for bench/.
    detection: str = "fused"
    quantize: str | None = None  # see runtime.QUANTIZATIONS
    limits: AudioLimits = field(default_factory=AudioLimits)
    realtime: RealtimeLimits = field(default_factory=RealtimeLimits)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


class ServerState:
    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.runtime: Runtime | None = None
        self.warmup: WarmupReport | None = None
        self.startup_error: str | None = None
        self.created = int(time.time())

    @property
    def ready(self) -> bool:
        return self.runtime is not None and self.warmup is not None

    async def start(self) -> None:
        try:
            self.runtime = await asyncio.to_thread(
                build_runtime, self.settings.model, self.settings.threads, self.settings.max_batch_size,
                self.settings.quantize)
            self.warmup = await run_warmup(self.runtime.adapter, self.runtime.engine)
        except Exception as e:  # the server stays up and says why it is not ready
            log.exception("start-up failed")
            self.startup_error = f"{type(e).__name__}: {e}"

    @property
    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        return f"start-up failed: {self.startup_error}" if self.startup_error else "the model is loading and warming up"

    def require_ready(self) -> Runtime:
        if not self.ready:
            raise OpenAIError(503, f"Service not ready: {self.not_ready_reason}. Retry shortly.", code="not_ready")
        return self.runtime


PAGE_DIR = Path(__file__).parent / "page"


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    state = ServerState(settings or ServerSettings())
    realtime_slots = SessionSlots(state.settings.realtime.max_sessions)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(state.start())
        yield
        task.cancel()
        if state.runtime is not None:
            state.runtime.close()

    app = FastAPI(title="asr-service", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        if not state.ready:
            state.require_ready()  # raises the 503
        return {"status": "ok", "model": state.settings.model_name, "warmup_seconds": state.warmup.total_seconds,
                "warmup_variants": state.warmup.variants, "active_sequences": state.runtime.engine.active_count,
                "queued_sequences": state.runtime.engine.queued_count,
                "cancelled_sequences": state.runtime.engine.cancelled_total,
                "realtime_sessions": realtime_slots.active}

    @app.get("/v1/models")
    async def models():
        state.require_ready()
        return {"object": "list", "data": [
            {"id": state.settings.model_name, "object": "model", "created": state.created, "owned_by": "asr-service"}]}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await _handle(request, state, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await _handle(request, state, "translate")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        await realtime_endpoint(ws, state.runtime if state.ready else None, state.not_ready_reason, realtime_slots,
                                state.settings.realtime, state.settings.model_name)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(PAGE_DIR / "index.html")

    app.mount("/page", StaticFiles(directory=PAGE_DIR), name="page")

    return app


async def _read_request(request: Request, state: ServerState, runtime: Runtime, task: str):
    limit = state.settings.limits.max_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + 1024 * 1024:
        raise OpenAIError(413, f"Request body of {declared} bytes exceeds the upload limit of {limit} bytes",
                          param="file", code="file_too_large")
    try:
        form = await request.form(max_files=1, max_fields=64)
    except Exception as e:  # malformed multipart, wrong content type
        raise OpenAIError(400, f"Could not parse the request as multipart/form-data: {e}", code="invalid_request") from None
    req = parse_transcription_form(form, runtime.adapter, task)
    if req.file.size is not None and req.file.size > limit:
        raise OpenAIError(413, f"Upload of {req.file.size} bytes exceeds the limit of {limit} bytes",
                          param="file", code="file_too_large")
    data = await req.file.read()
    try:
        audio = await asyncio.to_thread(decode_audio, data, state.settings.limits)
    except AudioTooLargeError as e:
        raise OpenAIError(413, str(e), param="file", code=e.code) from None
    except InvalidAudioError as e:
        raise OpenAIError(400, f"Invalid or unsupported audio file. ({e.detail})", param="file", code=e.code) from None
    except AudioError as e:
        raise OpenAIError(400, str(e), param="file", code=e.code) from None
    return req, audio


async def _until_disconnected(request: Request, work):
    """Run ``work``; if the client goes away first, cancel it (its engine slots free at the next step)."""
    task = asyncio.ensure_future(work)
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if not done and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
    return task.result()


async def _handle(request: Request, state: ServerState, task: str) -> Response:
    runtime = state.require_ready()
    req, audio = await _read_request(request, state, runtime, task)
    if req.stream:
        items = stream_transcription(runtime.transcriber, audio, req.options)
        events = (chunk_events(items, state.settings.model_name, req.stream_include_usage)
                  if req.stream_format == "chunk" else openai_events(items))
        return EventSourceResponse(events)
    options = dataclasses.replace(req.options, detection=state.settings.detection)
    result = await _until_disconnected(request, runtime.transcriber.transcribe(audio, options))
    if result is None:
        return Response(status_code=499)
    return _respond(result, req)


def _respond(result, req: TranscriptionRequest) -> Response:
    if req.response_format == "verbose_json":
        return JSONResponse(to_verbose_json(result))  # language is null when detection failed
    if result.detection_failure and not result.text:
        param = "max_completion_tokens" if req.options.max_new_tokens is not None else None
        raise OpenAIError(400 if param else 500, f"Language auto-detect failed: {result.detection_failure}",
                          param=param, code="language_detection_failed")
    if req.response_format == "json":
        return JSONResponse(to_json(result))
    return PlainTextResponse(render(result, req.response_format))
