"""Shared fixtures: the real packaged model is loaded once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
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


@pytest.fixture(scope="session")
def runtime():
    from asr_service.runtime import build_runtime

    rt = build_runtime(threads=int(os.environ.get("ASR_TEST_THREADS", "0")) or None)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def adapter(runtime):
    return runtime.adapter


@pytest.fixture(scope="session")
def tok(adapter):
    return adapter.tok
