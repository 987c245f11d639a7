"""Connection hygiene: uvicorn's HTTP/1.1 protocol (h11) with a cap on open connections, a
deadline for a request's headers, and a bounded drain of a body its response already refused.

uvicorn alone arms no timer before a connection's first response: a client that connects and
sends nothing, or drips its headers a byte at a time, holds its socket for ever, and enough of
them use up the process's file descriptors (asyncio then logs a traceback for every failed
accept, many times a second). Here:
- a request's headers must all arrive within ``header_timeout_s`` of the connection opening (or
  of its previous response): a silent connection is closed, a half-sent request gets a 408;
- past ``max_connections`` open connections (HTTP and WebSocket alike) a new one is answered
  503 in the OpenAI shape and closed; the cap is set below the file-descriptor limit, so accept
  itself does not fail;
- a body the server has answered before reading it all (401, 413, 429 ...) is read and dropped
  while it keeps arriving (no pause longer than ``body_timeout_s``), for at most
  ``lingering_time_s`` (nginx's lingering close): a client still sending gets to read that answer
  instead of a reset, but cannot keep the connection by sending for ever.
A body that stalls after its headers is the endpoint's to time out (it knows the request).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import resource
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import OpenAIError

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 1000
MAX_BACKLOG = 2048  # uvicorn's default
MIN_BACKLOG = 64  # a smaller listen queue overflows under a burst of connects, which then wait 1 s each
BASE_RESERVED_FILES = 32  # the listening socket, logs, the model's files while it loads, pipes
MAX_LINGERING = 64  # refused connections given time to read their answer; past it, closed at once
LINGER_SECONDS = 1.0  # after a refusal: time for the client to read it before the socket closes
LOG_EVERY_SECONDS = 10.0
# asyncio accepts up to ``backlog`` sockets per loop iteration (selector_events._accept_connection),
# and each holds its file while its connection task waits for the next iteration and, refused past
# the lingering bound, one more for its deferred close; meanwhile the next bursts are accepted.
# Under a flood up to three bursts hold files at once.
ACCEPT_BURSTS_IN_FLIGHT = 3


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int | None = None  # None: DEFAULT_MAX_CONNECTIONS, or what the file limit allows
    header_timeout_s: float = 15.0  # from connecting (or the last response) to a request's full headers
    keep_alive_s: float = 5.0  # idle after a response before the connection is closed
    body_timeout_s: float = 30.0  # longest pause inside an upload
    lingering_time_s: float = 30.0  # after an early answer: the longest the rest of the body is read and dropped


def open_files_limit() -> int:
    """The process's limit on open files, raised to the hard limit first (the soft one is often
    a small default that a server with many clients outgrows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


@dataclass(frozen=True)
class ConnectionPlan:
    max_connections: int
    # The listen backlog, which is also how many connections asyncio accepts in one go, before
    # any of them is counted against the cap: room for that many must be left in the file limit.
    backlog: int


def plan_connections(requested: int | None, files_per_request: int, max_pending_requests: int,
                     open_files: int) -> ConnectionPlan:
    """How many connections may be open at once, and the accept backlog: what was asked for, if
    the file limit leaves room for it beside the server's own files, the admitted requests'
    uploads, the refusals still lingering and the bursts of accepts in flight."""
    reserved = BASE_RESERVED_FILES + MAX_LINGERING + files_per_request * max_pending_requests
    room = open_files - reserved
    if requested is None:
        backlog = min(MAX_BACKLOG, max(MIN_BACKLOG, room // (4 * ACCEPT_BURSTS_IN_FLIGHT)))
        accepting = ACCEPT_BURSTS_IN_FLIGHT * backlog
        if room - accepting < 1:
            raise ValueError(f"the process may open only {open_files} files, and {reserved + accepting} are "
                             f"reserved; raise the limit (ulimit -n) or lower --max-pending-requests")
        return ConnectionPlan(min(DEFAULT_MAX_CONNECTIONS, room - accepting), backlog)
    backlog = min(MAX_BACKLOG, (room - requested) // ACCEPT_BURSTS_IN_FLIGHT)
    if requested < 1 or backlog < MIN_BACKLOG:
        accepting = ACCEPT_BURSTS_IN_FLIGHT * MIN_BACKLOG
        raise ValueError(f"--max-connections {requested}: the process may open {open_files} files, of which "
                         f"{reserved + accepting} are reserved, so at most {max(room - accepting, 0)} "
                         f"connections fit; raise the limit (ulimit -n) or ask for fewer")
    return ConnectionPlan(requested, backlog)


class RateLimitedLog:
    """A warning at most every ``every_seconds`` per kind, with the count of the ones left out."""

    def __init__(self, logger: logging.Logger, every_seconds: float = LOG_EVERY_SECONDS):
        self.logger = logger
        self.every_seconds = every_seconds
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args) -> None:
        now = time.monotonic()
        if kind in self._last and now - self._last[kind] < self.every_seconds:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return
        skipped = self._skipped.pop(kind, 0)
        self._last[kind] = now
        self.logger.warning(message + (f" ({skipped} more like it since the last such line)" if skipped else ""),
                            *args)


ACCEPT_OUT_OF_FILES = "socket.accept() out of system resource"  # asyncio's message, see below


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, warnings: RateLimitedLog) -> None:
    """Log asyncio's failed accepts at most every LOG_EVERY_SECONDS: when the process runs out of
    files, asyncio reports every accept it retries, thousands a second, each with a traceback."""
    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") == ACCEPT_OUT_OF_FILES:
            warnings.warning("accept", "cannot accept connections: %s", context.get("exception"))
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class ConnectionGuard:
    """What the connections of one server share: the limits, the refusals still lingering, and
    the rate-limited warnings."""

    def __init__(self, limits: ConnectionLimits, max_connections: int):
        self.limits = limits
        self.max_connections = max_connections
        self.lingering = 0
        self.warnings = RateLimitedLog(log)


def _raw_error(error: OpenAIError) -> bytes:
    """A whole HTTP response for ``error``, written before (or without) any request cycle."""
    body = json.dumps(error.body()).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
               **(error.headers or {})}
    head = f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the cap, the header deadline and the bounded drain above.
    Built by uvicorn for every accepted connection (``functools.partial`` binds ``guard``)."""

    def __init__(self, config, server_state, app_state, _loop=None, *, guard: ConnectionGuard):
        super().__init__(config, server_state, app_state, _loop)
        self.guard = guard
        self._deadline: asyncio.TimerHandle | None = None
        self._pause: asyncio.TimerHandle | None = None  # while dropping a body: until its next bytes
        self._waiting_for: str | None = None  # "headers" or "body" (the rest of one already answered)
        self._refused = False  # over the cap: never set up as uvicorn's connection
        self._closing = False  # answered outside a request cycle; what arrives now is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:
        if len(self.connections) >= self.guard.max_connections:
            self.transport = transport
            self._refused = True
            self.guard.warnings.warning("cap", "refusing connections: %d open, the cap", len(self.connections))
            self._answer_and_close(OpenAIError(
                503, f"The server has {self.guard.max_connections} connections open, its limit; retry shortly",
                code="too_many_connections", headers={"Retry-After": "1"}))
            return
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def _watch(self) -> None:
        """Arm the deadline for what the connection now waits for from its client: a request's
        headers (bytes arriving do not push it back), or the rest of a body already answered
        (dropped for as long as it keeps coming, up to the lingering time). Disarm it while the
        request is in the app's hands."""
        if self.transport.is_closing():
            return self._disarm()
        theirs, ours = self.conn.their_state, self.conn.our_state
        if theirs is h11.IDLE:
            waiting_for = "headers"
        elif theirs is h11.SEND_BODY and ours in (h11.DONE, h11.MUST_CLOSE):
            waiting_for = "body"
        else:
            waiting_for = None
        if waiting_for == self._waiting_for:
            if waiting_for == "body":  # more of it arrived
                self._restart_pause_limit()
            return
        self._disarm()
        self._waiting_for = waiting_for
        if waiting_for == "headers":
            self._deadline = self.loop.call_later(self.guard.limits.header_timeout_s, self._headers_too_slow)
        elif waiting_for == "body":
            self._deadline = self.loop.call_later(self.guard.limits.lingering_time_s, self.transport.close)
            self._restart_pause_limit()

    def _restart_pause_limit(self) -> None:
        if self._pause is not None:
            self._pause.cancel()
        self._pause = self.loop.call_later(self.guard.limits.body_timeout_s, self.transport.close)

    def _disarm(self) -> None:
        for timer in (self._deadline, self._pause):
            if timer is not None:
                timer.cancel()
        self._deadline = self._pause = None
        self._waiting_for = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        partial, _ = self.conn.trailing_data
        if not partial:  # sent nothing: nobody to answer
            self.transport.close()
            return
        seconds = self.guard.limits.header_timeout_s
        self._answer_and_close(OpenAIError(408, f"The request's headers did not arrive within {seconds:g} s",
                                           code="timeout", type="timeout_error"))

    def _answer_and_close(self, error: OpenAIError) -> None:
        """Write ``error`` and close, after giving the client a moment to read it: closing with
        its request still arriving would reset the connection and lose the answer."""
        self._closing = True
        self.transport.write(_raw_error(error))
        if self.guard.lingering >= MAX_LINGERING or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.guard.lingering += 1
        self.transport.write_eof()

        def close() -> None:
            self.guard.lingering -= 1
            self.transport.close()

        self.loop.call_later(LINGER_SECONDS, close)
