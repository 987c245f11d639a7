"""The OpenAI-compatible HTTP service (FastAPI, SSE via sse-starlette)."""
