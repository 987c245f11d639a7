"""Long audio as users send it, judged against its truth.

A three-minute conversation (support/dialogue.py: four synthetic voices, a 15 s silence before
the first word, pauses of 0.3-1.6 s, one 8 s silence, turns that run across 30 s marks) goes
through a real server in every response format. Every utterance must be in every format, the
timed formats must carry one transcript, no word may sit inside a silence or repeat at a seam,
and the word onsets must be within the targets of the long-audio issue.
"""

from __future__ import annotations

import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from asr_service.transcription_types import TranscriptionOptions
from asr_service.window_decode import WindowDecode
from support.dialogue import VOICE_DIRS, Utterance, read_truth, write
from support.transcript_score import score, subtitles, tokens

pytestmark = pytest.mark.server

FORMATS = ("json", "verbose_json", "srt", "vtt")
WORDS_AND_SEGMENTS = {"response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]}


def _missing_tools() -> list[str]:
    missing = [tool for tool in ("text2wave", "espeak-ng") if shutil.which(tool) is None]
    return missing + [str(d) for d in VOICE_DIRS if not Path(d).is_dir()]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    missing = _missing_tools()
    if missing:
        pytest.skip(f"speech synthesizers missing ({', '.join(missing)}); `make test` installs them as root")
    return write(tmp_path_factory.mktemp("dialogue"), monologue=True, slow=True)


@pytest.fixture(scope="module")
def dialogue(made) -> tuple[Path, list[Utterance]]:
    return made["clean"], read_truth(made["truth"])


def _post(url: str, audio: bytes, **fields) -> httpx.Response:
    r = httpx.post(url + "/v1/audio/transcriptions", data=fields, files={"file": ("talk.wav", audio, "audio/wav")},
                   timeout=600)
    assert r.status_code == 200, r.text
    return r


@pytest.fixture(scope="module")
def server(start_server, dialogue):
    return start_server()


def _concurrently(*calls):
    """The calls' results, the calls sent together: the server batches their windows, as it does
    for a user's concurrent requests, and each decode is the one it gets alone."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


@pytest.fixture(scope="module")
def transcripts(server, dialogue) -> dict[str, dict]:
    """Each format's text, scored: words with times for verbose_json, cues for srt and vtt; and
    json's stream (deltas, done event). The verbose_json decode runs alone: a stream's segments
    are compared with it float for float. The others, text alone, are sent together."""
    path, truth = dialogue
    audio = path.read_bytes()
    body = _post(server.url, audio, **WORDS_AND_SEGMENTS).json()
    words = [(w["word"], w["start"], w["end"]) for w in body["words"]]
    out = {"verbose_json": {"text": body["text"], "score": score(truth, body["text"], words), "body": body}}
    json_text, json_stream, *subtitled = _concurrently(
        lambda: _post(server.url, audio, response_format="json").json()["text"], lambda: _streamed(server.url, audio),
        *(lambda fmt=fmt: _post(server.url, audio, response_format=fmt).text for fmt in ("srt", "vtt")))
    out["json"] = {"text": json_text, "score": score(truth, json_text), "stream": json_stream}
    for fmt, reply in zip(("srt", "vtt"), subtitled):
        text, cues = subtitles(reply)
        out[fmt] = {"text": text, "score": score(truth, text, cues=cues)}
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_utterance_is_in_every_format(transcripts, dialogue, fmt):
    found = transcripts[fmt]["score"]
    assert found["missing"] == [], f"{fmt} lost: {found['missing']}"
    assert found["first_words_found"] == len(dialogue[1])


def test_every_format_carries_one_transcript(transcripts):
    # Every format is one decode with timestamps (request_options.build_options): json holds the
    # words the subtitles do.
    texts = {fmt: " ".join(tokens(transcripts[fmt]["text"])) for fmt in FORMATS}
    assert len(set(texts.values())) == 1, texts
    assert transcripts["json"]["text"] == transcripts["verbose_json"]["text"]


@pytest.mark.parametrize("fmt", ["verbose_json", "srt", "vtt"])
def test_no_word_inside_a_silence(transcripts, fmt):
    # The 15 s lead-in, the 8 s silence and every pause of 1 s or more (0.2 s margins).
    assert transcripts[fmt]["score"]["words_in_silence"] == 0


def _repeats(words: list[str]) -> set[tuple[str, ...]]:
    """Word sequences of 2-4 words said twice in a row: what a seam decoded twice leaves. (One
    repeated word is as often a misheard one next to its like: "paper cup in? In the".)"""
    return {tuple(words[i:i + n]) for n in range(2, 5) for i in range(len(words) - 2 * n + 1)
            if words[i:i + n] == words[i + n:i + 2 * n]}


def test_no_words_repeated_at_seams(transcripts, dialogue):
    said = [w for u in dialogue[1] for w in tokens(u.text)]
    heard = tokens(transcripts["verbose_json"]["text"])
    assert _repeats(heard) <= _repeats(said)
    segments = transcripts["verbose_json"]["body"]["segments"]
    assert all(a["end"] <= b["start"] + 0.02 for a, b in zip(segments, segments[1:])), "segments overlap"


def _covered(utterance: Utterance, segments: list[dict]) -> float:
    """The share of the utterance's time that output segments span."""
    overlap = sum(max(0.0, min(s["end"], utterance.end) - max(s["start"], utterance.start)) for s in segments)
    return overlap / (utterance.end - utterance.start)


def _streamed(url: str, audio: bytes, **fields) -> tuple[list[str], dict]:
    """(the deltas, the done event) of a stream=true request."""
    r = _post(url, audio, stream="true", **fields)
    payloads = [json.loads(line[len("data: "):]) for line in r.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]
    assert payloads and payloads[-1]["type"] == "transcript.text.done", payloads[-1:]
    return [p["delta"] for p in payloads if p["type"] == "transcript.text.delta"], payloads[-1]


@pytest.fixture(scope="module")
def monologue(server, made) -> dict[str, dict]:
    """The monologue's truth, its bytes, and its verbose_json response (decoded alone: its stream
    is compared with it float for float)."""
    audio = made["monologue"].read_bytes()
    return {"truth": read_truth(made["monologue_truth"]), "audio": audio,
            "verbose_json": _post(server.url, audio, **WORDS_AND_SEGMENTS).json()}


@pytest.mark.parametrize("talk", ["dialogue", "monologue"])
def test_a_stream_is_the_full_response_released_early(server, made, transcripts, monologue, talk):
    """Byte for byte: the deltas add up to the done event's text, which is the stream=false text,
    and the done event's segments and words are the response's, float for float. On the dialogue
    (pauses, an 8 s silence, turns across window seams) and on the monologue (no pause to cut at)."""
    audio, full = {"dialogue": (made["clean"].read_bytes(), transcripts["verbose_json"]["body"]),
                   "monologue": (monologue["audio"], monologue["verbose_json"])}[talk]
    deltas, done = _streamed(server.url, audio, **WORDS_AND_SEGMENTS)
    assert "".join(deltas) == done["text"] == full["text"]
    assert done["segments"] == full["segments"] and done["words"] == full["words"]


def test_a_json_stream_is_its_response_released_early(transcripts):
    """The dialogue as json, streamed: the deltas add up to the done event's text, which is the
    stream=false json text byte for byte."""
    deltas, done = transcripts["json"]["stream"]
    assert "".join(deltas) == done["text"] == transcripts["json"]["text"]


def test_speech_without_pauses_loses_nothing_where_windows_cut_it(monologue):
    """The monologue: no pause for the windows to end in, so each is cut inside speech and a
    timed decode tends to stop at its last complete segment; the seek decodes the rest. Lost
    speech is speech no segment spans (a misheard sentence is still there: WER is the bench's)."""
    truth = monologue["truth"]
    said = [w for u in truth for w in tokens(u.text)]
    timed = monologue["verbose_json"]
    assert [u.text for u in truth if _covered(u, timed["segments"]) < 0.8] == []
    assert score(truth, timed["text"])["missing"] == []
    assert _repeats(tokens(timed["text"])) <= _repeats(said), timed["text"]


async def test_a_slow_conversation_shares_windows_and_keeps_every_word_in_its_place(server, made, runtime):
    """Pauses of 1.5-4 s between turns: the windows leave the pauses out and hold several turns
    each (one encoder pass per window), and every word still comes back at its own time: no
    utterance lost, none inside a pause, onsets within the targets, segments in order."""
    truth = read_truth(made["slow_truth"])
    audio, rate = sf.read(made["slow"], dtype="float32")
    windows = await (await runtime.transcriber.plan(audio, TranscriptionOptions(timestamps=True))).all_windows()
    assert len(windows) <= len(truth) // 3, [(w.start, w.end) for w in windows]
    assert sum(len(w.joins) for w in windows) >= len(truth) // 2
    body = _post(server.url, made["slow"].read_bytes(), **WORDS_AND_SEGMENTS).json()
    found = score(truth, body["text"], [(w["word"], w["start"], w["end"]) for w in body["words"]])
    assert found["missing"] == [], found
    assert found["words_in_silence"] == 0, found
    assert found["onset_median_s"] <= 0.2 and found["onset_p90_s"] <= 0.4, found
    segments = body["segments"]
    assert all(a["end"] <= b["start"] + 0.02 for a, b in zip(segments, segments[1:])), "segments overlap"
    assert all(s["start"] <= s["end"] <= body["duration"] for s in segments)
    # Segments start and end at speech, never inside a pause (a left-out one included).
    for s in segments:
        inside = [u for u in truth if u.start - 0.5 < s["end"] and s["start"] < u.end + 0.5]
        assert inside and s["start"] >= inside[0].start - 1.0 and s["end"] <= inside[-1].end + 1.0, s


def test_word_onsets_are_within_the_targets(transcripts):
    found = transcripts["verbose_json"]["score"]
    assert found["onset_median_s"] <= 0.2 and found["onset_p90_s"] <= 0.4, found


def test_a_long_lead_in_silence_inside_one_window_invents_nothing(server, dialogue):
    """Audio of at most 30 s: 15 s of silence, then one utterance."""
    path, truth = dialogue
    audio, rate = sf.read(path, dtype="float32")
    first = truth[0]
    speech = audio[int(first.start * rate):int(first.end * rate)]
    clip = np.concatenate([np.zeros(15 * rate, np.float32), speech, np.zeros(rate, np.float32)])
    assert clip.shape[0] / rate <= 30
    wav = io.BytesIO()
    sf.write(wav, clip, rate, format="WAV", subtype="PCM_16")
    body = _post(server.url, wav.getvalue(), response_format="verbose_json",
                 **{"timestamp_granularities[]": ["word", "segment"]}).json()
    assert score([Utterance(first.speaker, first.text, 15.0, 15.0 + first.end - first.start)], body["text"],
                 [(w["word"], w["start"], w["end"]) for w in body["words"]])["words_in_silence"] == 0
    assert tokens(body["text"])[:2] == tokens(first.text)[:2], body["text"]


async def test_a_long_file_decodes_while_it_is_still_scanned_a_few_windows_at_a_time(made, runtime, monkeypatch):
    """A long upload's VAD scan runs a block at a time and each window is handed out as soon as
    no speech found later can change it, so decoding starts before the scan ends (an hour's
    scan takes seconds); and a request keeps only a few windows submitted at once, the next
    planned as one ends, so that a long file neither holds every window's samples nor queues
    every window ahead of the requests after it. Scanned in blocks of 10 s, the slow
    conversation gets the windows and the speech regions of the usual blocks; decoded two
    windows at a time, its first window is submitted while most of the file is still
    unscanned, never more than two are decoded at once, and every utterance comes back."""
    truth = read_truth(made["slow_truth"])
    audio, _ = sf.read(made["slow"], dtype="float32")
    options = TranscriptionOptions(timestamps=True, beam_size=1)
    usual = await runtime.transcriber.plan(audio, options)
    usual_windows = await usual.all_windows()

    gate, engine = runtime.transcriber.gate, runtime.transcriber.engine
    monkeypatch.setattr(gate, "streams_per_scan", 2)
    events: list[str] = []
    scan_block, submit = gate.frame_probabilities, engine.submit
    monkeypatch.setattr(gate, "frame_probabilities", lambda *a: events.append("scan") or scan_block(*a))
    monkeypatch.setattr(engine, "submit", lambda *a: events.append("submit") or submit(*a))

    blocks = await runtime.transcriber.plan(audio, options)
    windows = await blocks.all_windows()
    assert events.count("scan") >= 15
    assert blocks.speech == usual.speech
    assert [(w.start_sample, w.joins) for w in windows] == [(w.start_sample, w.joins) for w in usual_windows]
    assert all(np.array_equal(w.samples, u.samples) for w, u in zip(windows, usual_windows))

    monkeypatch.setattr(engine, "max_request_windows", 2)
    decoding, most = 0, 0
    decode_window = WindowDecode.run

    async def counted(self, *args):
        nonlocal decoding, most
        decoding += 1
        most = max(most, decoding)
        try:
            return await decode_window(self, *args)
        finally:
            decoding -= 1

    monkeypatch.setattr(WindowDecode, "run", counted)
    events.clear()
    result = await runtime.transcriber.transcribe(audio, options)
    scanned_before_decoding = events[: events.index("submit")].count("scan")
    assert scanned_before_decoding < events.count("scan") // 2, events
    assert most == 2 < len(windows)
    assert score(truth, result.text)["missing"] == []
