"""Multipart form -> validated transcription request, exactly as the OpenAI SDK sends it.

Lists arrive as ``timestamp_granularities[]`` / ``include[]`` (bare names accepted too) and
booleans as "true"/"false". Each bad field becomes a 400 that names it. The decode options are
the table in request_options (the same the CLI reads), under the names faster-whisper and vLLM
users know.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile

from adapters.base import TranscriptionAdapter

from ..formats import RESPONSE_FORMATS
from ..request_options import OPTIONS, DiarizationOptions, Option, OptionError, build_diarization, build_options
from ..transcription_types import TranscriptionOptions
from .errors import OpenAIError

STREAM_FORMATS = ("openai", "chunk")
# verbose_json streams here (not at OpenAI): deltas as the text is decoded, then a done event
# that also carries verbose_json's fields (server/sse.py), which is what the page reads.
STREAMED_FORMATS = ("json", "text", "verbose_json", "diarized_json")
# Fields of the HTTP response rather than of the decode: the form alone has them.
OPTION_STREAM = Option("stream", bool, "stream text events")
OPTION_INCLUDE_USAGE = Option("stream_include_usage", bool, "a usage chunk at the end")
OPTION_CONTINUOUS_USAGE = Option("stream_continuous_usage_stats", bool, "the usage so far on every chunk")


@dataclass
class TranscriptionRequest:
    file: UploadFile
    response_format: str
    options: TranscriptionOptions
    stream: bool
    stream_format: str
    stream_include_usage: bool
    stream_continuous_usage_stats: bool = False
    diarization: DiarizationOptions | None = None  # who spoke when, with the transcript
    # verbose_json's segments: OpenAI leaves them out when timestamp_granularities names
    # "word" alone (the default granularity is "segment").
    with_segments: bool = True


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


def _object_fields(form: FormData, name: str) -> dict[str, str]:
    """An object field as the OpenAI SDK sends it in a form: ``name[key]=value`` per key."""
    prefix = name + "["
    return {key[len(prefix) : -1]: str(value) for key, value in form.multi_items()
            if key.startswith(prefix) and key.endswith("]") and not isinstance(value, UploadFile)}


def _values(form: FormData) -> dict[str, object]:
    """Every option the form gives, typed (OptionError for a bad one)."""
    values: dict[str, object] = {}
    for option in OPTIONS:
        if option.kind is list:
            items = [option.parse(v) for v in _list(form, option.name)]
            values[option.name] = items or None
        elif option.kind is dict and (fields := _object_fields(form, option.name)):
            values[option.name] = fields
        else:
            text = _text(form, option.name)
            values[option.name] = None if text is None else option.parse(text)
    return values


def reference_from_data_url(reference: str) -> bytes:
    """A known speaker's reference clip as the HTTP form carries it: a base64 data URL and
    nothing else. A value from the network is data, never a path: whatever else it holds is
    refused without looking at the server's files (the command line, cli.py, reads files). Its
    size is bounded by the form parser's limit on a field."""
    if not reference.startswith("data:"):
        raise OptionError("known_speaker_references", "Over HTTP a reference is a base64 data URL "
                                                      "(data:audio/wav;base64,...); file paths are read by the "
                                                      "command line only")
    header, _, payload = reference.partition(",")
    if not header.endswith(";base64"):
        raise OptionError("known_speaker_references", "A reference must be a base64 data URL "
                                                      "(data:audio/wav;base64,...)")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error:
        raise OptionError("known_speaker_references", "A reference's base64 data does not decode") from None
    if not data:
        raise OptionError("known_speaker_references", "A reference's data is empty")
    return data


def model_named(form: FormData) -> str | None:
    """The served model the request names (None: the server's default)."""
    return _text(form, "model")


def _response_format(form: FormData, task: str) -> str:
    """The response format asked for (json by default); a translation's target, if named, must
    be English."""
    response_format = _text(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise _bad("response_format", f"Unsupported response_format {response_format!r}; supported: "
                                      f"{', '.join(RESPONSE_FORMATS)}", code="unsupported_value")
    if task == "translate":
        to_language = _text(form, "to_language")
        if to_language is not None and to_language.lower() != "en":
            raise _bad("to_language", f"Translations are into English only; to_language {to_language!r} is not "
                                      "supported", code="unsupported_value")
    return response_format


def parse_transcription_form(form: FormData, adapter: TranscriptionAdapter, task: str,
                             detection: str = "fused", default_stream_format: str = "openai",
                             default_beam_size: int = 1) -> TranscriptionRequest:
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise _bad("file", "A 'file' field with the audio is required (multipart/form-data).",
                   code="missing_required_parameter")

    response_format = _response_format(form, task)
    try:
        stream = OPTION_STREAM.parse(_text(form, "stream") or "false")
        stream_format = _text(form, "stream_format") or default_stream_format
        if stream_format not in STREAM_FORMATS:
            raise OptionError("stream_format", f"stream_format must be one of {', '.join(STREAM_FORMATS)}")
        if stream and response_format not in STREAMED_FORMATS:
            raise OptionError("stream", f"Streaming returns text events; use response_format "
                                        f"{', '.join(STREAMED_FORMATS)}, not {response_format!r}",
                              code="unsupported_value")
        if stream and response_format == "verbose_json" and stream_format == "chunk":
            raise OptionError("stream_format", "stream_format=chunk has no place for segments and words; a "
                                               "verbose_json stream is OpenAI's (stream_format=openai)",
                              code="unsupported_value")
        values = _values(form)
        diarization = build_diarization(values, task, response_format, reference_from_data_url)
        if diarization is not None and stream and stream_format == "chunk":
            raise OptionError("stream_format", "stream_format=chunk has no place for speakers; a diarized stream "
                                               "is OpenAI's (stream_format=openai)", code="unsupported_value")
        options = build_options(values, adapter, task, response_format, detection,
                                diarized=diarization is not None, default_beam_size=default_beam_size)
        if options.token_logprobs and stream and stream_format == "chunk":
            raise OptionError("include", "include[]=logprobs streams in OpenAI's events (the done event carries "
                                         "them); stream_format=chunk has no place for them", code="unsupported_value")
        include_usage = OPTION_INCLUDE_USAGE.parse(_text(form, "stream_include_usage") or "false")
        continuous_usage = OPTION_CONTINUOUS_USAGE.parse(_text(form, "stream_continuous_usage_stats") or "false")
        if continuous_usage and not (stream and stream_format == "chunk"):
            raise OptionError("stream_continuous_usage_stats", "stream_continuous_usage_stats puts usage on every "
                                                               "chunk of a stream_format=chunk stream; this request "
                                                               "is not one", code="unsupported_value")
    except OptionError as e:
        raise _bad(e.param, str(e), e.code) from None
    granularities = values["timestamp_granularities"] or ["segment"]
    return TranscriptionRequest(file=file, response_format=response_format,
                                options=options, stream=stream, stream_format=stream_format,
                                stream_include_usage=include_usage, stream_continuous_usage_stats=continuous_usage,
                                diarization=diarization, with_segments="segment" in granularities)
