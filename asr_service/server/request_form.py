"""Multipart form -> validated transcription request, exactly as the OpenAI SDK sends it.

Lists arrive as ``timestamp_granularities[]`` / ``include[]`` (bare names accepted too) and
booleans as "true"/"false". Each bad field becomes a 400 that names it. Beyond OpenAI's fields,
the decode options of faster-whisper and vLLM users know are accepted under their names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile

from adapters.base import TranscriptionAdapter, UnsupportedLanguageError

from ..fallback import QualityThresholds
from ..formats import RESPONSE_FORMATS, TIMED_FORMATS
from ..transcription import TranscriptionOptions
from .errors import OpenAIError

STREAM_FORMATS = ("openai", "chunk")


@dataclass
class TranscriptionRequest:
    file: UploadFile
    model: str | None
    response_format: str
    options: TranscriptionOptions
    stream: bool
    stream_format: str
    stream_include_usage: bool


def _bad(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _list(form: FormData, name: str) -> list[str]:
    return [str(v) for v in form.getlist(f"{name}[]") + form.getlist(name)]


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        return None
    value = str(value).strip()
    return value or None


def _bool(form: FormData, name: str, default: bool = False) -> bool:
    value = _text(form, name)
    if value is None:
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise _bad(name, f"{name} must be 'true' or 'false', got {value!r}")


def _number(form: FormData, name: str, kind, low=None, high=None):
    value = _text(form, name)
    if value is None:
        return None
    try:
        number = kind(value)
    except ValueError:
        raise _bad(name, f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}") from None
    if not math.isfinite(number):  # float() takes "nan" and "inf"
        raise _bad(name, f"{name} must be a finite number, got {value!r}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise _bad(name, f"{name} must be between {low} and {high}, got {value}")
    return number


def _or(value, default):
    return default if value is None else value


def parse_transcription_form(form: FormData, adapter: TranscriptionAdapter, task: str) -> TranscriptionRequest:
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise _bad("file", "A 'file' field with the audio is required (multipart/form-data).", code="missing_required_parameter")

    response_format = _text(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise _bad("response_format", f"Unsupported response_format {response_format!r}; supported: {', '.join(RESPONSE_FORMATS)}",
                   code="unsupported_value")

    try:
        language = adapter.validate_language(_text(form, "language"))
    except UnsupportedLanguageError as e:
        raise _bad("language", str(e), code="unsupported_language") from None

    if task == "translate":
        to_language = _text(form, "to_language")
        if to_language is not None and to_language.lower() != "en":
            raise _bad("to_language", f"Translations are into English only; to_language {to_language!r} is not supported",
                       code="unsupported_value")

    granularities = _list(form, "timestamp_granularities")
    for g in granularities:
        if g not in ("segment", "word"):
            raise _bad("timestamp_granularities", f"Unknown timestamp granularity {g!r}; use 'segment' or 'word'")
    word_timestamps = "word" in granularities
    if granularities and response_format != "verbose_json":
        raise _bad("timestamp_granularities", "timestamp_granularities needs response_format 'verbose_json'",
                   code="unsupported_value")
    if word_timestamps and not adapter.supports_word_timestamps:
        raise _bad("timestamp_granularities", "This model cannot time words; use 'segment'", code="unsupported_value")
    for item in _list(form, "include"):
        raise _bad("include", f"include[]={item!r} is not supported by this server", code="unsupported_value")

    stream = _bool(form, "stream")
    stream_format = _text(form, "stream_format") or "openai"
    if stream_format not in STREAM_FORMATS:
        raise _bad("stream_format", f"stream_format must be one of {', '.join(STREAM_FORMATS)}")
    if stream and response_format not in ("json", "text"):
        raise _bad("stream", f"Streaming returns text events; use response_format json or text, not {response_format!r}",
                   code="unsupported_value")

    beams = 1
    if _bool(form, "use_beam_search"):
        beams = _number(form, "n", int, 1, 8) or 5  # faster-whisper's default beam size
    if beams > 1 and stream:
        raise _bad("use_beam_search", "Beam search picks the best beam at the end; it cannot stream. Use stream=false",
                   code="unsupported_value")
    top_k = _number(form, "top_k", int, -1, 100000)
    defaults = QualityThresholds()
    thresholds = QualityThresholds(
        compression_ratio=_or(_number(form, "compression_ratio_threshold", float, 0.0, 1000.0), defaults.compression_ratio),
        log_prob=_or(_number(form, "log_prob_threshold", float, -1000.0, 0.0), defaults.log_prob),
        no_speech=_or(_number(form, "no_speech_threshold", float, 0.0, 1.0), defaults.no_speech),
    )
    max_tokens = _number(form, "max_completion_tokens", int, 1, 100000)
    options = TranscriptionOptions(
        task=task,
        language=language,
        timestamps=response_format in TIMED_FORMATS,
        previous_text=_text(form, "prompt"),
        temperature=_number(form, "temperature", float, 0.0, 1.0) or 0.0,
        top_k=top_k if top_k and top_k > 0 else None,  # vLLM's -1 (or 0) means "off"
        top_p=_number(form, "top_p", float, 0.0, 1.0),
        seed=_number(form, "seed", int, 0, 2**63 - 1),
        max_new_tokens=max_tokens,
        thresholds=thresholds,
        fallback_temperatures=TranscriptionOptions.fallback_temperatures if _bool(form, "temperature_fallback", True) else (),
        detect_language_per_chunk=_bool(form, "detect_language_per_chunk"),
        condition_on_previous_text=_bool(form, "condition_on_previous_text"),
        hotwords=_text(form, "hotwords"),
        vad_filter=_bool(form, "vad_filter", True),
        word_timestamps=word_timestamps,
        beam_size=beams,
        length_penalty=_number(form, "length_penalty", float, 0.0, 10.0),
    )
    return TranscriptionRequest(
        file=file,
        model=_text(form, "model"),
        response_format=response_format,
        options=options,
        stream=stream,
        stream_format=stream_format,
        stream_include_usage=_bool(form, "stream_include_usage"),
    )
