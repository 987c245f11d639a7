"""One JSON log line per request or WebSocket session, with a request id (an ASGI middleware).

The id is the client's ``X-Request-Id`` when it is a plain token, else a new one; it comes back
in the ``X-Request-Id`` response header (and on a WebSocket's accept). The same pass counts the
request in the metrics. Lines carry no headers and no query string, so no API key reaches the
log.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from .metrics import ServerMetrics, endpoint_label

access_log = logging.getLogger("asr_service.access")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_of(scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _CLIENT_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


class RequestLog:
    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())
        outcome = {"status": None}
        start = time.monotonic()

        async def send_with_id(message):
            kind = message["type"]
            if kind == "http.response.start":
                outcome["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), header]}
            elif kind == "websocket.accept":
                outcome["status"] = 101
                message = {**message, "headers": [*message.get("headers", []), header]}
            elif kind == "websocket.close":
                outcome["close_code"] = message.get("code", 1000)
                outcome["status"] = outcome["status"] or 403  # closed before the handshake finished
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            outcome["status"] = outcome["status"] or 500
            raise
        finally:
            seconds = time.monotonic() - start
            endpoint = endpoint_label(scope["path"])
            status = outcome["status"] or 499  # the client left before any response
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            line = {"request_id": request_id, "type": scope["type"], "method": scope.get("method", "GET"),
                    "path": scope["path"], "status": status, "duration_ms": round(seconds * 1000, 1),
                    "client": (scope.get("client") or ("", 0))[0]}
            if "close_code" in outcome:
                line["close_code"] = outcome["close_code"]
            access_log.info(json.dumps(line))
