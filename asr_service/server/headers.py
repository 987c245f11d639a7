"""Response headers that make the browser safe about what it gets (an ASGI middleware).

Every HTTP answer says ``X-Content-Type-Options: nosniff`` (a JSON error or a transcript is never
sniffed into HTML or script) and may not be framed (``X-Frame-Options``, CSP ``frame-ancestors``),
so the page cannot be clickjacked. The Content-Security-Policy is the page's: its scripts,
styles and worklet come from this server only (no inline code), it talks only to this server
(fetch and the realtime WebSocket), and it plays back what the user picked (blob: URLs).
"""

from __future__ import annotations

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                           "media-src 'self' blob:; connect-src 'self'; worker-src 'self'; object-src 'none'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"referrer-policy", b"no-referrer"))


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(header for header in SECURITY_HEADERS if header[0] not in names)]
            await send(message)

        await self.app(scope, receive, with_headers)
