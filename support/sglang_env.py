"""Side environments holding SGLang's own request code, for the contract tests
(tests/server/test_sglang_contract.py) and the stand-in server (tests/sglang_standin.py):
``python -m support.sglang_env DIR VERSION ...``.

Each release goes into DIR/VERSION with ``pip install --target --no-deps``: the sglang wheel,
the transformers and tokenizers it pins, and the light modules its request classes import.
They run on this project's own interpreter with that folder first on PYTHONPATH, so torch
(the CPU wheel), triton, numpy and pydantic come from the service's venv, and nothing is
installed into it. Two stand-ins (support/sglang_standins) take the place of what has no build
for this torch here: torchvision, which SGLang imports only through transformers' image
processors, and torchaudio, which its audio loader imports and calls only to resample (the
front sends 16 kHz). A folder is built once: its .complete stamp says it is whole, and for which
list of packages and stand-ins, so a changed list builds it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
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


def build(root: Path, version: str) -> Path:
    target = root / version
    stamp = target / ".complete"
    wanted = [f"sglang=={version}", *PINNED[version], *LIGHT]
    recipe = json.dumps({"packages": wanted, "standins": _standin_files()})
    if stamp.exists() and stamp.read_text() == recipe:
        return target
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    *wanted], check=True)
    for standin in ("torchvision", "torchaudio"):
        shutil.copytree(STANDINS / standin, target / standin)
    # Whole only if SGLang's request code imports: said here, not as a failing test later.
    check = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(target)})
    if check.returncode != 0:
        raise SystemExit(f"SGLang {version} in {target} does not import:\n{check.stderr[-2000:]}")
    stamp.write_text(recipe)
    return target


def _standin_files() -> dict[str, str]:
    return {str(p.relative_to(STANDINS)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(STANDINS.rglob("*.py"))}


def main() -> None:
    root = Path(sys.argv[1])
    for version in sys.argv[2:]:
        print(f"SGLang {version} request code in {build(root, version)}")


if __name__ == "__main__":
    main()
