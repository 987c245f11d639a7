"""The pytest-audioeval clips: real speech with reference texts, in nine languages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

# pytest-audioeval ships the clips as package data next to its sample registry.
SAMPLES = Path(__import__("pytest_audioeval.samples.registry").samples.registry.__file__).parent / "audio"


def clip_path(lang: str, name: str) -> Path:
    return SAMPLES / lang / f"{name}.wav"


def load_clip(lang: str, name: str) -> np.ndarray:
    audio, sr = sf.read(clip_path(lang, name), dtype="float32")
    assert sr == 16000
    return audio if audio.ndim == 1 else audio.mean(axis=1)


def reference(lang: str, name: str) -> str:
    return (SAMPLES / lang / f"{name}.txt").read_text(encoding="utf-8").strip()


def all_clips() -> list[tuple[str, str]]:
    return sorted((p.parent.name, p.stem) for p in SAMPLES.glob("*/*.wav"))
