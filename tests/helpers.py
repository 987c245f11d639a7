"""Helpers several test modules share: audio made in memory (containers through PyAV, WAV bytes
written by hand, PCM16 frames for realtime), and the check of OpenAI's error shape."""

import base64
import io
import json

import av
import numpy as np
import soundfile as sf


def encode_samples(planar: np.ndarray, rate: int, layout: str, codec: str, fmt: str, container: str) -> bytes:
    """Samples (channels x n) encoded by FFmpeg's libraries through PyAV, in memory."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        for i in range(0, planar.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planar[:, i : i + 1024]), format=fmt, layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def encode(container_format: str, codec: str, seconds=1.5, rate=44100, layout="stereo") -> bytes:
    """A tone in the given container and codec."""
    codec_rate = 48000 if codec == "libopus" else rate
    t = np.arange(int(seconds * codec_rate)) / codec_rate
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    planar = np.tile(tone, (2 if layout == "stereo" else 1, 1))
    return encode_samples(planar, codec_rate, layout, codec, "fltp", container_format)


def pcm16_wav(rate: int, samples: np.ndarray) -> bytes:
    """A RIFF/WAVE file of 16-bit mono PCM."""
    fmt = (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") \
        + rate.to_bytes(4, "little") + (2 * rate).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    size = 2 * samples.shape[0]
    body = b"WAVE" + b"fmt " + fmt + b"data" + size.to_bytes(4, "little")
    return b"RIFF" + (len(body) + size).to_bytes(4, "little") + body + samples.astype("<i2").tobytes()


def one_hertz_bomb() -> bytes:
    """10,844 bytes of 8-bit mono WAV at 1 Hz: three hours once resampled to 16 kHz."""
    return _wav_header(1, 10_800) + bytes([128]) * 10_800


def _wav_header(rate: int, samples: int) -> bytes:
    """A RIFF/WAVE header for 8-bit mono PCM at ``rate``, ``samples`` bytes of data."""
    fmt = (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") \
        + rate.to_bytes(4, "little") + rate.to_bytes(4, "little") + (1).to_bytes(2, "little") + (8).to_bytes(2, "little")
    body = b"WAVE" + b"fmt " + fmt + b"data" + samples.to_bytes(4, "little")
    return b"RIFF" + (len(body) + samples).to_bytes(4, "little") + body


def wav_bytes(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def resample(audio: np.ndarray, rate: int) -> np.ndarray:
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(audio.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = 16000
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out)


def assert_openai_error(response, status, param=None, code=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


def sse_events(response) -> list[str]:
    """The data lines of a server-sent-events response."""
    return [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]


def append(audio_bytes: bytes) -> str:
    """A realtime input_audio_buffer.append event carrying ``audio_bytes``."""
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio_bytes).decode()})
