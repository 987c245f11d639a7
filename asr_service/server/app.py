"""FastAPI app: /v1/audio/transcriptions, /v1/audio/translations, /v1/models, /health, /metrics,
the /v1/realtime WebSocket, and the browser page at /.

Start-up loads the model and runs warmup in the background; until both are done every
route but /health answers 503 (OpenAI error shape) and /health says 503 too. Two ASGI
middlewares wrap everything: the request log (id, JSON line, request metrics) outside, the
gate (API keys, draining at shutdown) inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from warmup import WarmupReport, run_warmup

from ..audio import AudioLimits
from ..model_loading import DEFAULT_MODEL
from ..realtime.session import RealtimeLimits
from ..runtime import Runtime, build_runtime
from .admission import Admission, AdmissionLimits
from .auth import ApiKeys
from .errors import OpenAIError, install_error_handlers
from .gate import Door, Gate
from .metrics import ServerMetrics
from .realtime_ws import SessionSlots, realtime_endpoint
from .request_log import RequestLog
from .transcription_endpoint import handle_transcription

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
    device: str | None = None  # None: cuda when torch sees a GPU, else cpu
    engine: str = "embedded"  # or "sglang": decodes go to sglang_urls
    sglang_urls: tuple[str, ...] = ()
    sglang_retry_after_s: float = 2.0  # a failed SGLang server is left out this long (doubling)
    limits: AudioLimits = field(default_factory=AudioLimits)
    realtime: RealtimeLimits = field(default_factory=RealtimeLimits)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    request_timeout_s: float = 600.0  # decode deadline per HTTP request
    api_keys: tuple[str, ...] = ()  # empty: no authentication

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
        self.door = Door(ApiKeys(settings.api_keys))
        self.admission = Admission(settings.admission)
        self.metrics = ServerMetrics()
        self.realtime_slots = SessionSlots(settings.realtime.max_sessions)
        self.metrics.watch(self.figures)

    @property
    def ready(self) -> bool:
        return self.runtime is not None and self.warmup is not None

    async def start(self) -> None:
        try:
            s = self.settings
            self.runtime = await asyncio.to_thread(
                build_runtime, s.model, s.threads, s.max_batch_size, s.quantize, s.device, s.engine, s.sglang_urls,
                s.sglang_retry_after_s)
            self.warmup = await run_warmup(self.runtime.adapter, self.runtime.engine)
        except Exception as e:  # the server stays up and says why it is not ready
            log.exception("start-up failed")
            self.startup_error = f"{type(e).__name__}: {e}"

    @property
    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        return f"start-up failed: {self.startup_error}" if self.startup_error else "the model is loading and warming up"

    def figures(self) -> dict | None:
        """What /health and /metrics report of the engine and the server (None before start-up)."""
        if not self.ready:
            return None
        engine = self.runtime.engine
        return {"active_sequences": engine.active_count, "queued_sequences": engine.queued_count,
                "cancelled_sequences": engine.cancelled_total, "steps": engine.steps, "tokens": engine.tokens_total,
                "batch_sizes": dict(engine.batch_sizes), "pending_requests": self.admission.pending_requests,
                "pending_audio_seconds": round(self.admission.pending_audio_seconds, 3),
                "realtime_sessions": self.realtime_slots.active, "warmup_seconds": self.warmup.total_seconds,
                "engine": self.settings.engine, "backends": _backends(engine)}

    def require_ready(self) -> Runtime:
        if not self.ready:
            raise OpenAIError(503, f"Service not ready: {self.not_ready_reason}. Retry shortly.", code="not_ready")
        return self.runtime


def _backends(engine) -> list[dict] | None:
    """Each SGLang server's state; None for the embedded engine."""
    pool = getattr(engine, "pool", None)
    return pool.snapshot() if pool is not None else None


def _backend_status(backends: list[dict] | None) -> str:
    if not backends:
        return "ok"
    up = sum(b["state"] == "up" for b in backends)
    return "ok" if up == len(backends) else "degraded" if up else "unavailable"


PAGE_DIR = Path(__file__).parent / "page"


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    state = ServerState(settings or ServerSettings())

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
    app.add_middleware(Gate, door=state.door)
    app.add_middleware(RequestLog, metrics=state.metrics)  # added last: the outermost

    @app.get("/health")
    async def health():
        figures = state.figures()
        if figures is None:
            state.require_ready()  # raises the 503
        del figures["steps"], figures["tokens"], figures["batch_sizes"]
        status = _backend_status(figures["backends"])
        body = {"status": status, "model": state.settings.model_name, "warmup_variants": state.warmup.variants,
                **figures}
        # Every SGLang backend down: this front cannot decode, so a load balancer should skip it.
        return JSONResponse(body, status_code=503 if status == "unavailable" else 200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/v1/models")
    async def models():
        state.require_ready()
        return {"object": "list", "data": [
            {"id": state.settings.model_name, "object": "model", "created": state.created, "owned_by": "asr-service"}]}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await handle_transcription(request, state, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await handle_transcription(request, state, "translate")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        await realtime_endpoint(ws, state.runtime if state.ready else None, state.not_ready_reason,
                                state.realtime_slots, state.settings.realtime, state.settings.model_name,
                                state.metrics)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(PAGE_DIR / "index.html")

    app.mount("/page", StaticFiles(directory=PAGE_DIR), name="page")

    return app
