"""Response writers: TranscriptionResult -> json / text / srt / vtt / verbose_json bodies."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from .transcription_types import Segment, TranscriptionResult

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
# Formats that need segment times, so the decode runs with Whisper timestamp tokens.
TIMED_FORMATS = frozenset({"srt", "vtt", "verbose_json", "diarized_json"})
# Formats whose body reports a failed language detection (language null, as SGLang's
# verbose_json does); the others answer a request that got no text that way with an error.
REPORTS_FAILED_DETECTION = frozenset({"verbose_json", "diarized_json"})


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def usage(result: TranscriptionResult) -> dict:
    return {"type": "duration", "seconds": max(1, math.ceil(result.duration))}


def logprobs(result: TranscriptionResult) -> dict:
    """OpenAI's ``logprobs`` field (include[]=logprobs), or nothing when it was not asked for."""
    return {} if result.logprobs is None else {"logprobs": [asdict(t) for t in result.logprobs]}


def to_json(result: TranscriptionResult) -> dict:
    return {"text": result.text, **logprobs(result), "usage": usage(result)}


def to_verbose_json(result: TranscriptionResult, with_segments: bool = True) -> dict:
    """verbose_json. ``with_segments`` False: OpenAI's answer to timestamp_granularities[]=word
    alone, words and no segments."""
    # Beyond OpenAI's segment fields, each segment says its language (chunks of long audio
    # detect their own; see TranscriptionOptions.detect_language_per_chunk).
    # ``speaker`` only when diarization was asked for.
    segments = [{k: v for k, v in asdict(s).items() if k != "speaker" or v is not None} for s in result.segments]
    body = {
        "task": result.task,
        # A translation's language is the output's, as OpenAI's SDK types it (always English);
        # the language heard is kept as source_language.
        "language": "english" if result.task == "translate" else result.language,
        **({"source_language": result.language} if result.task == "translate" else {}),
        "language_probability": result.language_probability,
        "duration": result.duration,
        "text": result.text,
        **({"segments": segments} if with_segments else {}),
        **logprobs(result),
        "usage": usage(result),
    }
    if result.words is not None:
        body["words"] = [asdict(w) for w in result.words]
    return body


def diarized_segment(segment: Segment) -> dict:
    """A segment as OpenAI's ``transcript.text.segment`` (in diarized_json, and as a stream event)."""
    return {"type": "transcript.text.segment", "id": f"seg_{segment.id}", "start": segment.start, "end": segment.end,
            "text": segment.text.strip(), "speaker": segment.speaker}


def to_diarized_json(result: TranscriptionResult) -> dict:
    """OpenAI's diarized_json (the SDK's TranscriptionDiarized): segments with their speakers."""
    return {"task": "transcribe", "duration": result.duration, "text": result.text,
            "segments": [diarized_segment(s) for s in result.segments], "usage": usage(result)}


def to_srt(result: TranscriptionResult) -> str:
    # A speaker, when diarized, opens the cue's text: "A: ..." (the common subtitle convention).
    blocks = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{'' if s.speaker is None else s.speaker + ': '}{s.text.strip()}\n"
        for i, s in enumerate(result.segments, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: TranscriptionResult) -> str:
    # WebVTT's own voice span names the speaker: "<v A>...".
    blocks = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n"
              f"{'' if s.speaker is None else f'<v {s.speaker}>'}{s.text.strip()}\n" for s in result.segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_rttm(result: TranscriptionResult, file_id: str) -> str:
    """NIST RTTM, the diarization tools' exchange format: a SPEAKER line per segment (file id
    and speaker name without whitespace, which separates RTTM's fields; channel 1, onset and
    duration in seconds)."""
    def field(text: str, default: str) -> str:
        return "_".join(text.split()) or default

    file_id = field(file_id, "audio")
    return "".join(f"SPEAKER {file_id} 1 {s.start:.3f} {s.end - s.start:.3f} <NA> <NA> {field(s.speaker or '', '<NA>')} "
                   "<NA> <NA>\n" for s in result.segments)


def render(result: TranscriptionResult, response_format: str) -> str:
    """The response body as text (JSON formats serialised)."""
    if response_format == "json":
        return json.dumps(to_json(result), ensure_ascii=False)
    if response_format == "verbose_json":
        return json.dumps(to_verbose_json(result), ensure_ascii=False)
    if response_format == "diarized_json":
        return json.dumps(to_diarized_json(result), ensure_ascii=False)
    if response_format == "text":
        return result.text + "\n"
    if response_format == "srt":
        return to_srt(result)
    if response_format == "vtt":
        return to_vtt(result)
    raise ValueError(f"unsupported response_format {response_format!r}; supported: {', '.join(RESPONSE_FORMATS)}")
