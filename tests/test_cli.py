"""The command line, as a user runs it: a separate process on real files."""

import json
import subprocess
import sys
from pathlib import Path

from bench.clips import clip_path

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
