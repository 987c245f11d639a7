"""Every error leaves the server in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}


ECHO_LIMIT = 100  # characters of a client's value quoted back in an error message


def clipped(value: str) -> str:
    """A client's value cut to a readable length for an error message (a 100,000-character model
    name is not sent back whole)."""
    return value if len(value) <= ECHO_LIMIT else value[:ECHO_LIMIT] + f"... ({len(value)} characters)"


def echoed(value: str) -> str:
    """A client's value as an error message quotes it: clipped, then repr'd."""
    return repr(clipped(value))


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers or self.headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return OpenAIError(exc.status_code, str(exc.detail), code=str(exc.status_code)).response(
            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", []) if p not in ("body", "query")]
        return OpenAIError(400, f"{'.'.join(loc) or 'request'}: {first.get('msg', 'invalid request')}",
                           param=loc[-1] if loc else None, code="invalid_value").response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unhandled error")
        return OpenAIError(500, f"Internal server error: {type(exc).__name__}", code="internal_error").response()
