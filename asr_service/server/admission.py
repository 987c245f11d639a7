"""Backpressure: a bound on transcription work admitted and not yet finished.

Work is counted in requests and in seconds of audio. A request that would go past either bound
is refused at once (429 with Retry-After) instead of waiting in an unbounded queue; one request
is always admitted when nothing is pending, however long. Retry-After is an estimate: the pending
audio over the rate at which recent requests were transcribed, times the requests running
together (the engine decodes them in one batch).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


class Overloaded(Exception):
    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class AdmissionLimits:
    max_pending_requests: int = 64
    max_pending_audio_seconds: float = 3600.0


class Ticket:
    """One admitted request's claim; release() is safe to call more than once."""

    def __init__(self, admission: Admission, audio_seconds: float):
        self._admission = admission
        self.audio_seconds = audio_seconds
        self._start = time.monotonic()
        self._released = False

    def claim(self, audio_seconds: float) -> None:
        """The request now holds ``audio_seconds`` of audio (it grows while the upload decodes);
        Overloaded when that goes past the bound while other requests are pending. Safe to call
        from the decoding thread."""
        self._admission._grow(self, audio_seconds)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._finished(self.audio_seconds, time.monotonic() - self._start)


class Admission:
    def __init__(self, limits: AdmissionLimits = AdmissionLimits()):
        self.limits = limits
        self.pending_requests = 0
        self.pending_audio_seconds = 0.0
        self._rate: float | None = None  # audio seconds per wall second, moving average
        self._lock = threading.Lock()  # tickets grow from decoding threads

    def _check_room(self) -> None:
        """Refuse when no request could be admitted."""
        if self.pending_requests >= self.limits.max_pending_requests:
            raise Overloaded(f"Server busy: {self.pending_requests} requests pending (limit "
                             f"{self.limits.max_pending_requests}). Retry later.", self.retry_after())

    def admit(self, audio_seconds: float = 0.0) -> Ticket:
        """A ticket for one request holding ``audio_seconds`` (0 before its upload is decoded:
        the ticket then grows with ``claim``)."""
        with self._lock:
            self._check_room()
            self._check_audio(self.pending_requests, audio_seconds)
            self.pending_requests += 1
            self.pending_audio_seconds += audio_seconds
            return Ticket(self, audio_seconds)

    def _check_audio(self, others: int, adding: float) -> None:
        """Refuse ``adding`` seconds past the bound while ``others`` requests are pending (one
        request alone is always admitted, however long)."""
        limit = self.limits.max_pending_audio_seconds
        if others and self.pending_audio_seconds + adding > limit:
            raise Overloaded(f"Server busy: {self.pending_audio_seconds:.0f} s of audio pending, this request adds "
                             f"{adding:.0f} s (limit {limit:g} s). Retry later.", self.retry_after())

    def _grow(self, ticket: Ticket, audio_seconds: float) -> None:
        with self._lock:
            if ticket._released or audio_seconds <= ticket.audio_seconds:
                return
            self._check_audio(self.pending_requests - 1, audio_seconds - ticket.audio_seconds)
            self.pending_audio_seconds += audio_seconds - ticket.audio_seconds
            ticket.audio_seconds = audio_seconds

    def retry_after(self) -> int:
        if not self._rate:
            return 1
        throughput = self._rate * max(1, self.pending_requests)
        return max(1, min(60, math.ceil(self.pending_audio_seconds / throughput)))

    def _finished(self, audio_seconds: float, wall_seconds: float) -> None:
        with self._lock:
            self.pending_requests -= 1
            self.pending_audio_seconds = max(0.0, self.pending_audio_seconds - audio_seconds)
        if wall_seconds > 0 and audio_seconds > 0:
            rate = audio_seconds / wall_seconds
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
