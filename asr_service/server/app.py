"""FastAPI app: /v1/audio/transcriptions, /v1/audio/translations, /v1/models, /health, /metrics,
the /v1/realtime WebSocket, and the browser page at /.

Start-up loads the model and runs warmup in the background; until both are done every
route but /health answers 503 (OpenAI error shape) and /health says 503 too. Three ASGI
middlewares wrap everything: the request log (id, JSON line, request metrics) outside, the
security headers, then the gate (API keys, draining at shutdown) inside.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from .errors import install_error_handlers
from .gate import Gate
from .headers import SecurityHeaders
from .realtime_ws import realtime_endpoint
from .request_log import RequestLog
from .state import ServerSettings, ServerState, backend_status
from .transcription_endpoint import handle_transcription

PAGE_DIR = Path(__file__).parent / "page"


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    state = ServerState(settings or ServerSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(state.start())
        yield
        task.cancel()
        state.close()

    app = FastAPI(title="asr-service", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(Gate, door=state.door)
    app.add_middleware(SecurityHeaders)  # on every answer, refusals at the door included
    app.add_middleware(RequestLog, metrics=state.metrics)  # added last: the outermost
    app.include_router(_routes(state))
    app.mount("/page", StaticFiles(directory=PAGE_DIR), name="page")
    return app


def _routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with either
    async def health():
        return _health(state)

    @router.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @router.get("/v1/models")
    async def models():
        state.require_ready()
        return {"object": "list", "data": state.models.cards(state.created)}

    @router.get("/v1/models/{model_id:path}")  # :path: hub ids hold a slash (openai/whisper-base)
    async def model(model_id: str):
        state.require_ready()
        served = state.models.find(model_id)  # 404 model_not_found for a name not served
        return next(card for card in served.card(state.created) if card["id"] == model_id)

    @router.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await handle_transcription(request, state, "transcribe")

    @router.post("/v1/audio/translations")
    async def translations(request: Request):
        return await handle_transcription(request, state, "translate")

    @router.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        await realtime_endpoint(ws, state)

    @router.get("/", include_in_schema=False)
    async def page():
        return FileResponse(PAGE_DIR / "index.html")

    return router


def _health(state: ServerState) -> JSONResponse:
    """503 until ready; then the engine's figures (the counters are /metrics'), and 503 again
    while every SGLang backend is down: this front cannot decode, so a load balancer should
    skip it."""
    figures = state.figures()
    if figures is None:
        state.require_ready()  # raises the 503
    for counter in ("steps", "tokens", "batch_sizes", "submitted_sequences", "phase_seconds"):  # /metrics has these
        del figures[counter]
    status = backend_status(figures["backends"])
    default = state.default
    body = {"status": status, "model": default.entry.name, "warmup_variants": default.warmup.variants,
            "models": {m.entry.name: m.status for m in state.models.models}, **figures}
    return JSONResponse(body, status_code=503 if status == "unavailable" else 200)
