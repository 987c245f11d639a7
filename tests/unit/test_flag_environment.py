"""Every serve flag can also come from an ASR_ environment variable; flags win."""

import subprocess
import sys
from pathlib import Path

import pytest

from asr_service.cli import _build_parser, _server_settings, parse_args
from asr_service.flag_environment import variable_for
from asr_service.runtime import RuntimeSettings

pytestmark = pytest.mark.unit


def test_variables_set_what_the_command_line_leaves_unset():
    environ = {"ASR_PORT": "9001", "ASR_MAX_BATCH_SIZE": "4", "ASR_QUANTIZE": "none", "ASR_SERVED_MODEL_NAME": "whisper-1",
               "ASR_SGLANG_URL": "http://gpu1:30000, http://gpu2:30000", "ASR_REQUEST_TIMEOUT": "30"}
    args = parse_args(["serve", "--port", "8123"], environ)
    assert args.port == 8123  # the flag wins
    assert (args.max_batch_size, args.quantize, args.served_model_name) == (4, "none", ["whisper-1"])
    assert args.sglang_url == ["http://gpu1:30000", "http://gpu2:30000"]  # a list: spaces or commas
    settings = _server_settings(args)
    assert settings.request_timeout_s == 30.0 and settings.runtime.max_batch_size == 4
    assert parse_args(["serve"], {}).port == 8000  # no variable: the default


def test_transcribe_reads_no_variables():
    assert parse_args(["transcribe", "a.wav"], {"ASR_MAX_BATCH_SIZE": "4"}).max_batch_size == RuntimeSettings.max_batch_size


@pytest.mark.parametrize("variable, value, says", [
    ("ASR_PORT", "eighty", "ASR_PORT='eighty' is not a valid --port value"),
    ("ASR_QUANTIZE", "fp8", "ASR_QUANTIZE='fp8': --quantize takes one of auto, none, bf16, int8"),
    ("ASR_SGLANG_URL", "gpu1:30000", "is not an http:// or https:// URL"),
    ("ASR_MAX_BATCH_SIZE", " ", "ASR_MAX_BATCH_SIZE is set but empty"),
])
def test_a_bad_value_is_refused_naming_the_variable(capsys, variable, value, says):
    with pytest.raises(SystemExit) as exited:
        parse_args(["serve"], {variable: value})
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_every_serve_flag_has_its_variable_in_the_help():
    """As a user reads it: every flag `serve --help` lists names its variable. The API keys keep
    their own (ASR_API_KEYS, comma-separated, adding to the flags')."""
    shown = subprocess.run([str(Path(sys.executable).parent / "asr-service"), "serve", "--help"], capture_output=True,
                           text=True, check=True, env={"COLUMNS": "1000"}).stdout
    blocks: dict[str, str] = {}  # each option's own lines of the help
    for line in shown.splitlines():
        if line.startswith("  --"):
            flag = line.split()[0].rstrip(",")
            blocks[flag] = ""
        if blocks:
            blocks[flag] += line
    flags = [o for o in blocks if o not in ("--help", "--api-key")]
    assert len(flags) > 25 and "--max-batch-size" in flags
    for flag in flags:
        assert f"[env {variable_for(flag)}]" in " ".join(blocks[flag].split()), blocks[flag]
    assert {f.flag for f in _build_parser()[1].flags} == set(flags)
    assert "ASR_API_KEYS" in shown


def test_several_models_from_the_environment_and_how_they_combine():
    """ASR_MODEL takes several entries separated by spaces, as repeated --model flags."""
    from asr_service.cli import _served_models

    args = parse_args(["serve"], {"ASR_MODEL": "whisper-base=base,whisper-1 /models/x=x", "ASR_MAX_LOADED_MODELS": "2"})
    assert [(e.spec, e.names) for e in _served_models(args)] == [("whisper-base", ("base", "whisper-1")),
                                                                 ("/models/x", ("x",))]
    assert args.max_loaded_models == 2
    with pytest.raises(ValueError, match="at least 2"):  # the default stays loaded: no room for another
        _served_models(parse_args(["serve", "--model", "a", "--model", "b", "--max-loaded-models", "1"], {}))
    assert [e.names for e in _served_models(parse_args(["serve"], {}))] == [("whisper-base", "whisper-1", "gpt-4o-transcribe-diarize")]
    alone = _served_models(parse_args(["serve", "--model", "a", "--served-model-name", "b", "c"], {}))
    assert [(e.spec, e.names) for e in alone] == [("a", ("b", "c"))]
    with pytest.raises(ValueError, match="--served-model-name names a single --model"):
        _served_models(parse_args(["serve", "--model", "a", "--model", "b", "--served-model-name", "c"], {}))
    with pytest.raises(ValueError, match="--engine sglang serves one model"):
        _served_models(parse_args(["serve", "--model", "a", "--model", "b", "--engine", "sglang",
                                   "--sglang-url", "http://x:1"], {}))
