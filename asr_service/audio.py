"""Bytes -> mono float32 16 kHz samples, with PyAV (FFmpeg's libraries, no ffmpeg binary).

PyAV is the choice because it decodes every container the OpenAI API accepts from memory
and resamples in the same pass; limits are enforced while decoding so a file that claims
hours of audio cannot grow memory beyond ``max_seconds``.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Callable

import av
import numpy as np

from .pcm import SAMPLE_RATE

DEFAULT_MAX_BYTES = 25 * 1024 * 1024
DEFAULT_MAX_SECONDS = 3 * 3600.0
# Below this rate there is no intelligible speech (telephony is 8 kHz), and a file at a few Hz
# is a decompression bomb: a few kilobytes that resample into hours of 16 kHz samples.
MIN_SAMPLE_RATE = 4000


class AudioError(ValueError):
    """Audio that cannot be used; ``code`` names the reason for API errors."""

    code = "invalid_audio"


class InvalidAudioError(AudioError):
    """Empty, truncated, random or non-audio bytes."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(f"Invalid or unsupported audio file: {detail}")


class AudioTooLargeError(AudioError):
    code = "file_too_large"


class AudioTooLongError(AudioError):
    code = "audio_too_long"


@dataclass(frozen=True)
class AudioLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_seconds: float = DEFAULT_MAX_SECONDS


# libswresample refuses to downmix layouts it cannot name (e.g. 32 unlabelled channels).
MAX_RESAMPLER_CHANNELS = 8
_SCALE = {np.dtype(np.uint8): (128.0, 128.0), np.dtype(np.int16): (0.0, 32768.0), np.dtype(np.int32): (0.0, 2.0**31)}


def _downmix(frame: av.AudioFrame) -> av.AudioFrame:
    """The mean of all channels, as a mono float frame, for layouts the resampler cannot take."""
    channels = frame.layout.nb_channels
    samples = frame.to_ndarray()
    samples = samples.reshape(channels, -1) if frame.format.is_planar else samples.reshape(-1, channels).T
    offset, scale = _SCALE.get(samples.dtype, (0.0, 1.0))
    mono = ((samples.astype(np.float32) - offset) / scale).mean(axis=0, dtype=np.float32)
    out = av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
    out.sample_rate = frame.sample_rate
    return out


def _low_rate(rate: int) -> str:
    return f"a sample rate of {rate} Hz is below {MIN_SAMPLE_RATE} Hz, too low for speech"


def _check_declared(stream: av.audio.stream.AudioStream, limits: AudioLimits) -> None:
    """Refuse what the stream's header already says is unusable, before decoding anything."""
    if stream.sample_rate and stream.sample_rate < MIN_SAMPLE_RATE:
        raise InvalidAudioError(_low_rate(stream.sample_rate))
    declared = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
    if declared > limits.max_seconds:
        raise AudioTooLongError(f"audio of {declared:.0f} seconds (as its header says) is longer than the limit of "
                                f"{limits.max_seconds:g} seconds")


# How often (in decoded audio) a decode reports its progress and checks its deadline.
PROGRESS_EVERY_SECONDS = 10.0
# Decoded samples are gathered in blocks of this much audio. A block (38 MB) is larger than
# glibc's largest mmap threshold (32 MB), so each is its own mapping and goes back to the
# system the moment it is freed: joining the blocks holds the audio once plus one block.
BLOCK_SECONDS = 600.0


class _SampleBlocks:
    """Samples gathered in fixed blocks, joined into one array block by block, each block freed
    once copied, so that a three-hour upload (690 MB of float32) is not held twice at the end
    of its decode, as a join of its thousands of small frames would hold it."""

    def __init__(self, block_samples: int):
        self._block_samples = block_samples
        self._full: list[np.ndarray] = []
        self._block = np.empty(block_samples, np.float32)  # pages are touched only as filled
        self._used = 0
        self.total = 0

    def add(self, samples: np.ndarray) -> None:
        while samples.shape[0]:
            take = min(samples.shape[0], self._block_samples - self._used)
            self._block[self._used : self._used + take] = samples[:take]
            self._used += take
            self.total += take
            samples = samples[take:]
            if self._used == self._block_samples:
                self._full.append(self._block)
                self._block = np.empty(self._block_samples, np.float32)
                self._used = 0

    def join(self, limit: int) -> np.ndarray:
        """The first ``limit`` samples at most, as one array; the blocks are emptied."""
        self._full.append(self._block[: self._used])
        self._block = np.empty(0, np.float32)
        audio = np.empty(min(self.total, limit), np.float32)
        filled = 0
        while self._full and filled < audio.shape[0]:
            block = self._full.pop(0)
            take = min(block.shape[0], audio.shape[0] - filled)
            audio[filled : filled + take] = block[:take]
            filled += take
            del block
        self._full.clear()
        return audio


def decode_audio(data: bytes, limits: AudioLimits = AudioLimits(), on_progress: Callable[[float], None] | None = None,
                 deadline: float | None = None) -> np.ndarray:
    """Mono float32 samples at SAMPLE_RATE. While decoding, ``on_progress`` hears the seconds
    decoded so far (it may raise to stop the decode: admission by decoded audio), and past the
    ``deadline`` (time.monotonic()) the decode stops with TimeoutError."""
    if not data:
        raise InvalidAudioError("the file is empty")
    if len(data) > limits.max_bytes:
        raise AudioTooLargeError(f"upload of {len(data)} bytes exceeds the limit of {limits.max_bytes} bytes")
    max_samples = int(limits.max_seconds * SAMPLE_RATE)
    samples = _SampleBlocks(int(BLOCK_SECONDS * SAMPLE_RATE))
    reported = 0  # samples at the last progress report
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise InvalidAudioError("no audio stream found")
            _check_declared(stream, limits)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                if frame.sample_rate < MIN_SAMPLE_RATE:  # a stream may change its rate midway
                    raise InvalidAudioError(_low_rate(frame.sample_rate))
                if frame.layout.nb_channels > MAX_RESAMPLER_CHANNELS:
                    frame = _downmix(frame)
                for out in resampler.resample(frame):
                    samples.add(out.to_ndarray().reshape(-1))
                total = samples.total
                if total > max_samples:
                    raise AudioTooLongError(
                        f"audio is longer than the limit of {limits.max_seconds:g} seconds"
                    )
                if total - reported >= PROGRESS_EVERY_SECONDS * SAMPLE_RATE:
                    reported = total
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError
                    if on_progress is not None:
                        on_progress(total / SAMPLE_RATE)
            for out in resampler.resample(None):
                samples.add(out.to_ndarray().reshape(-1))
    except (AudioError, TimeoutError):  # TimeoutError is an OSError: not a decoding failure
        raise
    except (av.FFmpegError, ValueError, IndexError, OSError) as e:
        raise InvalidAudioError(f"could not decode audio ({type(e).__name__}: {e})") from None
    return _checked(samples, max_samples)


def _checked(samples: _SampleBlocks, max_samples: int) -> np.ndarray:
    """The decoded samples as one array, refused when there are none or any is not finite, and
    clipped to full scale."""
    if samples.total == 0:
        raise InvalidAudioError("no audio samples could be decoded")
    audio = samples.join(max_samples)
    # min and max carry a NaN through, and need no mask as large as the audio (isfinite's).
    if not (np.isfinite(audio.min()) and np.isfinite(audio.max())):
        raise InvalidAudioError("decoded samples are not finite")
    # Float formats may hold samples past full scale; the log-mel of 1e30 overflows to inf and the
    # model's caches to NaN. Past full scale is clipping anyway, as any PCM conversion would do.
    return np.clip(audio, -1.0, 1.0, out=audio)
