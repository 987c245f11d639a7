"""API keys: with keys configured, every route but /health and the page's static files needs one.

HTTP clients send ``Authorization: Bearer <key>`` (what the OpenAI SDK sends). WebSocket clients
may also use the form browsers need, since they cannot set headers: the subprotocol
``openai-insecure-api-key.<key>`` (as OpenAI's realtime JavaScript client sends it). Keys are
compared with ``hmac.compare_digest`` against every configured key, so neither the time taken
nor an early exit tells how much of a guess was right. Keys are never logged: no log line
carries headers, and no key form goes in the URL (uvicorn logs WebSocket paths with their
query strings).
"""

from __future__ import annotations

import hmac
import os

KEY_SUBPROTOCOL = "openai-insecure-api-key."
ENV_VAR = "ASR_API_KEYS"  # comma-separated


def keys_from(cli_keys: list[str] | None, environ=os.environ) -> tuple[str, ...]:
    keys = list(cli_keys or [])
    keys += [k.strip() for k in environ.get(ENV_VAR, "").split(",") if k.strip()]
    return tuple(dict.fromkeys(keys))


class ApiKeys:
    def __init__(self, keys: tuple[str, ...]):
        self._keys = tuple(k.encode() for k in keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def accepts(self, presented: str | None) -> bool:
        """``presented`` is a header value as ASGI servers give it (its bytes decoded as latin-1):
        its bytes are compared with the UTF-8 bytes of each key, so a non-ASCII key works as
        clients send it (UTF-8)."""
        if not self._keys:
            return True
        try:
            candidate = (presented or "").encode("latin-1")  # the bytes as sent
        except UnicodeEncodeError:  # not from a header's bytes
            candidate = (presented or "").encode()
        match = False
        for key in self._keys:  # no early exit: the time taken does not depend on which key matched
            match |= hmac.compare_digest(candidate, key)
        return match and bool(presented)


def bearer_token(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def websocket_key(headers: dict[bytes, bytes], subprotocols: list[str]) -> str | None:
    token = bearer_token(headers)
    if token:
        return token
    for protocol in subprotocols:
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL):]
    return None


def unauthorized_message(presented: bool) -> str:
    return "Incorrect API key provided." if presented else "Missing API key: send 'Authorization: Bearer <key>'."
