"""The installed project imports its own top-level packages, not foreign ones of the same name."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import importlib, json
out = {}
for name in ("asr_service", "adapters", "warmup"):
    m = importlib.import_module(name)
    out[name] = m.__file__
import adapters
out["has_whisper_adapter"] = hasattr(adapters, "WhisperAdapter")
print(json.dumps(out))
"""


def test_installed_project_imports_its_own_packages(tmp_path):
    # Run from an unrelated directory so only the installed distribution can satisfy the
    # imports (a foreign PyPI package is also called "adapters").
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True)
    found = __import__("json").loads(done.stdout)
    assert found.pop("has_whisper_adapter") is True
    for name, file in found.items():
        assert Path(file).resolve().is_relative_to(ROOT / name), (name, file)


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "asr-service"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "transcribe" in done.stdout
