"""The server's settings and its state: the served models, admission, metrics.

Every endpoint takes the ServerState; nothing else is shared between them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from ..audio import AudioLimits
from ..model_loading import DEFAULT_MODEL
from ..realtime.session import RealtimeLimits
from ..runtime import RuntimeSettings
from .admission import Admission, AdmissionLimits
from .auth import ApiKeys
from .connections import ConnectionLimits
from .errors import OpenAIError
from .gate import Door
from .metrics import ServerMetrics
from .model_pool import LoadFailed, ModelEntry, ModelPool, ServedModel

# The packaged model, also under the name OpenAI's SDK examples use.
# OpenAI's names, so SDK code that names them works unchanged: whisper-1, and the diarizing
# model (any served model diarizes with response_format=diarized_json).
DEFAULT_MODELS = (ModelEntry(DEFAULT_MODEL, (DEFAULT_MODEL, "whisper-1", "gpt-4o-transcribe-diarize")),)

log = logging.getLogger(__name__)


@dataclass
class ServerSettings:
    # How each model is run (engine, device, precision, threads); its ``model`` is each entry's spec.
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    models: tuple[ModelEntry, ...] = DEFAULT_MODELS  # the first is the default
    max_loaded_models: int | None = None  # None: all of them
    model_idle_timeout_s: float | None = None  # None: never unloaded for idleness
    # "two-stage" (a separate detection decode) exists only as a baseline for bench/.
    detection: str = "fused"
    # What stream=true sends when the request names no stream_format: "openai" (the OpenAI SDK's
    # transcript.text.* events) or "chunk" (vLLM / SGLang's choices[0].delta.content).
    default_stream_format: str = "openai"
    limits: AudioLimits = field(default_factory=AudioLimits)
    realtime: RealtimeLimits = field(default_factory=RealtimeLimits)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    request_timeout_s: float = 600.0  # deadline per HTTP request: upload, decoding, transcription
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    api_keys: tuple[str, ...] = ()  # empty: no authentication


class SessionSlots:
    """The server-wide cap on concurrent realtime sessions."""

    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0

    def take(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def give_back(self) -> None:
        self.active -= 1


class ServerState:
    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.models = ModelPool(list(settings.models), settings.runtime, settings.max_loaded_models,
                                settings.model_idle_timeout_s)
        self.ready = False  # the default model is loaded and warm
        self.startup_error: str | None = None
        self.created = int(time.time())
        self.door = Door(ApiKeys(settings.api_keys))
        self.admission = Admission(settings.admission)
        self.metrics = ServerMetrics()
        self.realtime_slots = SessionSlots(settings.realtime.max_sessions)
        self.metrics.watch(self.figures)

    @property
    def default(self) -> ServedModel:
        return self.models.default

    async def start(self) -> None:
        try:
            await self.models.load_default()
            self.ready = True
        except LoadFailed as e:  # the server stays up and says why it is not ready (logged by the pool)
            self.startup_error = str(e)
            return
        except Exception as e:
            log.exception("start-up failed")
            self.startup_error = f"{type(e).__name__}: {e}"
            return
        await self.models.load_the_rest()
        await self.models.unload_idle()

    @property
    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        return f"start-up failed: {self.startup_error}" if self.startup_error else "the model is loading and warming up"

    def figures(self) -> dict | None:
        """What /health and /metrics report of the default model's engine and of the server (None
        before start-up)."""
        if not self.ready:
            return None
        default = self.default
        engine = dataclasses.asdict(default.runtime.engine.figures())
        return {**engine, "pending_requests": self.admission.pending_requests,
                "pending_audio_seconds": round(self.admission.pending_audio_seconds, 3),
                "realtime_sessions": self.realtime_slots.active, "warmup_seconds": default.warmup.total_seconds,
                "engine": default.runtime.engine.name, "precision": default.runtime.precision}

    def require_ready(self) -> None:
        if not self.ready:
            raise OpenAIError(503, f"Service not ready: {self.not_ready_reason}. Retry shortly.", code="not_ready")

    def close(self) -> None:
        self.models.close()


def backend_status(backends: list[dict] | None) -> str:
    """ok, degraded (some SGLang servers down) or unavailable (all of them)."""
    if not backends:
        return "ok"
    up = sum(b["state"] == "up" for b in backends)
    return "ok" if up == len(backends) else "degraded" if up else "unavailable"
