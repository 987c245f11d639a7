"""Diarization over HTTP, as OpenAI's SDK asks for it (``gpt-4o-transcribe-diarize``,
``diarized_json``, known speakers as data URLs) and in the other timed formats, through a real
server on loopback; the audio is the short four-voice set of support/speakers.py."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
import soundfile as sf
from openai.types.audio import TranscriptionDiarized

from support.clips import clip_path, load_clip
from support.dialogue import synthesize
from support.speakers import VOICES
from tests.helpers import assert_openai_error

pytestmark = pytest.mark.server


def wav(audio) -> bytes:
    out = io.BytesIO()
    sf.write(out, audio, 16000, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def conversation(four_voices):
    audio, truth = four_voices
    return wav(audio), truth


ADDRESS_SPACE = 8 * 2**30  # a server that read a device without end would fail here, not take the machine


@pytest.fixture(scope="module")
def server(start_server):
    # The default served names, OpenAI's diarizing model among them.
    return start_server("--threads", "2", address_space=ADDRESS_SPACE)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def post(server, data: dict, audio: bytes) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/transcriptions", data=data,
                      files={"file": ("talk.wav", audio, "audio/wav")}, timeout=300)


def speaker_of_each_turn(truth, segments) -> list[tuple[str, str]]:
    """(true speaker, the speaker of the segments covering most of that turn) for every turn."""
    out = []
    for turn in truth:
        cover = Counter()
        for s in segments:
            cover[s["speaker"]] += max(0.0, min(turn.end, s["end"]) - max(turn.start, s["start"]))
        out.append((turn.speaker, cover.most_common(1)[0][0]))
    return out


def assert_one_found_speaker_per_voice(pairs):
    mapping = dict(pairs)
    assert len(mapping) == 4 and len(set(mapping.values())) == 4 and all(mapping[t] == h for t, h in pairs), pairs
    return mapping


def test_the_sdk_gets_speaker_labelled_segments_in_openais_shape(client, conversation):
    audio, truth = conversation
    result = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize", file=("talk.wav", audio),
                                                response_format="diarized_json", chunking_strategy="auto")
    assert isinstance(result, TranscriptionDiarized) and result.task == "transcribe"
    segments = [s.model_dump() for s in result.segments]
    assert all(s["type"] == "transcript.text.segment" and s["text"] for s in segments)
    assert len({s["id"] for s in segments}) == len(segments)
    assert_one_found_speaker_per_voice(speaker_of_each_turn(truth, segments))
    assert [s["speaker"] for s in segments][0] == "A"
    assert " ".join(s["text"] for s in segments).split() == result.text.split()  # every word in a segment
    assert abs(result.duration - truth[-1].end) < 1.0 and result.usage.seconds >= result.duration


def test_a_diarized_stream_sends_text_as_it_comes_then_each_segment_with_its_speaker(client, conversation):
    audio, truth = conversation
    stream = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize", file=("talk.wav", audio),
                                                response_format="diarized_json", stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    first_segment = kinds.index("transcript.text.segment")
    assert kinds[0] == "transcript.text.delta" and kinds[-1] == "transcript.text.done", kinds
    assert set(kinds[first_segment:-1]) == {"transcript.text.segment"}, kinds  # segments after all the text
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == events[-1].text
    segments = [e.model_dump() for e in events if e.type == "transcript.text.segment"]
    assert_one_found_speaker_per_voice(speaker_of_each_turn(truth, segments))


def test_verbose_json_and_subtitles_carry_the_speakers(server, conversation):
    audio, truth = conversation
    body = post(server, {"response_format": "verbose_json", "diarize": "true",
                         "timestamp_granularities[]": ["word", "segment"]},
                audio).json()
    mapping = assert_one_found_speaker_per_voice(speaker_of_each_turn(truth, body["segments"]))
    assert body["words"] and all("speaker" in s for s in body["segments"])
    srt = post(server, {"response_format": "srt", "diarize": "true"}, audio).text
    cues = [block.split("\n")[2] for block in srt.strip().split("\n\n")]
    assert all(cue.split(": ", 1)[0] in mapping.values() for cue in cues), cues
    plain = post(server, {"response_format": "verbose_json"}, audio).json()  # not asked: no speakers
    assert all("speaker" not in s for s in plain["segments"]) and "words" not in plain


def test_known_speakers_name_their_voices(server, conversation):
    audio, truth = conversation
    clips = {name: wav(synthesize(VOICES[voice], text)) for name, voice, text in (
        ("Alice", "A", "My name is on the list at the front desk, please ask there first."),
        ("Carl", "C", "Every evening the river rises a little, and by morning it falls again."))}
    urls = ["data:audio/wav;base64," + base64.b64encode(clip).decode() for clip in clips.values()]
    r = httpx.post(server.url + "/v1/audio/transcriptions", timeout=300,
                   data={"response_format": "diarized_json", "known_speaker_names[]": list(clips),
                         "known_speaker_references[]": urls},
                   files={"file": ("talk.wav", audio, "audio/wav")})
    assert r.status_code == 200, r.text
    mapping = assert_one_found_speaker_per_voice(speaker_of_each_turn(truth, r.json()["segments"]))
    assert mapping["A"] == "Alice" and mapping["C"] == "Carl"
    assert {mapping["B"], mapping["D"]} == {"A", "B"}  # the others keep letters


def test_what_cannot_apply_is_refused_and_the_server_stays_well(server, conversation):
    audio, _ = conversation
    one_second = "data:audio/wav;base64," + base64.b64encode(wav([0.0] * 16000)).decode()
    cases = [
        ({"response_format": "diarized_json", "prompt": "Hello"}, "prompt"),
        ({"response_format": "diarized_json", "min_speakers": "3", "max_speakers": "2"}, "min_speakers"),
        ({"response_format": "diarized_json", "known_speaker_names[]": "Alice"}, "known_speaker_names"),
        ({"response_format": "diarized_json", "known_speaker_names[]": "Alice",
          "known_speaker_references[]": "data:audio/wav;base64,@@@"}, "known_speaker_references"),
        ({"response_format": "diarized_json", "known_speaker_names[]": "Alice",
          "known_speaker_references[]": one_second}, "known_speaker_references"),
        ({"response_format": "json", "diarize": "true"}, "diarize"),
        ({"response_format": "json", "max_speakers": "2"}, "max_speakers"),
        ({"response_format": "diarized_json", "stream": "true", "stream_format": "chunk"}, "stream_format"),
        ({"response_format": "srt", "diarize": "true", "stream": "true"}, "stream"),
        ({"response_format": "verbose_json", "diarize": "true", "stream": "true", "stream_format": "chunk"},
         "stream_format"),
    ]
    for fields, param in cases:
        r = post(server, fields, audio)
        assert r.status_code == 400, (fields, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error", (fields, error)
    translated = httpx.post(server.url + "/v1/audio/translations", data={"response_format": "diarized_json"},
                            files={"file": ("talk.wav", audio, "audio/wav")}, timeout=60)
    assert translated.status_code == 400 and translated.json()["error"]["param"] == "response_format"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert json.loads(post(server, {"response_format": "json"}, wav([0.0] * 32000)).text)["text"] == ""


# ---- hostile input: references are data, names are plain, reference audio is work ----

def data_url(audio: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(audio).decode()


def known_speakers(names: list[str], references: list[str]) -> dict:
    return {"response_format": "diarized_json", "known_speaker_names[]": names, "known_speaker_references[]": references}


def test_a_reference_that_names_a_path_or_device_is_refused_unread(server):
    """Over HTTP a reference is a data URL: a path on the server (a device that never ends, a
    secret, a real audio file, a folder, nothing) gets one and the same 400 at once, so the
    answer tells nothing about the server's disk."""
    audio = clip_path("en", "counting").read_bytes()
    messages = set()
    for path in ("/dev/zero", "/dev/urandom", "/etc/passwd", "/root/.ssh/id_rsa", str(clip_path("en", "hello_world")),
                 "/tmp", "/no/such/file", "file:///etc/passwd"):
        started = time.monotonic()
        r = post(server, known_speakers(["Alice"], [path]), audio)
        error = assert_openai_error(r, 400, param="known_speaker_references")
        assert time.monotonic() - started < 10, path  # nothing was read: no decode, no timeout
        messages.add(error["message"])
    assert len(messages) == 1, messages
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_speaker_names_that_would_forge_a_cue_or_a_tag_are_refused(server):
    audio = clip_path("en", "counting").read_bytes()
    reference = data_url(clip_path("en", "quick_brown_fox").read_bytes())
    for name in ("Bob\n\n2\n00:00:00,000 --> 00:00:09,000\nforged", "Bob>evil", "</v>Bob", "A\rB"):
        for response_format in ("srt", "vtt"):
            r = post(server, {"response_format": response_format, "diarize": "true", "known_speaker_names[]": name,
                              "known_speaker_references[]": reference}, audio)
            assert_openai_error(r, 400, param="known_speaker_names")
    named = post(server, {"response_format": "vtt", "diarize": "true", "known_speaker_names[]": "Dr. Ann O'Neil",
                          "known_speaker_references[]": reference}, audio)
    assert named.status_code == 200, named.text


def audio_seconds_billed(server) -> float:
    metrics = httpx.get(server.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("asr_audio_seconds_total{") and "transcriptions" in line)


def test_reference_audio_is_billed_as_work(server):
    audio = clip_path("en", "counting").read_bytes()
    reference = data_url(clip_path("en", "quick_brown_fox").read_bytes())
    before = audio_seconds_billed(server)
    r = post(server, known_speakers(["Ann", "Bo"], [reference, reference]), audio)
    assert r.status_code == 200, r.text
    expected = (len(load_clip("en", "counting")) + 2 * len(load_clip("en", "quick_brown_fox"))) / 16000
    assert audio_seconds_billed(server) - before == pytest.approx(expected, abs=0.05)


def test_reference_audio_counts_toward_the_per_request_limit(start_server):
    limited = start_server("--threads", "1", "--max-seconds", "7")
    audio = clip_path("en", "counting").read_bytes()  # 3 s: within the limit alone
    reference = data_url(clip_path("en", "quick_brown_fox").read_bytes())  # 2.9 s
    assert post(limited, known_speakers(["Ann"], [reference]), audio).status_code == 200
    r = post(limited, known_speakers(["Ann", "Bo"], [reference, reference]), audio)  # 8.8 s in all
    error = assert_openai_error(r, 400, param="known_speaker_references", code="audio_too_long")
    assert "together" in error["message"]


CLI = str(Path(sys.executable).parent / "asr-service")


def test_the_cli_writes_rttm_and_speaker_labelled_subtitles(tmp_path, conversation):
    audio, truth = conversation
    talk = tmp_path / "team meeting.wav"
    talk.write_bytes(audio)
    subprocess.run([CLI, "transcribe", str(talk), "--response-format", "rttm", "--output-dir", str(tmp_path)],
                   capture_output=True, text=True, timeout=300, check=True)
    lines = [line.split() for line in (tmp_path / "team meeting.rttm").read_text().splitlines()]
    assert all(f[0] == "SPEAKER" and f[1] == "team_meeting" and len(f) == 10 for f in lines), lines
    turns = [{"start": float(f[3]), "end": float(f[3]) + float(f[4]), "speaker": f[7]} for f in lines]
    assert_one_found_speaker_per_voice(speaker_of_each_turn(truth, turns))
    done = subprocess.run([CLI, "transcribe", str(talk), "--response-format", "vtt", "--diarize", "--max-speakers", "2"],
                          capture_output=True, text=True, timeout=300, check=True)
    voices = {line[3:line.index(">")] for line in done.stdout.splitlines() if line.startswith("<v ")}
    assert voices == {"A", "B"}, done.stdout
