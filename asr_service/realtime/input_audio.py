"""Realtime input audio: base64 frames in the session's format -> float32 mono at 16 kHz.

PyAV does the work (its pcm_s16le / pcm_mulaw / pcm_alaw decoders and libswresample): the
resampler keeps its filter state between frames, so 100 ms frames at 24 kHz resample as well
as one long buffer would, with no clicks at frame edges.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import av
import numpy as np

TARGET_RATE = 16000


class InputAudioError(ValueError):
    def __init__(self, message: str, code: str = "invalid_audio", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class InputFormat:
    """``kind`` is the OpenAI name: audio/pcm (16-bit little-endian), audio/pcmu, audio/pcma."""

    kind: str = "audio/pcm"
    rate: int = TARGET_RATE

    def __post_init__(self):
        if self.kind not in CODECS:
            raise InputAudioError(f"Unsupported audio format {self.kind!r}; supported: {', '.join(CODECS)}",
                                  code="invalid_value")
        if not 8000 <= self.rate <= 96000:
            raise InputAudioError(f"Unsupported sample rate {self.rate}; use 8000-96000 Hz (24000 for audio/pcm is "
                                  "OpenAI's, 16000 is vLLM's)", code="invalid_value")

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.kind == "audio/pcm" else 1

    def describe(self) -> dict:
        return {"type": self.kind, "rate": self.rate}


CODECS = {"audio/pcm": "pcm_s16le", "audio/pcmu": "pcm_mulaw", "audio/pcma": "pcm_alaw"}
G711_RATE = 8000  # G.711 is 8 kHz by definition
# The older OpenAI session names (input_audio_format).
LEGACY_FORMATS = {"pcm16": InputFormat("audio/pcm", 24000), "g711_ulaw": InputFormat("audio/pcmu", G711_RATE),
                  "g711_alaw": InputFormat("audio/pcma", G711_RATE)}


def parse_format(spec: dict | str | None, default: InputFormat) -> InputFormat:
    """An OpenAI ``audio.input.format`` object ({"type", "rate"}) or a legacy name."""
    if spec is None:
        return default
    if isinstance(spec, str):
        if spec not in LEGACY_FORMATS:
            raise InputAudioError(f"Unsupported input_audio_format {spec!r}; supported: {', '.join(LEGACY_FORMATS)}",
                                  code="invalid_value")
        return LEGACY_FORMATS[spec]
    if not isinstance(spec, dict):
        raise InputAudioError("audio format must be an object like {\"type\": \"audio/pcm\", \"rate\": 24000}",
                              code="invalid_value")
    kind = spec.get("type", "audio/pcm")
    rate = spec.get("rate", 24000 if kind == "audio/pcm" else G711_RATE)
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise InputAudioError(f"audio format rate must be an integer, got {rate!r}", code="invalid_value")
    if kind != "audio/pcm" and rate != G711_RATE:
        raise InputAudioError(f"{kind} is 8000 Hz audio; got rate {rate}", code="invalid_value")
    return InputFormat(kind, rate)


class InputAudioDecoder:
    """One per session and format: decode() keeps resampler state from frame to frame."""

    def __init__(self, fmt: InputFormat):
        self.format = fmt
        self._codec = av.CodecContext.create(CODECS[fmt.kind], "r")
        self._codec.sample_rate = fmt.rate
        self._codec.layout = "mono"
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=TARGET_RATE)

    def decode(self, audio_b64: object) -> np.ndarray:
        if not isinstance(audio_b64, str):
            raise InputAudioError("'audio' must be a base64 string", code="invalid_value")
        try:
            raw = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise InputAudioError(f"'audio' is not valid base64: {e}", code="invalid_base64") from None
        if len(raw) % self.format.bytes_per_sample:
            raise InputAudioError(f"{len(raw)} bytes is not a whole number of 16-bit samples", code="invalid_audio")
        if not raw:
            return np.zeros(0, dtype=np.float32)
        pieces = [resampled.to_ndarray().reshape(-1)
                  for frame in self._codec.decode(av.Packet(raw))
                  for resampled in self._resampler.resample(frame)]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
