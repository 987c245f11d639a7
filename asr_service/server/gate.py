"""The door of the server (an ASGI middleware): API keys, draining at shutdown, and a count of
the requests and sessions inside.

While draining (after SIGTERM) every new request gets 503 "shutting_down" in the OpenAI shape,
/health included so that load balancers stop sending work, while the requests already inside
finish. WebSocket refusals are an ``error`` event and a close, in the dialect the client asked
for, since a browser cannot read an HTTP status from a failed WebSocket handshake.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..realtime import protocol
from .auth import ApiKeys, bearer_token, unauthorized_body, websocket_key

OPEN_PATHS = frozenset({"/health", "/"})  # the page's HTML and static files hold no data
OPEN_PREFIXES = ("/page/",)
POLICY_VIOLATION = 1008
GOING_AWAY = 1001


@dataclass
class Door:
    keys: ApiKeys = field(default_factory=lambda: ApiKeys(()))
    draining: bool = False
    inside: int = 0  # requests and sessions let in and not yet finished


def offered_subprotocol(scope) -> str | None:
    """The subprotocol to accept: "realtime" when offered (browsers fail a handshake that offers
    subprotocols and gets none back); never the one that carries the key."""
    return "realtime" if "realtime" in scope.get("subprotocols", []) else None


async def refuse_websocket(receive, send, scope, message: str, code: str, close_code: int) -> None:
    dialect = protocol.OPENAI if b"intent=transcription" in scope.get("query_string", b"") else protocol.VLLM
    await receive()  # websocket.connect
    await send({"type": "websocket.accept", "subprotocol": offered_subprotocol(scope)})
    await send({"type": "websocket.send", "text": json.dumps(protocol.error_event(dialect, message, code))})
    await send({"type": "websocket.close", "code": close_code, "reason": code})


async def respond(send, status: int, body: bytes, extra_headers: list | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app, door: Door):
        self.app = app
        self.door = door

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        websocket = scope["type"] == "websocket"
        if self.door.draining:
            message = "Server is shutting down and takes no new requests; retry on another instance."
            if websocket:
                return await refuse_websocket(receive, send, scope, message, "shutting_down", GOING_AWAY)
            body = json.dumps({"error": {"message": message, "type": "service_unavailable", "param": None,
                                         "code": "shutting_down"}}).encode()
            return await respond(send, 503, body)
        path = scope["path"]
        if self.door.keys.enabled and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            headers = dict(scope.get("headers", []))
            presented = (websocket_key(headers, scope.get("subprotocols", [])) if websocket
                         else bearer_token(headers))
            if not self.door.keys.accepts(presented):
                if websocket:
                    error = json.loads(unauthorized_body(presented is not None))["error"]["message"]
                    return await refuse_websocket(receive, send, scope, error, "invalid_api_key", POLICY_VIOLATION)
                return await respond(send, 401, unauthorized_body(presented is not None),
                                     [(b"www-authenticate", b"Bearer")])
        self.door.inside += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.door.inside -= 1
