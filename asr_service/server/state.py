"""The server's settings and its state: the runtime once loaded, warmup, admission, metrics.

Every endpoint takes the ServerState; nothing else is shared between them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from warmup import WarmupReport, run_warmup

from ..audio import AudioLimits
from ..realtime.session import RealtimeLimits
from ..runtime import Runtime, RuntimeSettings, build_runtime
from .admission import Admission, AdmissionLimits
from .auth import ApiKeys
from .connections import ConnectionLimits
from .errors import OpenAIError
from .gate import Door
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass
class ServerSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    served_model_name: str | None = None
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

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.runtime.model


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
            self.runtime = await asyncio.to_thread(build_runtime, self.settings.runtime)
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
        engine = dataclasses.asdict(self.runtime.engine.figures())
        return {**engine, "pending_requests": self.admission.pending_requests,
                "pending_audio_seconds": round(self.admission.pending_audio_seconds, 3),
                "realtime_sessions": self.realtime_slots.active, "warmup_seconds": self.warmup.total_seconds,
                "engine": self.runtime.engine.name, "precision": self.runtime.precision}

    def require_ready(self) -> Runtime:
        if not self.ready:
            raise OpenAIError(503, f"Service not ready: {self.not_ready_reason}. Retry shortly.", code="not_ready")
        return self.runtime


def backend_status(backends: list[dict] | None) -> str:
    """ok, degraded (some SGLang servers down) or unavailable (all of them)."""
    if not backends:
        return "ok"
    up = sum(b["state"] == "up" for b in backends)
    return "ok" if up == len(backends) else "degraded" if up else "unavailable"
