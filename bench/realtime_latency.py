"""Realtime latency through a live server: how long after the end of speech the final text comes.

    python -m bench.realtime_latency [--clips 9] [--threads 2]

Real speech (the pytest-audioeval clips) is streamed in 100 ms frames at real-time pace to
/v1/realtime?intent=transcription. Per clip:
- server VAD (silence_duration_ms 500): from sending the frame that holds the clip's last
  loud sample to the completed event. This is the delay a user sees: the VAD's silence wait
  plus the final decode.
- manual commit (turn_detection null): from sending the commit to the completed event: the
  final decode alone.
- WER against the clip's reference of both completed texts and of the same clip sent as a file.
And once, ~10 s of speech with no pause: when the first delta arrives after speech starts.
With --load, that utterance is also streamed by 4 sessions at once (0.5 s apart, twice) while
8 clients send files to the same server without pause: the first delta's median and 90th
percentile under load, and how many file requests failed.
Writes bench/results/realtime-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import io
import json
import statistics
import time

import httpx
import jiwer
import numpy as np
import soundfile as sf
import websockets

from support.clips import all_clips, load_clip, reference
from support.textnorm import normalize
from .report import RESULTS
from support.server_process import ServerProcess

FRAME = 1600  # 100 ms at 16 kHz
SILENCE_MS = 500


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def last_loud_sample(audio: np.ndarray) -> int:
    return int(np.flatnonzero(np.abs(audio) > 0.02)[-1])


async def open_session(url: str, turn_detection: dict | None):
    ws = await websockets.connect(url + "?intent=transcription")
    await ws.recv()  # session.created
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": turn_detection}}}}))
    await ws.recv()  # session.updated
    return ws


async def stream(ws, audio: np.ndarray, marks: dict[int, str], times: dict[str, float]) -> None:
    """Send frames on a real-time clock; note when the frame holding each marked sample went out."""
    data, start = pcm16(audio), time.monotonic()
    for n, i in enumerate(range(0, len(audio), FRAME)):
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(data[2 * i : 2 * (i + FRAME)]).decode()}))
        for sample, name in marks.items():
            if i <= sample < i + FRAME:
                times[name] = time.monotonic()
        await asyncio.sleep(max(0.0, start + (n + 1) * 0.1 - time.monotonic()))


async def wait_for(ws, kind: str, times: dict[str, float], first: str | None = None) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if first and event["type"] == first and first not in times:
            times[first] = time.monotonic()
        if event["type"] == "error":
            raise RuntimeError(event)
        if event["type"] == kind:
            times[kind] = time.monotonic()
            return event


COMPLETED = "conversation.item.input_audio_transcription.completed"


async def vad_delay(url: str, speech: np.ndarray) -> tuple[float, str]:
    """Seconds from the end of speech to the (last) completed event, and every utterance's text."""
    ws = await open_session(url, {"type": "server_vad", "silence_duration_ms": SILENCE_MS})
    audio = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(24000, np.float32)])
    times: dict[str, float] = {}
    sender = asyncio.create_task(stream(ws, audio, {8000 + last_loud_sample(speech): "speech_end"}, times))
    texts = [(await wait_for(ws, COMPLETED, times))["transcript"]]
    await sender
    try:  # the VAD may have cut the clip into more than one utterance
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 2.0))
            if event["type"] == COMPLETED:
                times[COMPLETED] = time.monotonic()
                texts.append(event["transcript"])
    except TimeoutError:
        pass
    await ws.close()
    return times[COMPLETED] - times["speech_end"], " ".join(texts)


async def commit_delay(url: str, speech: np.ndarray) -> tuple[float, str]:
    ws = await open_session(url, None)
    times: dict[str, float] = {}
    await stream(ws, speech, {}, times)
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    start = time.monotonic()
    event = await wait_for(ws, COMPLETED, times)
    await ws.close()
    return times[COMPLETED] - start, event["transcript"]


def wav_bytes(audio: np.ndarray) -> bytes:
    """The same PCM16 samples the realtime sessions get (pcm16), as a WAV file."""
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm16(audio), dtype="<i2"), 16000, format="WAV", subtype="PCM_16")
    return wav.getvalue()


def word_error_rate(lang: str, name: str, text: str) -> float:
    """WER after the test suite's normaliser; characters for languages written without spaces."""
    ref, hyp = normalize(reference(lang, name)), normalize(text)
    if lang in ("ja", "zh"):
        ref, hyp = " ".join(ref.replace(" ", "")), " ".join(hyp.replace(" ", ""))
    return jiwer.wer(ref, hyp) if ref else float(bool(hyp))


def long_utterance() -> np.ndarray:
    """~10 s of speech without a pause."""
    def trimmed(name):
        audio = load_clip("en", name)
        loud = np.flatnonzero(np.abs(audio) > 0.02)
        return audio[max(0, loud[0] - 800) : loud[-1] + 800]

    gap = np.zeros(2400, np.float32)
    return np.concatenate([trimmed("counting"), gap, trimmed("quick_brown_fox"), gap, trimmed("counting")])


async def first_delta(url: str) -> dict:
    """The long utterance: how soon text shows, and how long the full text takes."""
    speech = long_utterance()
    ws = await open_session(url, {"type": "server_vad", "silence_duration_ms": SILENCE_MS})
    audio = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(24000, np.float32)])
    times: dict[str, float] = {}
    marks = {8000: "speech_start", 8000 + last_loud_sample(speech): "speech_end"}
    sender = asyncio.create_task(stream(ws, audio, marks, times))
    event = await wait_for(ws, COMPLETED, times, first="conversation.item.input_audio_transcription.delta")
    await sender
    await ws.close()
    delta = times.get("conversation.item.input_audio_transcription.delta")
    return {"speech_seconds": round(len(speech) / 16000, 2),
            "first_delta_after_speech_start_s": round(delta - times["speech_start"], 2) if delta else None,
            "completed_after_speech_end_s": round(times[COMPLETED] - times["speech_end"], 2),
            "transcript": event["transcript"]}


SESSIONS_UNDER_LOAD, FILE_CLIENTS, LOAD_ROUNDS = 4, 8, 2


def load_file_audio() -> np.ndarray:
    """What each file client sends under load: 21 s of speech."""
    return np.concatenate([load_clip("en", n) for n in ("counting", "quick_brown_fox", "hello_world")] * 3)


async def under_load(url: str, http_url: str) -> dict:
    """First deltas of SESSIONS_UNDER_LOAD sessions at once while FILE_CLIENTS send files."""
    body = wav_bytes(load_file_audio())
    stop, files = asyncio.Event(), {"ok": 0, "failed": 0}

    async def file_client(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                r = await client.post(http_url + "/v1/audio/transcriptions", files={"file": ("a.wav", body)},
                                      data={"model": "whisper-1"}, timeout=300)
                files["ok" if r.status_code == 200 else "failed"] += 1
            except httpx.HTTPError:
                files["failed"] += 1

    async def staggered(i: int) -> dict:
        await asyncio.sleep(0.5 * i)
        return await first_delta(url)

    async with httpx.AsyncClient() as client:
        clients = [asyncio.create_task(file_client(client)) for _ in range(FILE_CLIENTS)]
        await asyncio.sleep(5)  # the engine's batch is full of file windows
        sessions = []
        for _ in range(LOAD_ROUNDS):
            sessions += await asyncio.gather(*(staggered(i) for i in range(SESSIONS_UNDER_LOAD)))
        stop.set()
        await asyncio.gather(*clients)
    firsts = sorted(s["first_delta_after_speech_start_s"] or float("inf") for s in sessions)
    return {"sessions": len(sessions), "file_clients": FILE_CLIENTS,
            "first_delta_after_speech_start_s": {"median": statistics.median(firsts),
                                                 "p90": firsts[int(0.9 * (len(firsts) - 1) + 0.5)],
                                                 "all": firsts},
            "completed_after_speech_end_s": sorted(s["completed_after_speech_end_s"] for s in sessions),
            "file_requests": files}


async def run(url: str, http_url: str, clips: list[tuple[str, str]]) -> dict:
    per_clip = []
    for lang, name in clips:
        speech = load_clip(lang, name)
        vad, text = await vad_delay(url, speech)
        commit, committed_text = await commit_delay(url, speech)
        async with httpx.AsyncClient() as client:
            as_file = (await client.post(http_url + "/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(speech))},
                                         data={"model": "whisper-1"}, timeout=120)).json()["text"]
        per_clip.append({"clip": f"{lang}/{name}", "seconds": round(len(speech) / 16000, 2),
                         "speech_end_to_completed_s": round(vad, 3), "commit_to_completed_s": round(commit, 3),
                         "transcript": text, "committed_transcript": committed_text, "file_transcript": as_file,
                         "wer": {"vad": word_error_rate(lang, name, text),
                                 "commit": word_error_rate(lang, name, committed_text),
                                 "file": word_error_rate(lang, name, as_file)}})
        print(f"  {lang}/{name:16s} VAD: {vad:.2f} s  commit: {commit:.2f} s  {text!r}  WER vad/commit/file "
              f"{per_clip[-1]['wer']['vad']:.2f}/{per_clip[-1]['wer']['commit']:.2f}/{per_clip[-1]['wer']['file']:.2f}",
              flush=True)
    long = await first_delta(url)
    print(f"  10 s utterance: first delta {long['first_delta_after_speech_start_s']} s after speech start, "
          f"completed {long['completed_after_speech_end_s']} s after speech end", flush=True)

    def summary(key):
        values = sorted(c[key] for c in per_clip)
        return {"median": round(statistics.median(values), 3), "max": round(values[-1], 3)}

    wer = {kind: round(statistics.mean(c["wer"][kind] for c in per_clip), 4) for kind in ("vad", "commit", "file")}
    same = sum(c["committed_transcript"] == c["file_transcript"] for c in per_clip)
    return {"silence_duration_ms": SILENCE_MS, "mean_wer": wer, "committed_text_is_the_file_text": f"{same}/{len(per_clip)}",
            "speech_end_to_completed_s": summary("speech_end_to_completed_s"),
            "commit_to_completed_s": summary("commit_to_completed_s"), "long_utterance": long, "clips": per_clip}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=9, help="how many clips (one per language first)")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--quantize", choices=("int8", "bf16"))
    parser.add_argument("--load", action="store_true", help="also first deltas with file clients running")
    args = parser.parse_args()
    by_language: dict[str, list[str]] = {}
    for lang, name in all_clips():
        by_language.setdefault(lang, []).append(name)
    order = [(lang, names[i]) for i in range(3) for lang, names in sorted(by_language.items()) if i < len(names)]
    extra = ["--quantize", args.quantize] if args.quantize else []
    server = ServerProcess("--threads", args.threads, *extra)
    try:
        server.wait_ready()
        ws_url = server.url.replace("http://", "ws://") + "/v1/realtime"
        results = asyncio.run(run(ws_url, server.url, order[: args.clips]))
        if args.load:
            results["under_load"] = asyncio.run(under_load(ws_url, server.url))
            print(f"under load: {results['under_load']}", flush=True)
    finally:
        server.stop()
    results.update(date=dt.datetime.now().isoformat(timespec="seconds"), threads=args.threads, quantize=args.quantize)
    out = RESULTS / f"realtime-{dt.date.today().isoformat()}{'-' + args.quantize if args.quantize else ''}.json"
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False))
    print(f"mean WER (realtime VAD / realtime commit / file): {results['mean_wer']}; "
          f"VAD end of speech -> completed: {results['speech_end_to_completed_s']}; "
          f"commit -> completed: {results['commit_to_completed_s']}; written to {out}")


if __name__ == "__main__":
    main()
