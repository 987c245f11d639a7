"""The models a server serves, each under its names, each with its own engine and batch.

The first model configured is the default (a request that names no model gets it): it loads and
warms up at start and stays loaded, and /health reports its engine. The others load at start
while ``max_loaded`` leaves room, else on first use; a model with no request in flight is
unloaded after ``idle_timeout_s`` without one, or to make room for another (the least recently
used first). Loading runs on a worker thread and its warmup on the engine's, so requests to the
models already loaded go on meanwhile; requests for a model being loaded wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass

from asr_service.warmup import WarmupReport, run_warmup

from ..heap import return_freed_memory
from ..runtime import Runtime, RuntimeSettings, build_runtime
from .errors import OpenAIError, echoed

log = logging.getLogger(__name__)

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"


class LoadFailed(Exception):
    """The default model could not be loaded at start."""


@dataclass(frozen=True)
class ModelEntry:
    """One served model: what ``--model`` names (a packaged name, a directory or a hub id) and
    the names requests may use for it; the first is the one responses report."""

    spec: str
    names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.names[0]


def parse_model_entry(text: str) -> ModelEntry:
    """``SPEC`` or ``SPEC=NAME[,NAME...]`` (the names the model is served under; default: SPEC)."""
    spec, _, names = text.partition("=")
    spec = spec.strip()
    served = tuple(n.strip() for n in names.split(",")) if names else (spec,)
    if not spec or not all(served):
        raise ValueError(f"{text!r} is not SPEC or SPEC=NAME[,NAME...]")
    return ModelEntry(spec, served)


class ServedModel:
    def __init__(self, entry: ModelEntry, settings: RuntimeSettings, resident: bool):
        self.entry = entry
        self.settings = settings
        self.resident = resident  # the default: never unloaded
        self.status = UNLOADED
        self.runtime: Runtime | None = None
        self.warmup: WarmupReport | None = None
        self.error: str | None = None
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.loading: asyncio.Future | None = None

    @property
    def evictable(self) -> bool:
        return self.status == LOADED and not self.resident and self.in_flight == 0

    def card(self, created: int) -> list[dict]:
        """/v1/models entries, one per served name (OpenAI's fields; ``root`` and ``status`` as vLLM
        and speaches add them)."""
        return [{"id": name, "object": "model", "created": created, "owned_by": "asr-service", "root": self.entry.spec,
                 "status": self.status, **({"error": self.error} if self.status == FAILED else {})}
                for name in self.entry.names]


class Lease:
    """A request's hold on a loaded model: the model is not unloaded until every lease is released."""

    def __init__(self, model: ServedModel):
        self.model = model
        self.runtime = model.runtime
        self._released = False

    @property
    def name(self) -> str:
        return self.model.entry.name

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.model.in_flight -= 1
            self.model.last_used = time.monotonic()


def check_entries(entries: list[ModelEntry] | tuple[ModelEntry, ...], max_loaded: int | None) -> None:
    """ValueError when the served models do not combine (checked before anything loads)."""
    names = [n for e in entries for n in e.names]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"served model name(s) {', '.join(repeated)} given to more than one model")
    # The default stays loaded: another model needs a second place.
    if max_loaded is not None and max_loaded < min(2, len(entries)):
        raise ValueError(f"--max-loaded-models {max_loaded} leaves no room beside the default model, which "
                         "stays loaded; with several models it must be at least 2")


class ModelPool:
    def __init__(self, entries: list[ModelEntry], settings: RuntimeSettings, max_loaded: int | None = None,
                 idle_timeout_s: float | None = None):
        check_entries(entries, max_loaded)
        self.max_loaded = max_loaded or len(entries)
        self.idle_timeout_s = idle_timeout_s
        self.models = [ServedModel(e, dataclasses.replace(settings, model=e.spec), resident=i == 0)
                       for i, e in enumerate(entries)]
        self._by_name = {n: m for m in self.models for n in m.entry.names}

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def find(self, name: str | None) -> ServedModel:
        if name is None:
            return self.default
        model = self._by_name.get(name)
        if model is None:
            raise OpenAIError(404, f"The model {echoed(name)} does not exist; this server serves: "
                                   f"{', '.join(self.names)}", param="model", code="model_not_found")
        return model

    async def load_default(self) -> None:
        """Load the default (LoadFailed when it cannot be: the server is not ready without it)."""
        await self._load(self.default)
        if self.default.status == FAILED:
            raise LoadFailed(self.default.error)

    async def load_the_rest(self) -> None:
        """Load the other models while there is room, one after another (requests for one of
        them wait for its load; requests for a loaded model do not)."""
        for model in self.models[1:]:
            if self._loaded_count() < self.max_loaded:
                await self._load(model)

    async def lease(self, name: str | None) -> Lease:
        """The named model, loaded (waiting for its load, or starting it) and held for a request."""
        model = self.find(name)
        if model.status != LOADED:
            await self._load(model)
        if model.status != LOADED:
            raise OpenAIError(503, f"The model '{name or model.entry.name}' could not be loaded: {model.error}",
                              param="model", code="model_unavailable", headers={"Retry-After": "10"})
        model.in_flight += 1
        model.last_used = time.monotonic()
        return Lease(model)

    async def _load(self, model: ServedModel) -> None:
        if model.loading is None:
            model.loading = asyncio.ensure_future(self._load_now(model))
        # Shielded: a request that gives up (client gone, deadline) leaves the load to finish.
        await asyncio.shield(model.loading)

    async def _load_now(self, model: ServedModel) -> None:
        try:
            if model.status == LOADED:
                return
            self._make_room()
            model.status, model.error = LOADING, None
            log.info("loading model %s (%s)", model.entry.name, model.entry.spec)
            try:
                runtime = await asyncio.to_thread(build_runtime, model.settings)
                try:
                    model.warmup = await run_warmup(runtime.adapter, runtime.engine)
                except BaseException:
                    runtime.close()
                    raise
            except Exception as e:  # said by /v1/models and to each request for it
                log.exception("loading model %s failed", model.entry.name)
                model.status, model.error = FAILED, f"{type(e).__name__}: {e}"
                return
            model.runtime, model.status = runtime, LOADED
            model.last_used = time.monotonic()
        except OpenAIError as e:  # no room: the request gets the reason; the model stays unloaded
            model.error = e.message
        finally:
            model.loading = None

    def _loaded_count(self) -> int:
        return sum(m.status in (LOADED, LOADING) for m in self.models)

    def _make_room(self) -> None:
        if self._loaded_count() < self.max_loaded:
            return
        idle = [m for m in self.models if m.evictable]
        if not idle:
            raise OpenAIError(503, f"All {self.max_loaded} loaded models are busy (--max-loaded-models); retry "
                                   "shortly", param="model", code="model_unavailable", headers={"Retry-After": "5"})
        self._unload(min(idle, key=lambda m: m.last_used))

    def _unload(self, model: ServedModel) -> None:
        log.info("unloading model %s", model.entry.name)
        runtime, model.runtime, model.warmup, model.status = model.runtime, None, None, UNLOADED
        runtime.close()
        return_freed_memory()

    async def unload_idle(self) -> None:
        """Forever: unload the models idle longer than the timeout (none when it is unset)."""
        if self.idle_timeout_s is None:
            return
        while True:
            await asyncio.sleep(min(5.0, self.idle_timeout_s / 4))
            now = time.monotonic()
            for model in self.models:
                if model.evictable and now - model.last_used > self.idle_timeout_s:
                    self._unload(model)

    def cards(self, created: int) -> list[dict]:
        return [card for m in self.models for card in m.card(created)]

    def close(self) -> None:
        for model in self.models:
            runtime, model.runtime = model.runtime, None
            if runtime is not None:
                with contextlib.suppress(Exception):
                    runtime.close()
