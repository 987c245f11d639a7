"""Bench workloads: the clips and a long file, as WAV bytes (for HTTP) and files (for peers)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from support.clips import all_clips, load_clip, reference


@dataclass
class Request:
    name: str
    language: str
    reference: str
    audio: np.ndarray
    path: str = ""
    wav: bytes = b""

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / 16000


@dataclass
class Outcome:
    """What a system answered for one request."""

    text: str
    language: str | None
    latency_s: float


def wav_bytes(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def build_workloads(quick: bool, tmp: Path) -> dict[str, list[Request]]:
    clips = [c for c in all_clips() if not quick or c[0] in ("en", "es", "fr", "zh")]
    short = [Request(f"{lang}/{name}", lang, reference(lang, name), load_clip(lang, name)) for lang, name in clips]
    # A long file of real English speech with silences between sentences. The counting clip is
    # left out: the model writes it as "12345678910" or "1, 2, 3", and a normaliser cannot
    # score that difference fairly over minutes of audio.
    english = [r for r in short if r.language == "en" and not r.name.endswith("counting")]
    target = 60 if quick else 240
    pieces, refs, t = [], [], 0.0
    while t < target:
        for r in english:
            pieces += [r.audio, np.zeros(int(1.5 * 16000), np.float32)]
            refs.append(r.reference)
            t += r.seconds + 1.5
    long = [Request("long-en", "en", " ".join(refs), np.concatenate(pieces))]
    workloads = {"short": short, "long": long}
    for reqs in workloads.values():
        for i, r in enumerate(reqs):
            r.wav = wav_bytes(r.audio)
            r.path = str(tmp / f"{i}-{r.name.replace('/', '_')}.wav")
            Path(r.path).write_bytes(r.wav)
    return workloads
