"""/v1/realtime: one WebSocket connection = one RealtimeSession.

The receive loop turns client events into session actions; a sender task writes the
session's events in order; the session's worker decodes. Any bad event is answered with an
``error`` event and the session goes on. A client that goes away (or stays silent past the
idle timeout with nothing left to transcribe) ends the session, and cancelling its worker
frees its engine slots at the next decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from ..realtime import protocol
from ..realtime.input_audio import InputAudioDecoder, InputAudioError
from ..realtime.protocol import OPENAI, VLLM, ProtocolError
from ..realtime.events import Completed
from ..realtime.session import RealtimeLimits, RealtimeSession, SessionConfig
from ..request_options import build_options
from .errors import OpenAIError, clipped
from .gate import (GRACE_OVER_MESSAGE, POLICY_VIOLATION, SERVICE_RESTART, TRY_AGAIN_LATER, Door, dialect_of,
                   offered_subprotocol, refuse_websocket)
from .metrics import ServerMetrics
from .model_pool import Lease
from .state import ServerState

log = logging.getLogger(__name__)

RECEIVE_POLL_S = 0.25  # how often a quiet session looks at its worker, the idle timeout and the shutdown


class RealtimeConnection:
    def __init__(self, ws: WebSocket, lease: Lease, limits: RealtimeLimits, door: Door,
                 metrics: ServerMetrics | None = None):
        self.ws = ws
        self.door = door
        self._close_code = 1000  # normal closure, unless the server ends the session
        self.metrics = metrics
        self.lease = lease
        self.runtime = runtime = lease.runtime
        self.limits = limits
        self.model_name = lease.name
        self.dialect = dialect_of(ws)
        # vLLM's clients start the session with a commit; OpenAI's may send audio at once.
        self.started = self.dialect == OPENAI
        self.session_id = f"sess_{uuid.uuid4().hex[:20]}"
        self._outbox: asyncio.Queue[dict | None] = asyncio.Queue()
        config = protocol.OPENAI_DEFAULTS if self.dialect == OPENAI else protocol.VLLM_DEFAULTS
        file_decode = build_options({}, runtime.adapter, "transcribe", "json",
                                    default_beam_size=runtime.default_beam_size)
        self.session = RealtimeSession(runtime.transcriber, self._emit, file_decode, limits, config)
        self._decoder = InputAudioDecoder(config.input_format)
        # Audio, not housekeeping events, keeps a session from its idle timeout.
        self._opened = self._last_audio = time.monotonic()

    def _emit(self, event) -> None:
        if isinstance(event, Completed) and self.metrics is not None:
            self.metrics.audio_seconds.labels("/v1/realtime").inc(event.seconds)
            self.metrics.redecoded(event.redecodes)
            if self.session.config.language is None:
                self.metrics.detection(event.language)
        body = protocol.render(event, self.dialect)
        if body is not None:
            self._outbox.put_nowait(body)

    def _error(self, message: str, code: str, param: str | None = None, event: dict | None = None) -> None:
        client_id = event.get("event_id") if isinstance(event, dict) else None
        self._outbox.put_nowait(protocol.error_event(self.dialect, message, code, param, client_id))

    async def serve(self) -> None:
        await self.ws.accept(subprotocol=offered_subprotocol(self.ws.scope))
        log.info("realtime session %s opened (%s protocol)", self.session_id, self.dialect)
        sender = asyncio.create_task(self._send_loop())
        worker = asyncio.create_task(self.session.run())
        self._outbox.put_nowait(protocol.session_created(self.dialect, self.session_id, int(time.time()),
                                                         self.session.config, self.model_name))
        try:
            await self._receive_loop(worker)
        finally:
            worker.cancel()  # a departed client's decodes stop here
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker
            self._outbox.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sender, timeout=5)
            if self.ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await self.ws.close(code=self._close_code)
            log.info("realtime session %s closed", self.session_id)

    async def _receive_loop(self, worker: asyncio.Task) -> None:
        while not self._must_end():
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout=RECEIVE_POLL_S)
            except TimeoutError:
                if self._ended_while_quiet(worker):
                    return
                continue
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            event = self._event_in(message)
            if event is None:
                continue
            try:
                await self._handle(event)
            except (ProtocolError, InputAudioError) as e:
                self._error(str(e), e.code, e.param, event)
            except Exception as e:  # a bug, not the client's fault: say so, keep the session
                log.exception("realtime session %s: %s failed", self.session_id, event["type"])
                self._error(f"Internal error handling {event['type']}: {type(e).__name__}", "internal_error",
                            event=event)

    def _must_end(self) -> bool:
        """The session ends now (the reason sent): a shutdown's grace is over, or it is too old."""
        if self.door.grace_over.is_set():  # end the session properly
            self._error(GRACE_OVER_MESSAGE, "shutting_down")
            self._close_code = SERVICE_RESTART
            return True
        if time.monotonic() - self._opened > self.limits.max_session_seconds:
            self._error(f"Session closed: it reached the maximum length of {self.limits.max_session_seconds:g} s; "
                        "open a new one", "session_expired")
            return True
        return False

    def _ended_while_quiet(self, worker: asyncio.Task) -> bool:
        """Nothing came from the client for a poll: the session ends (the reason sent) if its
        worker failed, or if it has been idle past the limit."""
        if worker.done():  # only cancellation ends it normally: say why the session ends
            error = worker.exception()
            log.error("realtime session %s: worker failed", self.session_id, exc_info=error)
            self._error(f"Internal error, session closed: {type(error).__name__}", "internal_error")
            return True
        quiet = time.monotonic() - self._last_audio
        if quiet > self.limits.idle_timeout_s and self.session.idle:
            self._error(f"Session closed after {self.limits.idle_timeout_s:g} s without audio from the client",
                        "idle_timeout")
            return True
        return False

    def _event_in(self, message: dict) -> dict | None:
        """The client event a frame holds, or None (an error event sent) when it holds none."""
        if message.get("text") is None:
            self._error("Binary frames are not accepted; send JSON text events (audio as base64 in "
                        "input_audio_buffer.append)", "invalid_event")
            return None
        try:
            event = json.loads(message["text"])
        except json.JSONDecodeError as e:
            self._error(f"Event is not valid JSON: {e}", "invalid_json")
            return None
        except RecursionError:  # json's decoder recurses once per nesting level
            self._error("Event is not valid JSON: nested too deeply", "invalid_json")
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self._error("Event must be a JSON object with a string 'type'", "invalid_event", param="type")
            return None
        return event

    async def _handle(self, event: dict) -> None:
        kind = event["type"]
        if kind == "session.update":
            self._update_session(event)
        elif kind == "transcription_session.update":
            self._switch_to(OPENAI)
            session = protocol.require_object(event.get("session", {}), "session")
            self._apply(protocol.legacy_session_update(self.session.config, session, self.runtime.adapter))
            self._outbox.put_nowait({"type": "transcription_session.updated", "event_id": protocol.new_event_id(),
                                     "session": protocol.legacy_session_object(self.session_id, self.session.config,
                                                                               self.model_name)})
        elif kind == "input_audio_buffer.append":
            if not self.started:
                raise ProtocolError("Audio before the session started: send input_audio_buffer.commit first "
                                    "(vLLM protocol), or connect with ?intent=transcription", "session_not_started")
            await self.session.append(self._decoder.decode(event.get("audio")))
            self._last_audio = time.monotonic()
        elif kind == "input_audio_buffer.commit":
            final = event.get("final") is True
            if not self.started:
                self.started = True  # vLLM: the first commit of a cycle says "ready", it commits nothing
                self.session.reopen()  # the cycle before, if any, ended with a final commit
                if not final:
                    return
            self.session.commit(final=final)
            if final and self.dialect == VLLM:
                self.started = False  # vLLM: the next commit starts a new cycle on this connection
        elif kind == "input_audio_buffer.clear":
            self.session.clear()
        else:
            raise ProtocolError(f"Unknown or unsupported event type {kind!r}; this endpoint takes session.update, "
                                "transcription_session.update and input_audio_buffer.append/commit/clear",
                                "unknown_event", "type")

    def _update_session(self, event: dict) -> None:
        if "session" in event:  # OpenAI's shape
            self._switch_to(OPENAI)
            session = protocol.require_object(event["session"], "session")
            self._apply(protocol.openai_session_update(self.session.config, session, self.runtime.adapter))
            self._outbox.put_nowait({"type": "session.updated", "event_id": protocol.new_event_id(),
                                     "session": protocol.session_object(self.session_id, self.session.config,
                                                                        self.model_name)})
        else:  # vLLM's flat shape; vLLM answers nothing
            if self.dialect != VLLM:
                raise ProtocolError("session.update needs a 'session' object in a transcription session",
                                    param="session")
            self._apply(protocol.vllm_session_update(self.session.config, event, self.runtime.adapter))

    def _switch_to(self, dialect: str) -> None:
        """A connection without ?intent=transcription turns OpenAI on its first OpenAI-shaped update."""
        if dialect == self.dialect:
            return
        if self.started or self.session.buffered_seconds:
            raise ProtocolError("This session already speaks the vLLM protocol; open a new connection with "
                                "?intent=transcription for an OpenAI transcription session", param="type")
        self.dialect, self.started = dialect, True
        self._apply(protocol.OPENAI_DEFAULTS)

    def _apply(self, config: SessionConfig) -> None:
        names = self.lease.model.entry.names
        if config.model is not None and config.model not in names:
            raise ProtocolError(f"This session transcribes with '{self.model_name}'; a session's model is chosen "
                                f"when it connects: reconnect with ?model={clipped(config.model)}", code="model_not_found",
                                param="model")
        if config.input_format != self._decoder.format:
            self._decoder = InputAudioDecoder(config.input_format)
        try:
            self.session.configure(config)
        except ValueError as e:
            raise ProtocolError(str(e), code="unsupported_value") from None

    async def _send_loop(self) -> None:
        while (body := await self._outbox.get()) is not None:
            try:
                await self.ws.send_text(json.dumps(body, ensure_ascii=False))
            except Exception:  # the client is gone: the receive loop sees it too
                return


async def realtime_endpoint(ws: WebSocket, state: ServerState) -> None:
    """A session on the model ``?model=`` names (the default when absent)."""
    if not state.ready:
        await refuse_websocket(ws, f"Service not ready: {state.not_ready_reason}. Retry shortly.", "not_ready",
                               TRY_AGAIN_LATER)
        return
    slots = state.realtime_slots
    if not slots.take():
        await refuse_websocket(ws, f"Too many realtime sessions (limit {slots.limit}); retry later",
                               "too_many_sessions", TRY_AGAIN_LATER)
        return
    try:
        try:
            lease = await state.models.lease(ws.query_params.get("model"))
        except OpenAIError as e:
            await refuse_websocket(ws, e.message, e.code, TRY_AGAIN_LATER if e.status == 503 else POLICY_VIOLATION)
            return
        try:
            await RealtimeConnection(ws, lease, state.settings.realtime, state.door, state.metrics).serve()
        finally:
            lease.release()
    except Exception:
        log.exception("realtime session failed")
    finally:
        slots.give_back()
