"""Where a realtime utterance's time goes: one session, in process, instrumented.

    python -m bench.realtime_breakdown [--threads 2] [--out PATH]
    python -m bench.realtime_breakdown --load [--out PATH]

Speech is fed to a RealtimeSession (server VAD, 500 ms) in 100 ms frames on a real-time clock,
as the WebSocket would. The session's transcriber is wrapped so that every decode it asks for
is recorded: preview or final, how much audio, when it was asked for and when it ended, and
the engine's phase seconds it spent (the embedded engine's clock; with one session running, the
clock's growth over a decode is that decode's work). Each session event is stamped too. Per
utterance this gives the timeline from speech start to the first delta and from speech end to
the completed text, and the sum of what each part cost. Writes
bench/results/realtime-breakdown-<date>.json.

With --load, the same in process under load (bench.realtime_latency's load, without the
network): SESSIONS_UNDER_LOAD sessions on the 10 s utterance at once (0.5 s apart, LOAD_ROUNDS
times) while FILE_CLIENTS loops transcribe its 21 s file as file requests would; per session
the first delta and every decode's wall time (the engine's phases are shared then, so they are
not split per decode). Writes bench/results/realtime-breakdown-load-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import soundfile as sf

from asr_service.realtime.events import Completed, SpeechStarted, SpeechStopped, TextDelta
from asr_service.realtime.session import RealtimeSession, SessionConfig
from asr_service.realtime.turn_detection import TurnDetectionSettings
from asr_service.request_options import build_options
from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription import Transcriber
from asr_service.transcription_types import TranscriptionOptions
from support.clips import load_clip
from asr_service.warmup import run_warmup

from .realtime_latency import FILE_CLIENTS, LOAD_ROUNDS, SESSIONS_UNDER_LOAD, load_file_audio, long_utterance
from .report import RESULTS

FRAME = 1600  # 100 ms at 16 kHz
SILENCE_MS = 500
LEAD_S, TAIL_S = 0.5, 1.5  # silence before and after the speech


@dataclass
class DecodeRecord:
    kind: str  # "preview" or "final"
    audio_s: float
    asked: float  # session clock seconds
    ended: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    text: str = ""
    cancelled: bool = False


class RecordingTranscriber:
    """The session's transcriber, with every decode recorded (same interface as Transcriber)."""

    def __init__(self, inner: Transcriber, clock):
        self.inner, self.clock = inner, clock
        self.adapter, self.gate, self.engine = inner.adapter, inner.gate, inner.engine
        self.decodes: list[DecodeRecord] = []

    async def transcribe(self, audio: np.ndarray, options: TranscriptionOptions, live_since: float):
        # Previews are the decodes with a token budget (session._decode_partial); finals have none.
        record = DecodeRecord("preview" if options.max_new_tokens is not None else "final",
                              round(audio.shape[0] / 16000, 2), self.clock())
        self.decodes.append(record)
        before = self.engine.figures().phase_seconds
        try:
            result = await self.inner.transcribe(audio, options, live_since=live_since)
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        finally:
            record.ended = self.clock()
            after = self.engine.figures().phase_seconds
            record.phases = {k: round(after[k] - before[k], 3) for k in after if after[k] > before[k]}
        record.text = result.text
        return result


def read_wav(path: str) -> np.ndarray:
    audio, rate = sf.read(path, dtype="float32")
    if rate != 16000 or audio.ndim != 1:
        raise SystemExit(f"{path}: a 16 kHz mono file is needed")
    return audio


async def one_session(runtime, speech: np.ndarray) -> dict:
    start = time.monotonic()

    def clock() -> float:
        return round(time.monotonic() - start, 3)

    transcriber = RecordingTranscriber(runtime.transcriber, clock)
    events: list[tuple[float, object]] = []
    file_decode = build_options({}, runtime.adapter, "transcribe", "json", default_beam_size=runtime.default_beam_size)
    session = RealtimeSession(transcriber, lambda e: events.append((clock(), e)), file_decode,
                              config=SessionConfig(turn_detection=TurnDetectionSettings(silence_duration_ms=SILENCE_MS)))
    worker = asyncio.create_task(session.run())
    lead, tail = np.zeros(int(LEAD_S * 16000), np.float32), np.zeros(int(TAIL_S * 16000), np.float32)
    audio = np.concatenate([lead, speech, tail])
    loud = np.flatnonzero(np.abs(speech) > 0.02)
    speech_start = float(lead.size + loud[0]) / 16000  # on the feed's real-time clock
    speech_end = float(lead.size + loud[-1]) / 16000
    try:
        for n, i in enumerate(range(0, audio.size, FRAME)):
            await session.append(audio[i: i + FRAME])
            await asyncio.sleep(max(0.0, start + (n + 1) * FRAME / 16000 - time.monotonic()))
        async with asyncio.timeout(60):
            while not session.idle:
                await asyncio.sleep(0.02)
    finally:
        worker.cancel()
    first_delta = next((t for t, e in events if isinstance(e, TextDelta)), None)
    # Speech with pauses ends in several utterances: the last one's text comes after speech ends.
    completed = [(t, e) for t, e in events if isinstance(e, Completed)][-1]
    timeline = []
    for t, e in events:
        if isinstance(e, TextDelta):
            timeline.append({"t": t, "event": "delta", "text": e.text})
        elif isinstance(e, (SpeechStarted, SpeechStopped)):
            timeline.append({"t": t, "event": type(e).__name__})
        elif isinstance(e, Completed):
            timeline.append({"t": t, "event": "completed", "text": e.text})
    previews = [d for d in transcriber.decodes if d.kind == "preview"]
    return {
        "speech_start_s": round(speech_start, 2), "speech_end_s": round(speech_end, 2),
        "first_delta_after_speech_start_s": round(first_delta - speech_start, 2) if first_delta else None,
        "completed_after_speech_end_s": round(completed[0] - speech_end, 2),
        "completed_texts": [e.text for _, e in events if isinstance(e, Completed)],
        "first_preview_asked_after_speech_start_s": round(previews[0].asked - speech_start, 2) if previews else None,
        "preview_seconds": [round(d.ended - d.asked, 2) for d in previews],
        "decodes": [vars(d) for d in transcriber.decodes],
        "events": timeline,
    }


async def under_load(runtime) -> dict:
    """First deltas of SESSIONS_UNDER_LOAD sessions at once while FILE_CLIENTS transcribe files."""
    body = load_file_audio()
    file_decode = build_options({}, runtime.adapter, "transcribe", "json", default_beam_size=runtime.default_beam_size)
    stop, files = asyncio.Event(), {"done": 0, "failed": 0}

    async def file_client() -> None:
        while not stop.is_set():
            try:
                await runtime.transcriber.transcribe(body, file_decode)
                files["done"] += 1
            except Exception:
                files["failed"] += 1

    async def staggered(i: int) -> dict:
        await asyncio.sleep(0.5 * i)
        return await one_session(runtime, long_utterance())

    clients = [asyncio.create_task(file_client()) for _ in range(FILE_CLIENTS)]
    await asyncio.sleep(5)  # the engine's batch is full of file windows
    sessions = []
    for _ in range(LOAD_ROUNDS):
        sessions += await asyncio.gather(*(staggered(i) for i in range(SESSIONS_UNDER_LOAD)))
        print("first deltas:", [s["first_delta_after_speech_start_s"] for s in sessions[-SESSIONS_UNDER_LOAD:]],
              flush=True)
    stop.set()
    await asyncio.gather(*clients)
    firsts = sorted(s["first_delta_after_speech_start_s"] or float("inf") for s in sessions)
    return {"sessions": len(sessions), "file_clients": FILE_CLIENTS,
            "first_delta_after_speech_start_s": {"median": statistics.median(firsts),
                                                 "p90": firsts[int(0.9 * (len(firsts) - 1) + 0.5)], "all": firsts},
            "completed_after_speech_end_s": sorted(s["completed_after_speech_end_s"] for s in sessions),
            "file_requests": files, "per_session": sessions}


def summary(decodes: list[dict], kind: str) -> dict:
    chosen = [d for d in decodes if d["kind"] == kind and not d["cancelled"]]
    if not chosen:
        return {}
    walls = [d["ended"] - d["asked"] for d in chosen]
    phases: dict[str, float] = {}
    for d in chosen:
        for k, v in d["phases"].items():
            phases[k] = phases.get(k, 0.0) + v
    return {"count": len(chosen), "wall_s_median": round(statistics.median(walls), 3),
            "engine_phase_s_mean": {k: round(v / len(chosen), 3) for k, v in sorted(phases.items())},
            "outside_engine_s_mean": round((sum(walls) - sum(phases.values())) / len(chosen), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clips", nargs="*", default=["long", "en/quick_brown_fox", "en/hello_world", "es/pangrama"],
                        help="'long' (10 s, no pause), lang/name of a pytest-audioeval clip, or a 16 kHz mono .wav")
    parser.add_argument("--load", action="store_true", help="sessions beside file requests instead (see above)")
    parser.add_argument("--out")
    args = parser.parse_args()
    runtime = build_runtime(RuntimeSettings(device="cpu", threads=args.threads))
    if args.load:
        return main_under_load(runtime, args)

    async def run() -> dict:
        await run_warmup(runtime.adapter, runtime.engine)
        results = {}
        for name in args.clips:
            speech = (long_utterance() if name == "long" else read_wav(name) if name.endswith(".wav")
                      else load_clip(*name.split("/")))
            results[name] = await one_session(runtime, speech)
            r = results[name]
            print(f"{name}: first preview asked {r['first_preview_asked_after_speech_start_s']} s after speech start, "
                  f"previews took {r['preview_seconds']}, first delta {r['first_delta_after_speech_start_s']} s, "
                  f"completed {r['completed_after_speech_end_s']} s after speech end", flush=True)
        return results

    try:
        per_clip = asyncio.run(run())
    finally:
        runtime.close()
    decodes = [d for r in per_clip.values() for d in r["decodes"]]
    out = {"date": dt.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
           "precision": runtime.precision, "silence_duration_ms": SILENCE_MS,
           "first_delta_after_speech_start_s": {
               "median": statistics.median(r["first_delta_after_speech_start_s"] for r in per_clip.values()),
               "max": max(r["first_delta_after_speech_start_s"] for r in per_clip.values())},
           "completed_after_speech_end_s": {
               "median": statistics.median(r["completed_after_speech_end_s"] for r in per_clip.values()),
               "max": max(r["completed_after_speech_end_s"] for r in per_clip.values())},
           "preview": summary(decodes, "preview"), "final": summary(decodes, "final"), "clips": per_clip}
    print(json.dumps({k: out[k] for k in ("first_delta_after_speech_start_s", "completed_after_speech_end_s",
                                          "preview", "final")}, indent=1))
    write(out, args.out or RESULTS / f"realtime-breakdown-{dt.date.today().isoformat()}.json")


def main_under_load(runtime, args) -> None:
    async def run() -> dict:
        await run_warmup(runtime.adapter, runtime.engine)
        return await under_load(runtime)

    try:
        out = asyncio.run(run())
    finally:
        runtime.close()
    out = {"date": dt.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
           "precision": runtime.precision, **out}
    print(json.dumps({k: out[k] for k in ("first_delta_after_speech_start_s", "completed_after_speech_end_s",
                                          "file_requests")}))
    write(out, args.out or RESULTS / f"realtime-breakdown-load-{dt.date.today().isoformat()}.json")


def write(out: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(out, f, indent=2, ensure_ascii=False)
    print("written to", path)


if __name__ == "__main__":
    main()
