"""The command line, as a user runs it: a separate process on real files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.clips import clip_path

pytestmark = pytest.mark.server

CLI = str(Path(sys.executable).parent / "asr-service")


def test_cli_transcribes_several_files_in_order_with_detection(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all" * 10)
    files = [clip_path("en", "quick_brown_fox"), bad, clip_path("zh", "nihao_shijie"), clip_path("fr", "bonjour_monde")]
    done = subprocess.run([CLI, "transcribe", *map(str, files), "--response-format", "verbose_json"],
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 1  # one file was bad
    assert len(lines) == 4
    assert lines[0]["language"] == "en" and lines[0]["text"] == "The quick brown fox jumps over the lazy dog."
    assert lines[1]["error"]["code"] == "invalid_audio" and "Invalid or unsupported audio file" in lines[1]["error"]["message"]
    assert lines[2]["language"] == "zh" and lines[2]["text"].startswith("你好")
    assert lines[3]["language"] == "fr" and "Bonjour" in lines[3]["text"]
    for line in (lines[0], lines[2], lines[3]):
        assert line["segments"] and isinstance(line["duration"], float)


def test_cli_srt_and_fixed_language():
    done = subprocess.run([CLI, "transcribe", str(clip_path("es", "conteo")), "--language", "es",
                           "--response-format", "srt"], capture_output=True, text=True, timeout=300, check=True)
    first = done.stdout.splitlines()
    assert first[0] == "1" and first[1].startswith("00:00:00,000 --> 00:00:0")


def test_cli_allowed_languages_confine_detection():
    files = [str(clip_path("pl", name)) for name in ("liczenie", "witaj_swiecie")]
    done = subprocess.run([CLI, "transcribe", *files, "--allowed-languages", "pl", "en", "--response-format", "verbose_json"],
                          capture_output=True, text=True, timeout=300, check=True)
    count, greeting = [json.loads(line)["language"] for line in done.stdout.splitlines()]
    assert count == "pl" and greeting in ("pl", "en")  # heard as Czech and Portuguese without the list
    done = subprocess.run([CLI, "transcribe", files[0], "--allowed-languages", "pl", "xx"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Unsupported language 'xx'" in done.stderr


def test_cli_json_with_logprobs():
    done = subprocess.run([CLI, "transcribe", str(clip_path("en", "quick_brown_fox")), "--include", "logprobs"],
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout)
    assert b"".join(bytes(t["bytes"]) for t in result["logprobs"]).decode().strip() == result["text"]
    assert all(t["logprob"] <= 0 for t in result["logprobs"])


def test_cli_rejects_unknown_language_and_model():
    done = subprocess.run([CLI, "transcribe", str(clip_path("es", "conteo")), "--language", "xx"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Unsupported language 'xx'" in done.stderr
    done = subprocess.run([CLI, "transcribe", str(clip_path("es", "conteo")), "--model", "no-such-model"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "whisper-base" in done.stderr


def test_cli_word_timestamps_with_beam_search():
    done = subprocess.run([CLI, "transcribe", str(clip_path("en", "quick_brown_fox")), "--response-format", "verbose_json",
                           "--word-timestamps", "--beam-size", "3"], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout)
    assert [w["word"] for w in result["words"]] == result["text"].split()
    assert all(0 <= w["start"] <= w["end"] <= result["duration"] + 0.05 for w in result["words"])


def test_batch_killed_midway_resumes_and_does_every_file_once(tmp_path):
    import signal
    import time

    import numpy as np
    import soundfile as sf

    from support.clips import load_clip, reference

    inputs = tmp_path / "in"
    inputs.mkdir()
    names = [("en", "quick_brown_fox"), ("fr", "bonjour_monde"), ("es", "hola_mundo"), ("en", "counting"),
             ("zh", "nihao_shijie"), ("pt", "pangrama")]
    files = []
    for lang, name in names:
        files.append(inputs / f"{lang}_{name}.wav")
        sf.write(files[-1], load_clip(lang, name), 16000)
    files.append(inputs / "long.wav")  # 40 s: still decoding when the short ones are written
    sf.write(files[-1], np.tile(load_clip("en", "quick_brown_fox"), 14)[: 40 * 16000], 16000)
    out = tmp_path / "out"
    command = [CLI, "transcribe", *map(str, files), "--output-dir", str(out), "--response-format", "json",
               "--no-temperature-fallback"]  # the long file repeats one sentence: no retries on it

    first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_before = sorted(p.name for p in out.glob("*.json"))
    assert 0 < len(done_before) < len(files), done_before  # killed midway

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    skipped = [line for line in again.stderr.splitlines() if line.startswith("skipping ")]
    wrote = [line for line in again.stderr.splitlines() if line.startswith("wrote ")]
    assert len(skipped) == len(done_before) and len(wrote) == len(files) - len(done_before)  # each file once
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{f.stem}.json" for f in files)  # no partial files left
    for lang, name in names:
        text = json.loads((out / f"{lang}_{name}.json").read_text())["text"]
        assert text, (lang, name)
    assert json.loads((out / "en_quick_brown_fox.json").read_text())["text"] == reference("en", "quick_brown_fox")
    assert "quick brown fox" in json.loads((out / "long.json").read_text())["text"]


def test_batch_refuses_two_inputs_with_one_output_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "x.wav").write_bytes(clip_path("en", "hello_world").read_bytes())
    done = subprocess.run([CLI, "transcribe", str(tmp_path / "a/x.wav"), str(tmp_path / "b/x.wav"), "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "would both be written to" in done.stderr


def test_engine_flags_refuse_bad_values_before_any_work():
    done = subprocess.run([CLI, "serve", "--engine", "sglang", "--sglang-url", "gpu1:30000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not an http:// or https:// URL" in done.stderr
    done = subprocess.run([CLI, "transcribe", str(clip_path("es", "conteo")), "--engine", "sglang"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs at least one --sglang-url" in done.stderr
