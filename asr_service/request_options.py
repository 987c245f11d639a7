"""The decode options a request may set, defined once for every entry point.

The HTTP form (server/request_form.py) and the command line (cli.py) read the same table,
under the same names (the CLI spells them as flags: ``top_p`` is ``--top-p``), and hand what
they read to ``build_options``, which checks how options combine and makes the
TranscriptionOptions. So every option exists in both, with one meaning and one set of checks.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from adapters.base import TranscriptionAdapter, UnsupportedLanguageError

from .fallback import QualityThresholds
from .formats import TIMED_FORMATS
from .speech_gate import VadSettings
from .transcription_types import TranscriptionOptions


class OptionError(ValueError):
    """A bad option value or combination; ``param`` names the field."""

    def __init__(self, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Option:
    name: str  # the form field (lists arrive as ``name[]``); the CLI flag is --name with dashes
    kind: type  # str, int, float, bool, list (of str) or dict (a JSON object, or "auto")
    help: str
    low: float | None = None
    high: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str):
        """The typed value of one text value (a list option takes one text per item)."""
        if self.kind is str or self.kind is list:
            return text
        if self.kind is dict:
            return self._object(text)
        if self.kind is bool:
            if text.lower() in ("true", "1"):
                return True
            if text.lower() in ("false", "0"):
                return False
            raise OptionError(self.name, f"{self.name} must be 'true' or 'false', got {text!r}")
        try:
            number = self.kind(text)
        except ValueError:
            raise OptionError(self.name, f"{self.name} must be {'an integer' if self.kind is int else 'a number'}, "
                                         f"got {text!r}") from None
        if not math.isfinite(number):  # float() takes "nan" and "inf"
            raise OptionError(self.name, f"{self.name} must be a finite number, got {text!r}")
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise OptionError(self.name, f"{self.name} must be between {self.low} and {self.high}, got {number}")
        return number

    def _object(self, text: str) -> str | dict:
        if text == "auto":
            return text
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise OptionError(self.name, f"{self.name} must be 'auto' or a JSON object, got {text!r}")
        return value


MAX_SPEAKERS = 32

OPTIONS: tuple[Option, ...] = (
    Option("language", str, "ISO-639-1 code; absent: detected in the same decode as the text"),
    Option("allowed_languages", list, "ISO-639-1 codes: detection chooses only among these"),
    Option("prompt", str, "previous-text context for every chunk"),
    Option("hotwords", str, "words to favour, given to the model as context"),
    Option("temperature", float, "0: greedy (with fallback); above: sampling", 0.0, 1.0),
    Option("top_k", int, "sampling: keep the k most likely tokens (0 or -1: off)", -1, 100000),
    Option("top_p", float, "sampling: keep the smallest set of tokens with this much probability", 0.0, 1.0),
    Option("min_p", float, "sampling: drop tokens less likely than min_p x the most likely one", 0.0, 1.0),
    Option("seed", int, "sampling seed", 0, 2**63 - 1),
    # vLLM's penalties, on every decode (greedy included), as vLLM applies them.
    Option("repetition_penalty", float, "above 1: tokens already in the prompt or text are less likely", 0.01, 10.0),
    Option("frequency_penalty", float, "subtracted from a token's logit once per time it is in the text", -2.0, 2.0),
    Option("presence_penalty", float, "subtracted from the logit of every token already in the text", -2.0, 2.0),
    # No upper bound: vLLM clients send 1e6 and expect the model's own limit to apply (clamped
    # per window in piece_decode.decode_params).
    Option("max_completion_tokens", int, "text tokens per 30 s window at most (above the model's limit: that limit)",
           1, None),
    Option("temperature_fallback", bool, "decode a window again hotter when it fails the thresholds (default true)"),
    Option("compression_ratio_threshold", float, "above: a repetition loop (default 2.4)", 0.0, 1000.0),
    Option("log_prob_threshold", float, "average log-probability below: unreliable (default -1.0)", -1000.0, 0.0),
    Option("no_speech_threshold", float, "no-speech probability above (with low log-prob): silence (default 0.6)",
           0.0, 1.0),
    Option("vad_filter", bool, "skip windows the speech gate hears no speech in (default true)"),
    Option("chunking_strategy", dict, "where long audio is cut: 'auto' (the default), or {\"type\": \"server_vad\"} "
                                      "with threshold, prefix_padding_ms, silence_duration_ms"),
    Option("detect_language_per_chunk", bool, "each 30 s chunk keeps the language it detected"),
    Option("condition_on_previous_text", bool, "condition each chunk on the text of the one before"),
    Option("use_beam_search", bool, "beam search for the temperature-0 decode (default: on, except with the SGLang "
                                    "engine)"),
    Option("n", int, "beams of a beam search (default 5)", 1, 8),
    Option("length_penalty", float, "beam ranking: ((5 + length) / 6) ** penalty (default: divide by length)",
           0.0, 10.0),
    Option("timestamp_granularities", list, "segment (any format) and/or word (verbose_json only)"),
    Option("include", list, "logprobs: each text token with its log-probability (json, verbose_json)"),
    Option("diarize", bool, "label each segment with its speaker (response_format diarized_json implies it)"),
    Option("min_speakers", int, "diarization: at least this many speakers", 1, MAX_SPEAKERS),
    Option("max_speakers", int, "diarization: at most this many speakers", 1, MAX_SPEAKERS),
    Option("known_speaker_names", list, "diarization: the names of the voices in known_speaker_references"),
    Option("known_speaker_references", list, "diarization: a 2-10 s clip of each known speaker (a data URL over "
                                             "HTTP, a file path on the command line)"),
)


@dataclass(frozen=True)
class DiarizationOptions:
    """Who spoke when, asked for with diarized_json or diarize=true (diarization/pipeline.py)."""

    min_speakers: int | None = None
    max_speakers: int | None = None
    known_speakers: tuple[tuple[str, bytes], ...] = ()  # (name, the reference's encoded audio), in order
    keep_words: bool = False  # the request asked for word timestamps (diarization decodes them anyway)


def build_diarization(values: Mapping[str, object], task: str, response_format: str,
                      read_reference: Callable[[str], bytes]) -> DiarizationOptions | None:
    """The request's diarization, or None when it asks for none. Raises OptionError for what
    cannot apply (OpenAI's rules for gpt-4o-transcribe-diarize where they are its).

    ``read_reference`` turns one known_speaker_references value into its encoded audio, and is
    the entry point's own: the HTTP form's takes data URLs only (a value from the network never
    names a file), the command line's reads a file. It runs after every other check, with the
    entry point's bound on the bytes."""
    def given(name: str, default=None):
        value = values.get(name)
        return default if value is None else value

    diarized = response_format == "diarized_json" or given("diarize", False)
    if not diarized:
        for name in ("min_speakers", "max_speakers", "known_speaker_names", "known_speaker_references"):
            if given(name) is not None:
                raise OptionError(name, f"{name} applies to diarization: set response_format=diarized_json or "
                                        "diarize=true", code="unsupported_value")
        return None
    if response_format not in ("diarized_json", "verbose_json", "srt", "vtt"):
        raise OptionError("diarize", f"response_format {response_format!r} has no place for speakers; use "
                                     "diarized_json, verbose_json, srt or vtt", code="unsupported_value")
    if task != "transcribe":
        raise OptionError("response_format", "Diarization transcribes; translations are not diarized",
                          code="unsupported_value")
    if given("prompt") is not None:  # as OpenAI's diarization model
        raise OptionError("prompt", "prompt is not supported with diarization", code="unsupported_value")
    if given("include") is not None:
        raise OptionError("include", "include[]=logprobs is not supported with diarization", code="unsupported_value")
    low, high = given("min_speakers"), given("max_speakers")
    if low is not None and high is not None and low > high:
        raise OptionError("min_speakers", f"min_speakers ({low}) is more than max_speakers ({high})")
    names, references = given("known_speaker_names", []), given("known_speaker_references", [])
    if len(names) != len(references):
        raise OptionError("known_speaker_names", f"known_speaker_names has {len(names)} entries and "
                                                 f"known_speaker_references {len(references)}: one name per reference")
    if len(set(names)) != len(names) or not all(n.strip() for n in names):
        raise OptionError("known_speaker_names", "known_speaker_names must be distinct and non-empty")
    for name in names:
        _check_speaker_name(name)
    if high is not None and len(names) > high:
        raise OptionError("known_speaker_names", f"{len(names)} known speakers is more than max_speakers ({high})")
    if len(names) > MAX_SPEAKERS:
        raise OptionError("known_speaker_names", f"{len(names)} known speakers is more than {MAX_SPEAKERS}")
    clips = tuple((name, read_reference(reference)) for name, reference in zip(names, references))
    return DiarizationOptions(min_speakers=low, max_speakers=high, known_speakers=clips,
                              keep_words="word" in given("timestamp_granularities", []))


MAX_SPEAKER_NAME_LENGTH = 64


def _check_speaker_name(name: str) -> None:
    """A speaker's name is written into srt cues, vtt voice tags and rttm fields: control and
    format characters (a newline would forge a cue), separators other than a space, the markup
    characters < > & and leading or trailing spaces are refused, not escaped away, so the name a
    client gave is the name every format shows."""
    if len(name) > MAX_SPEAKER_NAME_LENGTH:
        raise OptionError("known_speaker_names", f"A speaker name must be at most {MAX_SPEAKER_NAME_LENGTH} characters, "
                                                 f"got {len(name)}")
    bad = sorted({c for c in name if unicodedata.category(c)[0] in "CZ" and c != " " or c in "<>&"})
    if bad or name != name.strip():
        shown = ", ".join(repr(c) for c in bad) or "leading or trailing spaces"
        raise OptionError("known_speaker_names", f"A speaker name may hold letters, digits, punctuation and spaces, "
                                                 f"not {shown} (names go into srt, vtt and rttm as they are)")


def build_options(values: Mapping[str, object], adapter: TranscriptionAdapter, task: str, response_format: str,
                  detection: str = "fused", diarized: bool = False, default_beam_size: int = 1) -> TranscriptionOptions:
    """TranscriptionOptions from parsed ``values`` (option name -> typed value; absent or None:
    not given). Raises OptionError for a bad value or a combination that cannot apply.
    ``default_beam_size``: the beams of a request that does not set use_beam_search (the
    runtime's: 1 where its engine cannot search). Whether the response streams is not an
    option of the decode: a stream is the same decode, released early."""
    given = _Given(values)
    language, candidate_languages = _languages(given, adapter)
    _check_model_can(adapter, task, response_format, diarized)
    word_timestamps = _word_timestamps(given, adapter, response_format)
    token_logprobs = _token_logprobs(given, response_format)
    top_k = given("top_k")
    return TranscriptionOptions(
        task=task,
        language=language,
        candidate_languages=candidate_languages,
        # Every format decodes with timestamps where the model has them (as faster-whisper does):
        # one decode, so json and text hold exactly the words the subtitles do, and every format
        # gets the seek past a window's last segment (transcription.py).
        timestamps=adapter.supports_timestamps,
        previous_text=given("prompt"),
        hotwords=given("hotwords"),
        temperature=given("temperature", 0.0),
        top_k=top_k if top_k and top_k > 0 else None,  # vLLM's -1 (or 0) means "off"
        top_p=given("top_p"),
        min_p=given("min_p", 0.0),
        seed=given("seed"),
        repetition_penalty=given("repetition_penalty", 1.0),
        frequency_penalty=given("frequency_penalty", 0.0),
        presence_penalty=given("presence_penalty", 0.0),
        max_new_tokens=given("max_completion_tokens"),
        thresholds=_thresholds(given),
        fallback_temperatures=(TranscriptionOptions.fallback_temperatures
                               if given("temperature_fallback") in (None, True) else ()),
        detect_language_per_chunk=given("detect_language_per_chunk", False),
        condition_on_previous_text=given("condition_on_previous_text", False),
        vad_filter=given("vad_filter", True),
        vad=_vad_settings(given("chunking_strategy"), given("vad_filter", True)),
        word_timestamps=word_timestamps or diarized,  # each word goes to its speaker
        token_logprobs=token_logprobs,
        beam_size=_beam_size(given, default_beam_size),
        length_penalty=given("length_penalty"),
        detection=detection,
    )


class _Given:
    """An option's value as the request gave it, or ``default`` where it gave none."""

    def __init__(self, values: Mapping[str, object]):
        self.values = values

    def __call__(self, name: str, default=None):
        value = self.values.get(name)
        return default if value is None else value


def _languages(given: _Given, adapter: TranscriptionAdapter) -> tuple[str | None, tuple[str, ...] | None]:
    """``language`` and ``allowed_languages`` as the adapter's codes (None: not given)."""
    languages = {}
    for name in ("language", "allowed_languages"):
        codes = given(name)
        try:
            if isinstance(codes, list):
                languages[name] = adapter.validate_language_choices(codes)
            else:
                languages[name] = adapter.validate_language(codes)
        except UnsupportedLanguageError as e:
            raise OptionError(name, str(e), code="unsupported_language") from None
    return languages["language"], languages["allowed_languages"]


def _check_model_can(adapter: TranscriptionAdapter, task: str, response_format: str, diarized: bool) -> None:
    """Refuse what the model itself cannot do: the task, times for a timed format, word times
    for diarization."""
    if task not in adapter.supported_tasks:
        raise OptionError("model", f"This model cannot {task}: it only does {', '.join(adapter.supported_tasks)} "
                                   "(English-only Whisper models do not translate)", code="unsupported_value")
    if response_format in TIMED_FORMATS and not adapter.supports_timestamps:
        raise OptionError("response_format", f"This model cannot time its text; {response_format!r} needs times. "
                                             "Use 'json' or 'text'", code="unsupported_value")
    if diarized and not adapter.supports_word_timestamps:
        raise OptionError("response_format", "This model cannot time words, and diarization gives each word its "
                                             "speaker", code="unsupported_value")


def _word_timestamps(given: _Given, adapter: TranscriptionAdapter, response_format: str) -> bool:
    """Whether ``timestamp_granularities`` asks for words, where it can."""
    granularities = list(given("timestamp_granularities", []))
    for g in granularities:
        if g not in ("segment", "word"):
            raise OptionError("timestamp_granularities", f"Unknown timestamp granularity {g!r}; use 'segment' or 'word'")
    word_timestamps = "word" in granularities
    # OpenAI's rule: "segment" is what every format gives anyway (json and text too, and
    # streams: SGLang's clients send it there); "word" needs verbose_json, the one format with words.
    if word_timestamps and response_format != "verbose_json":
        raise OptionError("timestamp_granularities", "timestamp_granularities 'word' needs response_format "
                                                     "'verbose_json'", code="unsupported_value")
    if word_timestamps and not adapter.supports_word_timestamps:
        raise OptionError("timestamp_granularities", "This model cannot time words; use 'segment'",
                          code="unsupported_value")
    return word_timestamps


def _token_logprobs(given: _Given, response_format: str) -> bool:
    """Whether ``include[]`` asks for the text tokens' log-probabilities, where it can."""
    include = list(given("include", []))
    for item in include:
        if item != "logprobs":
            raise OptionError("include", f"include[]={item!r} is not supported; the one value is 'logprobs'",
                              code="unsupported_value")
    token_logprobs = "logprobs" in include
    # OpenAI gives logprobs in json (and its stream's done event); verbose_json has them too here,
    # beside the segments. text and the subtitle formats have no place for them.
    if token_logprobs and response_format not in ("json", "verbose_json"):
        raise OptionError("include", f"include[]=logprobs needs response_format 'json' or 'verbose_json', not "
                                     f"{response_format!r}", code="unsupported_value")
    return token_logprobs


def _beam_size(given: _Given, default_beam_size: int) -> int:
    """The beams: ``n`` with ``use_beam_search``, the runtime's default without it, 1 greedy."""
    searching = given("use_beam_search")
    if searching is None:
        beams = 1 if default_beam_size == 1 else given("n", default_beam_size)
    else:
        beams = given("n", DEFAULT_BEAM_SIZE) if searching else 1
    if beams == 1 and given("n", 1) > 1:
        raise OptionError("n", "n sets the beams of a beam search, and this request decodes greedily "
                               "(use_beam_search=false, or an engine without beam search); use n with "
                               "use_beam_search=true", code="unsupported_value")
    return beams


def _thresholds(given: _Given) -> QualityThresholds:
    defaults = QualityThresholds()
    return QualityThresholds(
        compression_ratio=given("compression_ratio_threshold", defaults.compression_ratio),
        log_prob=given("log_prob_threshold", defaults.log_prob),
        no_speech=given("no_speech_threshold", defaults.no_speech),
    )


DEFAULT_BEAM_SIZE = 5  # faster-whisper's and openai-whisper's command line's


# OpenAI's server_vad fields: (low, high, the VadSettings field it sets, per unit of that field).
SERVER_VAD_FIELDS = {"threshold": (0.0, 1.0, "threshold", 1),
                     "prefix_padding_ms": (0, 5000, "pad_s", 1000),
                     "silence_duration_ms": (0, 10000, "long_pause_s", 1000)}


def _vad_settings(strategy: str | dict | None, vad_filter: bool) -> VadSettings:
    """OpenAI's ``chunking_strategy`` as this server's windows: "auto" (or none) is the default;
    a ``server_vad`` object sets the VAD threshold, the padding around speech
    (``prefix_padding_ms``) and the pause from which on silence is left out of the windows
    (``silence_duration_ms``)."""
    if strategy is None:
        return VadSettings()
    if not vad_filter:
        raise OptionError("chunking_strategy", "chunking_strategy cuts the audio where the VAD hears pauses; it "
                                               "cannot apply with vad_filter=false", code="unsupported_value")
    if strategy == "auto":
        return VadSettings()
    if strategy.get("type") != "server_vad":
        raise OptionError("chunking_strategy", "chunking_strategy must be 'auto' or an object with "
                                               f"\"type\": \"server_vad\", got type {strategy.get('type')!r}")
    unknown = sorted(set(strategy) - {"type", *SERVER_VAD_FIELDS})
    if unknown:
        raise OptionError("chunking_strategy", f"Unknown chunking_strategy field(s) {', '.join(unknown)}; "
                                               f"supported: type, {', '.join(SERVER_VAD_FIELDS)}")
    changes = {}
    for name, (low, high, field, per_unit) in SERVER_VAD_FIELDS.items():
        if name not in strategy:
            continue
        try:
            value = float(strategy[name])
        except (TypeError, ValueError):
            value = math.nan
        if not low <= value <= high:  # NaN fails too
            raise OptionError("chunking_strategy", f"chunking_strategy.{name} must be a number from {low} to {high}, "
                                                   f"got {strategy[name]!r}")
        changes[field] = value / per_unit
    return replace(VadSettings(), **changes)
