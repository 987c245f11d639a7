"""Every accepted container decodes (files made here with PyAV); every bad input gets the typed error."""

import os
from pathlib import Path

import numpy as np
import pytest

from asr_service.audio import (
    AudioError,
    AudioLimits,
    AudioTooLargeError,
    AudioTooLongError,
    InvalidAudioError,
    decode_audio,
)
from support.clips import clip_path
from tests.helpers import encode, one_hertz_bomb

pytestmark = pytest.mark.unit

# (name as the OpenAI API calls it, container format, codec)
FORMATS = [
    ("flac", "flac", "flac"),
    ("mp3", "mp3", "libmp3lame"),
    ("mp4", "mp4", "aac"),
    ("mpeg", "mpeg", "mp2"),
    ("mpga", "mp3", "libmp3lame"),
    ("m4a", "ipod", "aac"),
    ("ogg", "ogg", "libopus"),  # this FFmpeg build has no libvorbis encoder
    ("wav", "wav", "pcm_s16le"),
    ("webm", "webm", "libopus"),
]


@pytest.mark.parametrize("name,container,codec", FORMATS, ids=[f[0] for f in FORMATS])
def test_every_format_decodes_to_mono_16k(name, container, codec):
    data = encode(container, codec)
    audio = decode_audio(data)
    assert audio.dtype == np.float32 and audio.ndim == 1
    # 1.5 s of audio at 16 kHz, give or take the codec's priming and padding.
    assert abs(audio.shape[0] / 16000 - 1.5) < 0.15, audio.shape[0] / 16000
    # The tone survives: energy near 0.3 / sqrt(2) RMS.
    assert 0.1 < float(np.sqrt(np.mean(audio[4000:-4000] ** 2))) < 0.4


def test_mono_and_odd_rates_are_resampled():
    audio = decode_audio(encode("wav", "pcm_s16le", seconds=2.0, rate=22050, layout="mono"))
    assert abs(audio.shape[0] - 32000) < 50


@pytest.mark.parametrize(
    "data",
    [
        b"",
        os.urandom(4096),
        b"this is plainly a text file, not audio\n" * 20,
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # a WAV header cut short
        b"\x1aE\xdf\xa3" + os.urandom(100),  # a webm magic number and noise
    ],
    ids=["empty", "random", "text", "truncated-wav-header", "fake-webm"],
)
def test_bad_bytes_raise_the_typed_error(data):
    with pytest.raises(InvalidAudioError) as e:
        decode_audio(data)
    assert "Invalid or unsupported audio file" in str(e.value)


def test_truncated_real_file_raises_the_typed_error():
    data = encode("mp4", "aac")
    with pytest.raises(InvalidAudioError):
        decode_audio(data[:64])


def test_upload_limit():
    data = encode("wav", "pcm_s16le")
    with pytest.raises(AudioTooLargeError):
        decode_audio(data, AudioLimits(max_bytes=len(data) - 1))


def test_duration_limit_stops_decoding_early():
    data = encode("webm", "libopus", seconds=4.0)  # its stream declares no duration: found while decoding
    with pytest.raises(AudioTooLongError) as e:
        decode_audio(data, AudioLimits(max_seconds=2.0))
    assert "header" not in str(e.value)
    assert decode_audio(data, AudioLimits(max_seconds=5.0)).shape[0] > 60000


def test_a_tiny_file_at_one_hertz_is_refused_before_decoding():
    """10,844 bytes that would resample into 3 hours of 16 kHz audio (a decompression bomb)."""
    with pytest.raises(InvalidAudioError) as e:
        decode_audio(one_hertz_bomb())
    assert "sample rate of 1 Hz" in str(e.value)


def test_speech_rates_from_telephony_up_are_accepted():
    assert decode_audio(encode("wav", "pcm_s16le", seconds=1.0, rate=8000, layout="mono")).shape[0] == 16000


def test_a_header_that_declares_too_long_a_duration_is_refused_before_decoding():
    data = encode("flac", "flac", seconds=4.0)
    with pytest.raises(AudioTooLongError) as e:
        decode_audio(data, AudioLimits(max_seconds=2.0))
    assert "as its header says" in str(e.value)


MEMORY_PROBE = """
import sys
import numpy as np
from asr_service.audio import AudioLimits, decode_audio
from tests.helpers import pcm16_wav

def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

minutes = float(sys.argv[1])
data = pcm16_wav(8000, np.tile((3000 * np.sin(np.arange(8000) * 0.3)).astype(np.int16), int(minutes * 60)))
before = kib("VmRSS")
audio = decode_audio(data, AudioLimits(max_bytes=len(data), max_seconds=minutes * 60 + 1))
print(audio.nbytes, (kib("VmHWM") - before) * 1024)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak RSS from /proc")
def test_a_long_upload_is_held_about_once_while_it_is_decoded():
    """Half an hour of audio (115 MB of float32 samples) decoded in a fresh process: its peak
    memory grows by the samples and one gathering block, not by twice the samples (which a join
    of the decoded frames at the end would cost)."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, "30"], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert probe.returncode == 0, probe.stderr
    samples_bytes, growth = map(int, probe.stdout.split())
    assert samples_bytes == 30 * 60 * 16000 * 4
    assert growth < 1.5 * samples_bytes, f"peak RSS grew {growth / 2**20:.0f} MiB for {samples_bytes / 2**20:.0f} MiB of samples"


@pytest.mark.parametrize("container", ["hls", "ffconcat", "dash"])
def test_an_upload_that_points_at_files_on_the_server_is_not_followed(tmp_path, container):
    """Playlists and concat lists name other files: an upload is data, so none is opened (FFmpeg
    reads the upload through PyAV's in-memory I/O, which gives demuxers no way to open more)."""
    secret = tmp_path / "secret.wav"
    secret.write_bytes(clip_path("en", "hello_world").read_bytes())
    listing = {
        "hls": f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:2.0,\nfile://{secret}\n#EXTINF:2.0,\n{secret}\n"
               "#EXT-X-ENDLIST\n",
        "ffconcat": f"ffconcat version 1.0\nfile '{secret}'\n",
        "dash": f'<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" '
                f'mediaPresentationDuration="PT2S"><Period><AdaptationSet mimeType="audio/wav"><Representation '
                f'id="a" bandwidth="256000"><BaseURL>file://{secret}</BaseURL></Representation></AdaptationSet>'
                f'</Period></MPD>',
    }[container]
    with pytest.raises(AudioError):
        decode_audio(listing.encode())
