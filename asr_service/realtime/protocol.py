"""The two wire dialects of /v1/realtime: session settings in, session events out as JSON.

- vLLM's: ``session.update`` {model, language, prompt}; the client's first
  ``input_audio_buffer.commit`` starts the session, ``commit`` {final: true} ends the input;
  the server sends ``transcription.delta`` {delta}, ``transcription.done`` {text, usage} and
  ``error`` {error, code}. Audio is PCM16 at 16 kHz.
- OpenAI's transcription session (``?intent=transcription``, or ``session.update`` with
  ``session.type: "transcription"``, or the older ``transcription_session.update``): audio
  formats audio/pcm at 24 kHz, audio/pcmu, audio/pcma; server VAD on by default; events
  ``input_audio_buffer.committed/cleared/speech_started/speech_stopped`` and
  ``conversation.item.input_audio_transcription.delta/completed/failed``; ``error`` carries an
  object {type, code, message, param, event_id}.

Both dialects may set ``turn_detection`` (OpenAI's server_vad object, or null) and, where they
set ``language``, ``allowed_languages`` (ours, as the HTTP form's): a list of codes detection
then chooses among.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from adapters.base import TranscriptionAdapter

from .events import (Cleared, Committed, Completed, Failed, SessionError, SessionEvent, SpeechStarted, SpeechStopped,
                     TextDelta)
from .input_audio import InputAudioError, InputFormat, parse_format
from .session import SessionConfig
from .turn_detection import TurnDetectionSettings

VLLM = "vllm"
OPENAI = "openai"

VLLM_DEFAULTS = SessionConfig(input_format=InputFormat("audio/pcm", 16000), turn_detection=None)
OPENAI_DEFAULTS = SessionConfig(input_format=InputFormat("audio/pcm", 24000), turn_detection=TurnDetectionSettings())


class ProtocolError(ValueError):
    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


def new_event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


# ---- settings from client events ----

def require_object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"'{param}' must be an object", param=param)
    return value


def _turn_detection(value, param: str) -> TurnDetectionSettings | None:
    if value is None:
        return None
    spec = require_object(value, param)
    kind = spec.get("type", "server_vad")
    if kind != "server_vad":
        raise ProtocolError(f"turn_detection type {kind!r} is not supported; use \"server_vad\" or null",
                            code="unsupported_value", param=f"{param}.type")
    defaults = TurnDetectionSettings()
    try:
        threshold = float(spec.get("threshold", defaults.threshold))
        padding = int(spec.get("prefix_padding_ms", defaults.prefix_padding_ms))
        silence = int(spec.get("silence_duration_ms", defaults.silence_duration_ms))
    except (TypeError, ValueError):
        raise ProtocolError("turn_detection threshold must be a number and the *_ms fields integers",
                            param=param) from None
    if not 0.0 < threshold < 1.0 or not 0 <= padding <= 5000 or not 50 <= silence <= 10000:
        raise ProtocolError("turn_detection needs 0 < threshold < 1, 0 <= prefix_padding_ms <= 5000 and "
                            "50 <= silence_duration_ms <= 10000", param=param)
    return TurnDetectionSettings(threshold, padding, silence)


def _transcription_fields(config: SessionConfig, spec: dict, param: str,
                          adapter: TranscriptionAdapter) -> SessionConfig:
    changes = {}
    if "language" in spec:
        try:
            changes["language"] = adapter.validate_language(spec["language"])
        except ValueError as e:
            raise ProtocolError(str(e), code="unsupported_language", param=f"{param}.language") from None
    if "allowed_languages" in spec:  # ours, as the HTTP form's allowed_languages[]
        codes = spec["allowed_languages"]
        if codes is not None and (not isinstance(codes, list) or not all(isinstance(c, str) for c in codes)):
            raise ProtocolError("'allowed_languages' must be a list of language codes, or null",
                                param=f"{param}.allowed_languages")
        try:
            changes["allowed_languages"] = adapter.validate_language_choices(codes)
        except ValueError as e:
            raise ProtocolError(str(e), code="unsupported_language", param=f"{param}.allowed_languages") from None
    if "model" in spec:
        model = spec["model"]
        if model is not None and not isinstance(model, str):
            raise ProtocolError("'model' must be a string (a served model's name)", param=f"{param}.model")
        changes["model"] = model or None
    if "prompt" in spec:
        prompt = spec["prompt"]
        if prompt is not None and not isinstance(prompt, str):
            raise ProtocolError("'prompt' must be a string", param=f"{param}.prompt")
        changes["prompt"] = prompt or None
    return replace(config, **changes)


def vllm_session_update(config: SessionConfig, event: dict, adapter: TranscriptionAdapter) -> SessionConfig:
    """vLLM's flat ``session.update`` {model, language, prompt, turn_detection}."""
    config = _transcription_fields(config, event, "session", adapter)
    if "turn_detection" in event:
        config = replace(config, turn_detection=_turn_detection(event["turn_detection"], "turn_detection"))
    return config


def _session_fields(config: SessionConfig, block: dict, prefix: str, names: tuple[str, str, str],
                    adapter: TranscriptionAdapter) -> SessionConfig:
    """The (format, transcription, turn detection) fields of one session shape, under their names."""
    format_key, transcription_key, turn_key = names
    try:
        config = replace(config, input_format=parse_format(block.get(format_key), config.input_format))
    except InputAudioError as e:
        raise ProtocolError(str(e), code=e.code, param=f"{prefix}.{format_key}") from None
    if transcription_key in block:
        param = f"{prefix}.{transcription_key}"
        config = _transcription_fields(config, require_object(block[transcription_key] or {}, param), param,
                                       adapter)
    if turn_key in block:
        config = replace(config, turn_detection=_turn_detection(block[turn_key], f"{prefix}.{turn_key}"))
    return config


def openai_session_update(config: SessionConfig, session: dict, adapter: TranscriptionAdapter) -> SessionConfig:
    """OpenAI's ``session.update`` {session: {type: "transcription", audio: {input: {...}}}}."""
    kind = session.get("type", "transcription")
    if kind != "transcription":
        raise ProtocolError(f"Only transcription sessions are served here (session.type {kind!r}); "
                            "set session.type to \"transcription\"", code="unsupported_value", param="session.type")
    audio = require_object(session.get("audio", {}), "session.audio")
    audio_input = require_object(audio.get("input", {}), "session.audio.input")
    return _session_fields(config, audio_input, "session.audio.input", ("format", "transcription", "turn_detection"),
                           adapter)


def legacy_session_update(config: SessionConfig, session: dict, adapter: TranscriptionAdapter) -> SessionConfig:
    """The older ``transcription_session.update`` {session: {input_audio_format, ...}}."""
    return _session_fields(config, session, "session",
                           ("input_audio_format", "input_audio_transcription", "turn_detection"), adapter)


# ---- session descriptions ----

def _transcription_object(config: SessionConfig, model: str) -> dict:
    body = {"model": model, "language": config.language, "prompt": config.prompt}
    if config.allowed_languages:  # ours: shown only when set, so OpenAI's shape stays as it is
        body["allowed_languages"] = list(config.allowed_languages)
    return body

def session_object(session_id: str, config: SessionConfig, model: str) -> dict:
    td = config.turn_detection
    return {
        "type": "transcription", "object": "realtime.transcription_session", "id": session_id,
        "audio": {"input": {
            "format": config.input_format.describe(),
            "transcription": _transcription_object(config, model),
            "turn_detection": td.describe() if td else None,
            "noise_reduction": None,
        }},
        "include": [],
    }


def legacy_session_object(session_id: str, config: SessionConfig, model: str) -> dict:
    legacy_name = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
    td = config.turn_detection
    return {
        "id": session_id, "object": "realtime.transcription_session",
        "input_audio_format": legacy_name[config.input_format.kind],
        "input_audio_transcription": _transcription_object(config, model),
        "turn_detection": td.describe() if td else None,
    }


def session_created(dialect: str, session_id: str, created: int, config: SessionConfig, model: str) -> dict:
    """OpenAI's shape; a connection that may speak vLLM also gets vLLM's ``id`` and ``created``."""
    body = {"type": "session.created", "event_id": new_event_id(), "session": session_object(session_id, config, model)}
    if dialect == VLLM:
        body.update(id=session_id, created=created)
    return body


# ---- events out ----

def error_event(dialect: str, message: str, code: str, param: str | None = None,
                client_event_id: str | None = None) -> dict:
    if dialect == VLLM:
        return {"type": "error", "error": message, "code": code}
    return {"type": "error", "event_id": new_event_id(),
            "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param,
                      "event_id": client_event_id}}


def render(event: SessionEvent, dialect: str) -> dict | None:
    """The wire JSON of a session event; None where the dialect has no such event."""
    if isinstance(event, SessionError):
        return error_event(dialect, event.message, event.code, event.param)
    if dialect == VLLM:
        return _render_vllm(event)
    return _render_openai(event)


def _render_vllm(event: SessionEvent) -> dict | None:
    if isinstance(event, TextDelta):
        return {"type": "transcription.delta", "delta": event.text}
    if isinstance(event, Completed):  # "language" is ours: vLLM's done has no field for it
        return {"type": "transcription.done", "text": event.text, "language": event.language,
                "usage": {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.output_tokens,
                          "total_tokens": event.prompt_tokens + event.output_tokens}}
    if isinstance(event, Failed):
        return {"type": "error", "error": event.message, "code": event.code}
    return None  # VAD and buffer events have no vLLM counterpart


ITEM_EVENT = "conversation.item.input_audio_transcription"


def _render_openai(event: SessionEvent) -> dict:
    head = {"event_id": new_event_id()}
    if isinstance(event, SpeechStarted):
        return {"type": "input_audio_buffer.speech_started", **head, "audio_start_ms": event.audio_start_ms,
                "item_id": event.item_id}
    if isinstance(event, SpeechStopped):
        return {"type": "input_audio_buffer.speech_stopped", **head, "audio_end_ms": event.audio_end_ms,
                "item_id": event.item_id}
    if isinstance(event, Committed):
        return {"type": "input_audio_buffer.committed", **head, "previous_item_id": event.previous_item_id,
                "item_id": event.item_id}
    if isinstance(event, Cleared):
        return {"type": "input_audio_buffer.cleared", **head}
    if isinstance(event, TextDelta):
        return {"type": f"{ITEM_EVENT}.delta", **head, "item_id": event.item_id, "content_index": 0,
                "delta": event.text}
    if isinstance(event, Completed):
        return {"type": f"{ITEM_EVENT}.completed", **head, "item_id": event.item_id, "content_index": 0,
                "transcript": event.text, "usage": {"type": "duration", "seconds": event.seconds},
                "languages": [{"code": event.language}] if event.language else []}
    if isinstance(event, Failed):
        return {"type": f"{ITEM_EVENT}.failed", **head, "item_id": event.item_id, "content_index": 0,
                "error": {"type": "transcription_error", "code": event.code, "message": event.message, "param": None}}
    raise TypeError(f"no OpenAI rendering for {event!r}")
