"""SequenceStream: how an engine hands one sequence's tokens to its caller.

The engine side (any thread) calls ``emit`` for each token and ``finish`` once; the caller (an
asyncio task) iterates the StepEvents or awaits ``collect``, and may ``cancel`` at any time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from .params import SequenceResult, StepEvent


class SequenceStream:
    """Async iterator of StepEvents for one sequence; ``result`` is complete when it ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_cancel: Callable[[], None] | None = None):
        self._loop = loop
        self._queue: asyncio.Queue[StepEvent | None] = asyncio.Queue()
        self.result = SequenceResult()
        self.cancelled = threading.Event()
        # For engines that must act at once on a cancel (a remote decode is aborted).
        self.on_cancel = on_cancel

    # ---- the caller's side ----
    def cancel(self) -> None:
        """Stop the sequence: its slot is freed at the next step (safe from any thread; no
        effect on a sequence that has finished)."""
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()

    def __aiter__(self):
        return self

    async def __anext__(self) -> StepEvent:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def collect(self) -> SequenceResult:
        async for _ in self:
            pass
        return self.result

    # ---- the engine's side (any thread) ----
    def emit(self, event: StepEvent) -> None:
        """Hand one generated token to the caller."""
        self._put(event)

    def finish(self, reason: str, error: str | None = None) -> None:
        """End the sequence: ``result`` is final, and the caller's iteration stops."""
        self.result.finish_reason = reason
        self.result.error = error
        self._put(None)

    def _put(self, item: StepEvent | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is gone: nobody is listening any more
            self.cancelled.set()
