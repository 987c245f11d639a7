"""The door of the server (an ASGI middleware): API keys, draining at shutdown, and a count of
the requests and sessions inside.

While draining (after SIGTERM) every new request gets 503 "shutting_down" in the OpenAI shape,
/health included so that load balancers stop sending work, while the requests already inside
finish. WebSocket refusals are an ``error`` event and a close, in the dialect the client asked
for, since a browser cannot read an HTTP status from a failed WebSocket handshake.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from starlette.websockets import WebSocket

from ..realtime import protocol
from .auth import ApiKeys, bearer_token, unauthorized_message, websocket_key
from .errors import OpenAIError

OPEN_PATHS = frozenset({"/health", "/"})  # the page's HTML and static files hold no data
OPEN_PREFIXES = ("/page/",)
POLICY_VIOLATION = 1008
GOING_AWAY = 1001
SERVICE_RESTART = 1012
TRY_AGAIN_LATER = 1013  # the server is overloaded or not ready


@dataclass
class Door:
    keys: ApiKeys = field(default_factory=lambda: ApiKeys(()))
    draining: bool = False
    inside: int = 0  # requests and sessions let in and not yet finished
    # Set when the shutdown grace is over: whoever is still inside ends its work and gives its
    # client a proper ending (a 503, an SSE error event and [DONE], a realtime error and close).
    grace_over: asyncio.Event = field(default_factory=asyncio.Event)


GRACE_OVER_MESSAGE = "The server is shutting down and could not finish this work in its grace period; retry"


def offered_subprotocol(scope) -> str | None:
    """The subprotocol to accept: "realtime" when offered (browsers fail a handshake that offers
    subprotocols and gets none back); never the one that carries the key."""
    return "realtime" if "realtime" in scope.get("subprotocols", []) else None


def dialect_of(ws: WebSocket) -> str:
    return protocol.OPENAI if ws.query_params.get("intent") == "transcription" else protocol.VLLM


async def refuse_websocket(ws: WebSocket, message: str, code: str, close_code: int) -> None:
    """Accept, send one ``error`` event in the client's dialect, close: the only refusal a
    browser can read."""
    await ws.accept(subprotocol=offered_subprotocol(ws.scope))
    await ws.send_text(json.dumps(protocol.error_event(dialect_of(ws), message, code)))
    await ws.close(code=close_code, reason=code)


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
                return await refuse_websocket(WebSocket(scope, receive, send), message, "shutting_down", GOING_AWAY)
            return await OpenAIError(503, message, code="shutting_down").response()(scope, receive, send)
        path = scope["path"]
        if self.door.keys.enabled and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            headers = dict(scope.get("headers", []))
            presented = (websocket_key(headers, scope.get("subprotocols", [])) if websocket
                         else bearer_token(headers))
            if not self.door.keys.accepts(presented):
                message = unauthorized_message(presented is not None)
                if websocket:
                    return await refuse_websocket(WebSocket(scope, receive, send), message, "invalid_api_key",
                                                  POLICY_VIOLATION)
                error = OpenAIError(401, message, code="invalid_api_key", type="invalid_request_error",
                                    headers={"WWW-Authenticate": "Bearer"})
                return await error.response()(scope, receive, send)
        self.door.inside += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.door.inside -= 1
