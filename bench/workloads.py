"""Bench workloads: the clips and a long file, as WAV bytes (for HTTP) and files (for peers)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from support import dialogue
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
    # A long file of real structure: support/dialogue.py's four-voice conversation (a 15 s
    # lead-in, pauses of 0.3-1.6 s and one of 8 s; 181 s, cut after the last utterance that ends
    # within the first minute for --quick). The clips looped into a long file were the first
    # choice, but the package has only two English sentences (and a count): a file that repeats
    # them sixty times is text few recordings have, and Whisper's repetition test (the
    # compression ratio) takes a true decode of it for a loop, in faster-whisper as here.
    audio, truth = dialogue.build()
    if quick:
        truth = [u for u in truth if u.end <= 60.0]
        audio = audio[: int((truth[-1].end + 0.5) * 16000)]
    long = [Request("long-en", "en", " ".join(u.text for u in truth), audio)]
    workloads = {"short": short, "long": long}
    for reqs in workloads.values():
        for i, r in enumerate(reqs):
            r.wav = wav_bytes(r.audio)
            r.path = str(tmp / f"{i}-{r.name.replace('/', '_')}.wav")
            Path(r.path).write_bytes(r.wav)
    return workloads
