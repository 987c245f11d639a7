"""The SGLang servers behind the service: which one takes the next decode, and which are down.

Each decode goes to the live server with the least outstanding work (sequences sent and not
finished; ties go to the one used least recently), so a slow or busy server gets less. A server
that fails (connection refused or dropped, a 5xx) is taken out for ``retry_after`` seconds,
doubling on each failure in a row up to ``max_retry_after``; after that it gets traffic again,
and its first success puts it back for good. A server gets traffic only once it is admitted: a
canary decode (engine.py) has shown which way of carrying the prompt it honours (``carrier``) and
that it applies the constraint. Every failure takes that away, so a server coming back is checked
again before it is used.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from .wire import Carrier


@dataclass
class Backend:
    url: str
    outstanding: int = 0  # decodes sent and not finished
    completed: int = 0
    failures: int = 0  # in total
    failures_in_row: int = 0
    down_until: float = 0.0  # monotonic time; 0 when up
    last_error: str | None = None
    last_used: int = 0
    carrier: Carrier | None = None  # set when admitted: how it is sent the prompt

    def is_up(self, now: float) -> bool:
        return now >= self.down_until

    def due_for_admission(self, now: float) -> bool:
        return self.carrier is None and self.is_up(now)

    def state(self, now: float) -> str:
        if not self.is_up(now):
            return "down"
        return "up" if self.carrier is not None else "unchecked"


@dataclass
class BackendPool:
    urls: list[str]
    retry_after: float = 2.0
    max_retry_after: float = 60.0
    backends: list[Backend] = field(init=False)

    def __post_init__(self):
        if not self.urls:
            raise ValueError("at least one SGLang URL is needed")
        self.backends = [Backend(url.rstrip("/")) for url in self.urls]
        self._uses = itertools.count(1)

    def pick(self, exclude: set[str] = frozenset(), carriers: frozenset[Carrier] = frozenset(Carrier)) -> Backend | None:
        """The admitted live backend with the least outstanding work whose carrier is one of
        ``carriers``, not in ``exclude``; None if none."""
        live = self.live(exclude, carriers)
        if not live:
            return None
        chosen = min(live, key=lambda b: (b.outstanding, b.last_used))
        chosen.last_used = next(self._uses)
        return chosen

    def live(self, exclude: set[str] = frozenset(), carriers: frozenset[Carrier] = frozenset(Carrier)) -> list[Backend]:
        now = time.monotonic()
        return [b for b in self.backends if b.is_up(now) and b.carrier in carriers and b.url not in exclude]

    def due_for_admission(self) -> list[Backend]:
        now = time.monotonic()
        return [b for b in self.backends if b.due_for_admission(now)]

    def admitted(self, backend: Backend, carrier: Carrier) -> None:
        backend.carrier = carrier
        self.succeeded(backend)

    def carriers(self) -> set[Carrier]:
        """How the admitted backends are sent prompts (empty before any is admitted)."""
        return {b.carrier for b in self.backends if b.carrier is not None}

    def succeeded(self, backend: Backend) -> None:
        backend.completed += 1
        backend.failures_in_row = 0
        backend.down_until = 0.0

    def failed(self, backend: Backend, error: str) -> float:
        """Take ``backend`` out; returns the seconds until it is checked again."""
        backend.failures += 1
        backend.failures_in_row += 1
        backend.last_error = error
        backend.carrier = None  # checked again before it gets traffic
        delay = min(self.max_retry_after, self.retry_after * 2 ** (backend.failures_in_row - 1))
        backend.down_until = time.monotonic() + delay
        return delay

    def unavailable_reason(self, carriers: frozenset[Carrier] = frozenset(Carrier)) -> str:
        now = time.monotonic()
        parts = [f"{b.url} down for {b.down_until - now:.0f} s more ({b.last_error})"
                 for b in self.backends if not b.is_up(now)]
        parts += [f"{b.url} cannot carry this prompt (it has no asr_whisper_prompt plugin)"
                  for b in self.backends if b.is_up(now) and b.carrier is not None and b.carrier not in carriers]
        return "no SGLang backend can take this decode: " + ("; ".join(parts) or "none is up")

    def snapshot(self) -> list[dict]:
        """Each backend's state, for /health and /metrics."""
        now = time.monotonic()
        return [{"url": b.url, "state": b.state(now), "prompt_carrier": b.carrier.value if b.carrier else None,
                 "outstanding": b.outstanding, "completed": b.completed,
                 "failures": b.failures, "retry_in_seconds": round(max(0.0, b.down_until - now), 1),
                 "last_error": b.last_error} for b in self.backends]
