"""Runs the app under uvicorn, with a graceful drain on SIGTERM / SIGINT, and its connections
guarded (connections.py: a cap fitted to the open-files limit, a header deadline).

On the first signal the server keeps listening but answers every new request with 503
("shutting_down", see gate.py) while the requests and realtime sessions already inside finish;
when none is left uvicorn shuts down as usual and the process exits 0. At the end of
``grace_seconds`` the door says the grace is over: the work still inside stops and its clients
get proper endings (up to ENDING_SECONDS to write them), then the process exits without waiting
further. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import uvicorn

from .app import ServerSettings, create_app
from .connections import (ConnectionGuard, ConnectionPlan, GuardedH11Protocol, RateLimitedLog, open_files_limit,
                          plan_connections, quiet_accept_errors)
from .gate import Door

log = logging.getLogger(__name__)

ENDING_SECONDS = 1.0  # after the grace: time for the handlers still inside to end their clients properly


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, door: Door, grace_seconds: float, warnings: RateLimitedLog):
        super().__init__(config)
        self.door = door
        self.grace_seconds = grace_seconds
        self.warnings = warnings
        self._drain_started: float | None = None

    async def startup(self, sockets=None) -> None:
        quiet_accept_errors(asyncio.get_running_loop(), self.warnings)
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self._drain_started is not None:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        # Not recorded as a captured signal, so uvicorn does not re-raise it after the shutdown:
        # a drained exit is a clean one (status 0).
        self._drain_started = time.monotonic()
        self.door.draining = True
        log.info("signal %s: draining, %d requests in flight, grace %.0f s", signal.Signals(sig).name,
                 self.door.inside, self.grace_seconds)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_started is not None and not self.should_exit:
            waited = time.monotonic() - self._drain_started
            if self.door.inside == 0:
                log.info("drained; shutting down")
                self.should_exit = True
            elif waited > self.grace_seconds and not self.door.grace_over.is_set():
                log.info("grace over: ending %d requests and sessions still in flight", self.door.inside)
                self.door.grace_over.set()
            elif waited > self.grace_seconds + ENDING_SECONDS:
                log.info("%d requests still in flight; shutting down", self.door.inside)
                self.should_exit = self.force_exit = True  # their clients had their grace
        return await super().on_tick(counter)


# Query parameters a log line may show as sent; every other value is replaced (a client may put
# its API key there, although it is refused).
LOGGED_QUERY_PARAMETERS = frozenset({"intent", "model"})


def redacted_path(path: str) -> str:
    """A request path with the values of its query parameters hidden, but the harmless ones."""
    parts = urlsplit(path)
    if not parts.query:
        return path
    query = [(k, v if k in LOGGED_QUERY_PARAMETERS else "REDACTED")
             for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="REDACTED")))


class RedactQueries(logging.Filter):
    """uvicorn logs a WebSocket's path with its query string ('... "WebSocket %s" ...'): hide it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and "WebSocket" in str(record.msg):
            record.args = tuple(redacted_path(a) if isinstance(a, str) and a.startswith("/") else a
                                for a in record.args)
        return True


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.error").addFilter(RedactQueries())
    access = logging.getLogger("asr_service.access")  # already JSON: written as it is
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


# An admitted request may hold one file open: its upload, spooled to disk past 1 MB.
FILES_PER_REQUEST = 1


def connection_plan_for(settings: ServerSettings) -> ConnectionPlan:
    """The connection cap and backlog for ``settings`` (ValueError when the open-files limit
    cannot hold the connections asked for)."""
    return plan_connections(settings.connections.max_connections, FILES_PER_REQUEST,
                            settings.admission.max_pending_requests, open_files_limit())


def serve(settings: ServerSettings, host: str, port: int, log_level: str, grace_seconds: float,
          plan: ConnectionPlan) -> int:
    configure_logging(log_level)
    limits = settings.connections
    guard = ConnectionGuard(limits, plan.max_connections)
    app = create_app(settings)
    # access_log off: the request log (request_log.py) writes one JSON line per request instead.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            http=functools.partial(GuardedH11Protocol, guard=guard),
                            backlog=plan.backlog, timeout_keep_alive=limits.keep_alive_s,
                            timeout_graceful_shutdown=5)
    log.info("up to %d connections open at once (accept backlog %d)", plan.max_connections, plan.backlog)
    DrainingServer(config, app.state.server.door, grace_seconds, guard.warnings).run()
    # A forced exit skips the app's own shutdown; the engines' threads must stop before the
    # interpreter does (torch aborts the process when its threads outlive it).
    app.state.server.close()
    return 0
