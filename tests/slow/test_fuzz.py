"""Hostile input, property-based (hypothesis), against a live server: every case must end in a
4xx OpenAI-shaped error or a correct result, never a 5xx, a hang or unbounded memory.

CI runs a fixed number of examples with a fixed seed; `make fuzz` runs many more with fresh
randomness (ASR_FUZZ_EXAMPLES, ASR_FUZZ_RANDOM)."""

import os
import struct

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from asr_service.request_options import OPTIONS
from support.clips import clip_path, load_clip
from tests.helpers import encode_samples

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("ASR_FUZZ_EXAMPLES", "30"))
LONG_RUN = bool(os.environ.get("ASR_FUZZ_RANDOM"))
# CI: a fixed seed and no shrinking (each shrink step is a live request: a failure found in CI is
# reported as drawn; `make fuzz` shrinks it).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG_RUN, database=None,
                phases=list(Phase) if LONG_RUN else [Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_SECONDS = 120
CASES = {"count": 0}


@pytest.fixture(scope="module")
def server(start_server):
    yield start_server("--threads", "2", "--max-bytes", "2000000", "--max-seconds", str(MAX_SECONDS),
                       "--request-timeout", "60")
    print(f"\nfuzz: {CASES['count']} requests sent")


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def check(response: httpx.Response) -> None:
    """A correct result or a 4xx in OpenAI's shape; nothing else."""
    CASES["count"] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"]
    elif response.headers["content-type"].startswith("application/json"):
        body = response.json()
        assert isinstance(body["text"], str)


def post(server, data, files) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/transcriptions", data=data, files=files, timeout=120)


SPEECH = clip_path("en", "hello_world").read_bytes()
# Every field the form reads: the option table's (lists as name[]) and the response's own.
FIELDS = [o.name + "[]" if o.kind is list else o.name for o in OPTIONS] + [
    "model", "response_format", "stream", "stream_format", "stream_include_usage", "stream_continuous_usage_stats",
    "to_language"]
VALUES = st.one_of(st.text(max_size=40), st.sampled_from(["true", "false", "0", "1", "-1", "nan", "inf", "1e309", "",
                                                          "json", "verbose_json", "srt", "vtt", "text", "en", "xx",
                                                          "word", "segment", "chunk", "openai", "8", "0.5", "100000"]),
                   st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True).map(str))


@FUZZ
@given(fields=st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=20)), VALUES, max_size=8),
       with_file=st.booleans())
def test_form_fields(server, fields, with_file):
    files = {"file": ("hello.wav", SPEECH, "audio/wav")} if with_file else None
    check(post(server, fields, files))


# An empty value, a huge one, and bytes no field expects.
HOSTILE_VALUES = ["", "x" * 100_000, "\x00\ufffd{[\n\r<v>", "-1e309"]


@pytest.mark.parametrize("field", FIELDS)
def test_every_field_alone_with_empty_huge_and_malformed_values(server, field):
    """Each value is a correct result or a 4xx; a 400 names the field it is about."""
    for value in HOSTILE_VALUES:
        r = post(server, {field: value}, {"file": ("hello.wav", SPEECH, "audio/wav")})
        check(r)
        if r.status_code == 400:
            assert r.json()["error"]["param"] == field.removesuffix("[]"), (field, value[:40], r.text[:300])


def wav_header(channels: int, rate: int, bits: int, data_len: int, fmt: int = 1) -> bytes:
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", (36 + data_len) & 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, fmt, channels, rate, (rate * block) & 0xFFFFFFFF, block & 0xFFFF, bits) +
            b"data" + struct.pack("<I", data_len & 0xFFFFFFFF))


@FUZZ
@given(data=st.data())
def test_mutated_real_files(server, data):
    original = bytearray(SPEECH if data.draw(st.booleans()) else clip_path("fr", "pangrama").read_bytes())
    kind = data.draw(st.sampled_from(["flip", "truncate", "splice", "header"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 50))):
            i = data.draw(st.integers(0, len(original) - 1))
            original[i] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        original = original[: data.draw(st.integers(0, len(original)))]
    elif kind == "splice":
        at = data.draw(st.integers(0, len(original)))
        original[at:at] = data.draw(st.binary(max_size=2000))
    else:  # a random header on real samples: channels, rates, widths, lengths that lie
        header = wav_header(data.draw(st.integers(0, 70000)), data.draw(st.integers(0, 2**32 - 1)),
                            data.draw(st.sampled_from([0, 1, 8, 16, 24, 32, 64, 65535])),
                            data.draw(st.integers(0, 2**32 - 1)), data.draw(st.sampled_from([1, 3, 6, 7, 0xFFFE, 0])))
        original = bytearray(header) + original[44:]
    check(post(server, {"response_format": "json"}, {"file": ("x.wav", bytes(original), "audio/wav")}))


@FUZZ
@given(blob=st.binary(max_size=5000), name=st.sampled_from(["x.wav", "x.mp3", "x.flac", "x.ogg", "x", "x.mp4"]))
def test_random_bytes(server, blob, name):
    check(post(server, {}, {"file": (name, blob, "application/octet-stream")}))


def test_edge_files_and_a_decompression_bomb(server):
    """Explicit cases: empty, a header that claims 4 GB over 1 s of samples, 32 channels,
    extreme sample rates, and a small FLAC that decodes to an hour of audio (the limit is
    MAX_SECONDS: it must be refused while decoding, without holding the hour in memory)."""
    before = rss_mb(server.proc.pid)
    speech = load_clip("en", "hello_world")
    pcm = (speech * 32767).astype("<i2").tobytes()
    cases = {
        "empty": b"",
        "claims 4 GB": wav_header(1, 16000, 16, 0xFFFFFFF0) + pcm,
        "32 channels": wav_header(32, 16000, 16, len(pcm) * 32) + np.repeat(np.frombuffer(pcm, "<i2"), 32).tobytes(),
        "1 Hz": wav_header(1, 1, 16, len(pcm)) + pcm,
        "384 kHz": wav_header(1, 384000, 16, len(pcm)) + pcm,
        "hour of silence": encode_samples(np.zeros((1, 3600 * 8000), dtype=np.int16), 8000, "mono", "flac", "s16",
                                          "flac"),
    }
    assert len(cases["hour of silence"]) < 2_000_000  # small on the wire
    for name, blob in cases.items():
        r = post(server, {}, {"file": (f"{name}.wav", blob, "audio/wav")})
        check(r)
        if name in ("empty", "hour of silence"):
            assert r.status_code in (400, 413), (name, r.text)
        if name == "hour of silence":
            assert r.json()["error"]["code"] == "audio_too_long", r.text
        if name in ("claims 4 GB", "32 channels"):
            assert r.status_code == 200 and r.json()["text"] == "Hello world.", (name, r.text)
    assert rss_mb(server.proc.pid) - before < 300  # the hour was never held


def test_server_is_healthy_and_idle_after_the_fuzzing(server):
    health = httpx.get(server.url + "/health").json()
    assert health["active_sequences"] == 0 and health["pending_requests"] == 0
    r = post(server, {}, {"file": ("hello.wav", SPEECH, "audio/wav")})
    assert r.status_code == 200 and r.json()["text"] == "Hello world."
