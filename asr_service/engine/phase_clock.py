"""Seconds spent per phase of the embedded engine's loop (interface.ENGINE_PHASES), so /metrics
and the bench can say where a request's time goes.

A phase timed inside another (word alignment inside beam bookkeeping) is counted once: the
outer phase's clock stops while the inner one runs, so the phases add up to the time they
cover. perf_counter costs well under a microsecond; a decode step takes milliseconds. On CUDA,
kernels run asynchronously, so a phase's time lands in the phase that first reads its result.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from .interface import ENGINE_PHASES


class PhaseClock:
    def __init__(self):
        self._seconds = dict.fromkeys(ENGINE_PHASES, 0.0)
        self._running: list[str] = []  # the phases entered, innermost last
        self._since = 0.0  # when the innermost phase's clock last started

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        self._switch()
        self._running.append(phase)
        try:
            yield
        finally:
            self._switch()
            self._running.pop()

    def _switch(self) -> None:
        """Credit the time since the last switch to the innermost running phase."""
        now = time.perf_counter()
        if self._running:
            self._seconds[self._running[-1]] += now - self._since
        self._since = now

    def seconds(self) -> dict[str, float]:
        return dict(self._seconds)
