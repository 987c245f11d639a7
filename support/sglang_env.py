"""Side environments holding SGLang's own request code, for the contract tests
(tests/server/test_sglang_contract.py) and the stand-in server (tests/sglang_standin.py):
``python -m support.sglang_env install|check DIR VERSION ...``.

Each release goes into DIR/VERSION with ``pip install --target --no-deps``: the sglang wheel,
the transformers and tokenizers it pins, and the light modules its request classes import.
They run on this project's own interpreter with that folder first on PYTHONPATH, so torch
(the CPU wheel), triton, numpy and pydantic come from the service's venv, and nothing is
installed into it. Two stand-ins (support/sglang_standins) take the place of what has no build
for this torch here: torchvision, which SGLang imports only through transformers' image
processors, and torchaudio, which its audio loader imports and calls only to resample (the
front sends 16 kHz).

Two steps, so `make test` can fetch while the venv is still being installed: ``install`` needs
only pip (the releases side by side: each pip run is mostly one core unpacking), and ``check``
imports SGLang's request code on the finished venv. A folder is built once: its
.installed and .complete stamps say, for which list of packages and stand-ins, that it was
fetched and that it imports, so a changed list builds it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# What each release pins, of what its request classes import (from its wheel's METADATA).
PINNED = {
    "0.5.21": ["transformers==5.12.1", "tokenizers==0.22.2", "huggingface_hub>=1.5,<2"],
    "0.5.23": ["transformers==5.19.0", "tokenizers==0.23.2"],
}
# Imported on the way to sglang.srt.managers.io_struct and missing from the service's venv;
# unpinned by SGLang, or pinned alike.
LIGHT = ["psutil", "pillow", "orjson", "pybase64", "msgspec", "pyzmq", "requests", "ipython", "traitlets", "aiohttp", "multidict",
         "yarl", "propcache", "aiohappyeyeballs", "aiosignal", "frozenlist", "dill", "sentencepiece==0.2.1",
         "compressed-tensors==0.18.0", "loguru", "gguf", "partial_json_parser", "einops"]
STANDINS = Path(__file__).parent / "sglang_standins"
# What the contract tests and the stand-in server run (support/sglang_judge.py).
IMPORT_CHECK = "import sglang.srt.managers.io_struct, sglang.srt.multimodal.processors.whisper"


def install(root: Path, version: str) -> Path:
    """DIR/VERSION with the release's wheels and the stand-ins, unless already there."""
    target = root / version
    if _stamped(target / ".installed", version):
        return target
    shutil.rmtree(target, ignore_errors=True)
    # Not compiled here: what runs from it compiles the modules it imports (the Makefile's reason).
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target",
                    str(target), *_packages(version)], check=True)
    for standin in ("torchvision", "torchaudio"):
        shutil.copytree(STANDINS / standin, target / standin)
    (target / ".installed").write_text(_recipe(version))
    return target


def check(root: Path, version: str) -> Path:
    """Whole only if SGLang's request code imports on this venv: said here, not as a failing
    test later."""
    target = root / version
    if _stamped(target / ".complete", version):
        return target
    if not _stamped(target / ".installed", version):
        raise SystemExit(f"SGLang {version} is not installed in {target} for this recipe: run `install` first")
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(target)})
    if result.returncode != 0:
        raise SystemExit(f"SGLang {version} in {target} does not import:\n{result.stderr[-2000:]}")
    (target / ".complete").write_text(_recipe(version))
    return target


def _stamped(stamp: Path, version: str) -> bool:
    """Whether ``stamp`` was written for this version's current recipe."""
    return stamp.exists() and stamp.read_text() == _recipe(version)


def _packages(version: str) -> list[str]:
    return [f"sglang=={version}", *PINNED[version], *LIGHT]


def _recipe(version: str) -> str:
    return json.dumps({"packages": _packages(version), "standins": _standin_files()})


def _standin_files() -> dict[str, str]:
    return {str(p.relative_to(STANDINS)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(STANDINS.rglob("*.py"))}


STEPS = {"install": install, "check": check}


def main() -> None:
    """``python -m support.sglang_env install|check DIR VERSION ...``"""
    if len(sys.argv) < 3 or sys.argv[1] not in STEPS:
        raise SystemExit("usage: python -m support.sglang_env install|check DIR VERSION ...")
    step, root, versions = STEPS[sys.argv[1]], Path(sys.argv[2]), sys.argv[3:]
    with ThreadPoolExecutor(max(1, len(versions))) as pool:
        targets = list(pool.map(lambda version: step(root, version), versions))
    for version, target in zip(versions, targets):
        print(f"SGLang {version} request code in {target}: {sys.argv[1]} done")


if __name__ == "__main__":
    main()
