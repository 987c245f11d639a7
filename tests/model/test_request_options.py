"""One table of request options, read by the HTTP form and the CLI alike."""

import base64
import io

import pytest
from starlette.datastructures import FormData, UploadFile

from asr_service.audio import AudioLimits
from asr_service.cli import _option_values, _server_settings, parse_args
from asr_service.cli_batch import reference_file
from asr_service.request_options import OPTIONS, DiarizationOptions, OptionError, build_diarization, build_options
from asr_service.server.errors import OpenAIError
from asr_service.server.request_form import parse_transcription_form
from asr_service.speech_gate import VadSettings

pytestmark = pytest.mark.model  # the options are checked against the real model's adapter

# A value for every option, as text (lists: one text per item).
EVERY_OPTION = {
    "language": "fr", "allowed_languages": ["fr", "en"], "prompt": "Bonjour.", "hotwords": "Blanqui",
    "temperature": "0.3", "top_k": "40", "top_p": "0.9", "min_p": "0.05", "seed": "7", "max_completion_tokens": "100",
    "repetition_penalty": "1.2", "frequency_penalty": "0.5", "presence_penalty": "-0.5",
    "temperature_fallback": "false", "compression_ratio_threshold": "2.0", "log_prob_threshold": "-0.5",
    "no_speech_threshold": "0.5", "vad_filter": "true",
    "chunking_strategy": '{"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 800}', "detect_language_per_chunk": "true",
    "condition_on_previous_text": "true", "use_beam_search": "true", "n": "3", "length_penalty": "1.0",
    "timestamp_granularities": ["word", "segment"], "include": ["logprobs"],
}
# Diarization's options (a DiarizationOptions of their own; diarization refuses prompt and include).
DIARIZATION_OPTIONS = {
    "diarize": "true", "min_speakers": "2", "max_speakers": "5", "known_speaker_names": ["Ann", "Bo"],
    "known_speaker_references": ["ann.wav", "bo.wav"],
}


def test_the_table_is_what_this_test_sets():
    assert {o.name for o in OPTIONS} == set(EVERY_OPTION) | set(DIARIZATION_OPTIONS)


def form_and_argv(values: dict) -> tuple[list, list]:
    form = [("file", UploadFile(io.BytesIO(b""), filename="x.wav")), ("response_format", "verbose_json")]
    argv = ["transcribe", "x.wav", "--response-format", "verbose_json"]
    for option in OPTIONS:
        if option.name not in values:
            continue
        value = values[option.name]
        if option.kind is list:
            form += [(f"{option.name}[]", v) for v in value]
            argv += [option.flag, *value]
        else:
            form.append((option.name, value))
            if option.kind is bool:
                argv.append(option.flag if value == "true" else f"--no-{option.flag[2:]}")
            else:
                argv += [option.flag, value]
    return form, argv


def test_every_option_means_the_same_from_the_form_and_the_cli(adapter):
    form, argv = form_and_argv(EVERY_OPTION)
    from_form = parse_transcription_form(FormData(form), adapter, "transcribe").options
    from_cli = build_options(_option_values(parse_args(argv, {})), adapter, "transcribe", "verbose_json")
    assert from_cli == from_form
    assert from_form.candidate_languages == ("fr", "en") and from_form.hotwords == "Blanqui"
    assert from_form.top_p == 0.9 and from_form.top_k == 40 and from_form.beam_size == 3 and from_form.min_p == 0.05
    assert (from_form.repetition_penalty, from_form.frequency_penalty, from_form.presence_penalty) == (1.2, 0.5, -0.5)
    assert from_form.word_timestamps and from_form.condition_on_previous_text and from_form.vad_filter
    assert from_form.vad == VadSettings(threshold=0.6, long_pause_s=0.8)
    assert from_form.fallback_temperatures == () and from_form.thresholds.no_speech == 0.5
    assert from_form.token_logprobs


def test_diarization_options_mean_the_same_from_the_form_and_the_cli(adapter, tmp_path):
    """The form carries each reference as a data URL, the command line as a file: both give the
    same bytes."""
    clips = {"Ann": b"RIFF ann's clip", "Bo": b"RIFF bo's clip"}
    for name, data in clips.items():
        (tmp_path / f"{name}.wav").write_bytes(data)
    form, _ = form_and_argv({**DIARIZATION_OPTIONS, "known_speaker_references": [
        "data:audio/wav;base64," + base64.b64encode(data).decode() for data in clips.values()]})
    _, argv = form_and_argv({**DIARIZATION_OPTIONS, "known_speaker_references": [
        str(tmp_path / f"{name}.wav") for name in clips]})
    request = parse_transcription_form(FormData(form), adapter, "transcribe")
    args = parse_args(argv, {})
    from_cli = build_diarization(_option_values(args), "transcribe", "verbose_json",
                                 reference_file(AudioLimits(args.max_bytes, args.max_seconds)))
    assert request.diarization == from_cli == DiarizationOptions(
        min_speakers=2, max_speakers=5, known_speakers=tuple(clips.items()))
    assert request.options.timestamps and request.options.word_timestamps  # every word gets its speaker


@pytest.mark.parametrize("reference", ["/dev/zero", "/etc/passwd", "ann.wav", "file:///etc/passwd",
                                       "data:audio/wav,raw", "data:audio/wav;base64,@@@", "data:audio/wav;base64,"])
def test_the_form_takes_a_reference_as_data_only_and_never_opens_a_path(adapter, reference, monkeypatch):
    def no_files(*args, **kwargs):
        raise AssertionError(f"the form opened a file: {args}")

    monkeypatch.setattr("builtins.open", no_files)
    monkeypatch.setattr("pathlib.Path.read_bytes", no_files)
    form, _ = form_and_argv({**DIARIZATION_OPTIONS, "known_speaker_references": [reference, reference]})
    with pytest.raises(OpenAIError) as refused:
        parse_transcription_form(FormData(form), adapter, "transcribe")
    assert refused.value.status == 400 and refused.value.param == "known_speaker_references"
    # The message never tells what is on the server's disk.
    assert "No such file" not in refused.value.message and "directory" not in refused.value.message


@pytest.mark.parametrize("name", ["Bob\n\n2\n00:00:00,000 --> 00:00:01,000\nforged", "Bo>b", "<b>Bo", "A&B",
                                  "tab\there", " padded", "x" * 65, "zero\u200bwidth"])
def test_speaker_names_that_would_forge_subtitles_are_refused(adapter, name):
    form, _ = form_and_argv({**DIARIZATION_OPTIONS, "known_speaker_names": [name, "Bo"],
                             "known_speaker_references": ["data:audio/wav;base64,UklGRg==", "data:audio/wav;base64,UklGRg=="]})
    with pytest.raises(OpenAIError) as refused:
        parse_transcription_form(FormData(form), adapter, "transcribe")
    assert refused.value.status == 400 and refused.value.param == "known_speaker_names", refused.value.message


@pytest.mark.parametrize("codes", [[""], ["fr", ""], [" "], ["fr", "xx"]])
def test_an_empty_or_unknown_allowed_language_is_refused(adapter, codes):
    form, _ = form_and_argv({"allowed_languages": codes})
    with pytest.raises(OpenAIError) as refused:
        parse_transcription_form(FormData(form), adapter, "transcribe")
    assert refused.value.status == 400 and refused.value.param == "allowed_languages"
    assert refused.value.code == "unsupported_language"


def test_cli_shorthands_and_refusals(adapter):
    args = parse_args(["transcribe", "x.wav", "--beam-size", "4", "--word-timestamps"], {})
    options = build_options(_option_values(args), adapter, "transcribe", "verbose_json")
    assert options.beam_size == 4 and options.word_timestamps
    with pytest.raises(OptionError, match="verbose_json") as refused:
        build_options(_option_values(args), adapter, "transcribe", "json")
    assert refused.value.param == "timestamp_granularities"
    with pytest.raises(SystemExit):  # argparse: "--top-p: top_p must be between 0.0 and 1.0, got 2.0"
        parse_args(["transcribe", "x.wav", "--top-p", "2"], {})


def test_a_stream_is_the_same_decode_as_its_full_response(adapter):
    """Beam search, the fallback and the language rule apply to a stream as to the response it
    releases early: the form's stream field changes no decode option."""
    for fields in ([], [("use_beam_search", "true")], [("temperature_fallback", "true")],
                   [("detect_language_per_chunk", "false")], [("n", "3")]):
        streamed = parse_transcription_form(_form(("stream", "true"), *fields), adapter, "transcribe", default_beam_size=5)
        full = parse_transcription_form(_form(*fields), adapter, "transcribe", default_beam_size=5)
        assert streamed.stream and not full.stream and streamed.options == full.options, fields


def _form(*fields: tuple[str, str]) -> FormData:
    return FormData([("file", UploadFile(io.BytesIO(b""), filename="x.wav")), *fields])


def test_chunking_strategy_as_the_openai_sdk_sends_it(adapter):
    # The SDK flattens an object field into name[key] form fields (its _serialize_multipartform).
    from openai._qs import Querystring

    strategy = {"type": "server_vad", "threshold": 0.3, "prefix_padding_ms": 200, "silence_duration_ms": 1200}
    fields = Querystring().stringify_items({"chunking_strategy": strategy}, array_format="brackets")
    options = parse_transcription_form(_form(*fields), adapter, "transcribe").options
    assert options.vad == VadSettings(threshold=0.3, long_pause_s=1.2, pad_s=0.2)
    auto = parse_transcription_form(_form(("chunking_strategy", "auto")), adapter, "transcribe").options
    assert auto.vad == VadSettings() == parse_transcription_form(_form(), adapter, "transcribe").options.vad


@pytest.mark.parametrize("fields, says", [
    ([("chunking_strategy", "fixed")], "'auto' or a JSON object"),
    ([("chunking_strategy[type]", "semantic_vad")], "server_vad"),
    ([("chunking_strategy[type]", "server_vad"), ("chunking_strategy[eagerness]", "high")], "eagerness"),
    ([("chunking_strategy[type]", "server_vad"), ("chunking_strategy[threshold]", "2")], "threshold must be"),
    ([("chunking_strategy[type]", "server_vad"), ("chunking_strategy[silence_duration_ms]", "soon")], "silence"),
    ([("chunking_strategy", "auto"), ("vad_filter", "false")], "vad_filter=false"),
])
def test_a_chunking_strategy_that_cannot_apply_is_refused(adapter, fields, says):
    from asr_service.server.errors import OpenAIError

    with pytest.raises(OpenAIError) as refused:
        parse_transcription_form(_form(*fields), adapter, "transcribe")
    assert refused.value.param == "chunking_strategy" and says in str(refused.value)


def test_the_servers_default_stream_format_applies_when_a_request_names_none(adapter):
    """`serve --default-stream-format chunk`: plain stream=true gets vLLM / SGLang's chunks."""
    settings = _server_settings(parse_args(["serve", "--default-stream-format", "chunk"], {}))
    assert settings.default_stream_format == "chunk"
    assert _server_settings(parse_args(["serve"], {})).default_stream_format == "openai"

    def stream_format(*fields) -> str:
        form = FormData([("file", UploadFile(io.BytesIO(b"x"), filename="a.wav")), ("stream", "true"), *fields])
        return parse_transcription_form(form, adapter, "transcribe", "fused", settings.default_stream_format).stream_format

    assert stream_format() == "chunk"
    assert stream_format(("stream_format", "openai")) == "openai"  # the request still chooses


def test_a_request_that_does_not_choose_searches_five_beams(adapter):
    """The default decode is faster-whisper's, a 5-beam search, where the runtime's engine can
    search; an engine without beam search decodes greedily; use_beam_search=false is greedy and
    n sets the beams. Every format decodes with timestamps, so json holds the words the
    subtitles do."""
    def beams(*fields, default=5):
        values = {"use_beam_search": None, "n": None} | dict(fields)
        return build_options(values, adapter, "transcribe", "json", default_beam_size=default).beam_size

    assert beams() == 5 and beams(("n", 3)) == 3 and beams(default=1) == 1
    assert beams(("use_beam_search", False)) == 1 and beams(("use_beam_search", True), default=1) == 5
    for fields, default, param in [((("n", 3),), 1, "n"), ((("n", 3), ("use_beam_search", False)), 5, "n")]:
        with pytest.raises(OptionError) as refused:  # what cannot apply is refused, not ignored
            beams(*fields, default=default)
        assert refused.value.param == param
    assert all(build_options({}, adapter, "transcribe", fmt).timestamps for fmt in ("json", "text", "srt"))
