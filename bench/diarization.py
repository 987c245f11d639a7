"""Who spoke when, scored against its truth, and what it adds to the transcription's time.

    python -m bench.diarization [--rounds 4] [--out bench/results/diarization-DATE.json]

Workloads (support/speakers.py, made on the spot): the four-voice conversation (115 s, 23 turns
of 0.3-37 s), the same with background noise at 0.003 RMS, and the whole script read by one
voice. Each goes through a real server on loopback as users send it: ``diarized_json``, and the
same decode without diarization (``verbose_json`` with word times, which diarization decodes
anyway), in ABBA order ``--rounds`` times after a warm-up request; the added cost is the ratio
of their median wall times, measured side by side. The diarization alone (in this process, the
server idle) is reported as a fraction of the transcription's median time too. Scored with pyannote.metrics: the diarization error rate with a 0.25 s
collar (missed speech, false alarm, confusion), and the number of speakers found.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import statistics
import time
from pathlib import Path

import httpx
import soundfile as sf
from pyannote.core import Annotation, Segment
from pyannote.metrics.diarization import DiarizationErrorRate

from asr_service.diarization.diarizer import Diarizer
from asr_service.diarization.voice_encoder import VoiceEncoder
from asr_service.speech_gate import SpeechGate
from support.server_process import ServerProcess
from support.speakers import NOISE_RMS, Turn, build, build_monologue, with_noise

COLLAR_S = 0.25


def der(truth: list[Turn], segments: list[dict]) -> dict:
    reference, hypothesis = Annotation(), Annotation()
    for t in truth:
        reference[Segment(t.start, t.end)] = t.speaker
    for s in segments:
        if s["end"] > s["start"]:
            hypothesis[Segment(s["start"], s["end"])] = s["speaker"]
    # The scored region is the audio's speech and the answer's, as pyannote does without a UEM.
    figures = DiarizationErrorRate(collar=COLLAR_S)(reference, hypothesis, detailed=True, uem=None)
    total = figures["total"]
    return {"der": round(figures["diarization error rate"], 4),
            **{k.replace(" ", "_"): round(figures[k] / total, 4) for k in ("missed detection", "false alarm", "confusion")}}


def timed_post(url: str, audio: bytes, fields: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", data=fields, files={"file": ("talk.wav", audio, "audio/wav")},
                   timeout=1800)
    seconds = time.perf_counter() - start
    r.raise_for_status()
    return seconds, r.json()


def run(url: str, name: str, samples, truth: list[Turn], rounds: int) -> dict:
    out = io.BytesIO()
    sf.write(out, samples, 16000, format="WAV", subtype="PCM_16")
    audio = out.getvalue()
    plain_fields = {"response_format": "verbose_json", "timestamp_granularities[]": "word"}
    diarized_fields = {"response_format": "diarized_json", "chunking_strategy": "auto"}
    plain, diarized, body = [], [], None
    for i in range(rounds):  # ABBA order: neither kind always goes first
        for kind in (("plain", "diarized") if i % 2 == 0 else ("diarized", "plain")):
            if kind == "plain":
                plain.append(timed_post(url, audio, plain_fields)[0])
            else:
                seconds, body = timed_post(url, audio, diarized_fields)
                diarized.append(seconds)
    found = sorted({s["speaker"] for s in body["segments"]})
    diarizer = Diarizer(SpeechGate(), VoiceEncoder.pretrained())  # alone, in this process, while the server idles
    alone = []
    for _ in range(rounds):
        start = time.perf_counter()
        diarizer.diarize(samples)
        alone.append(time.perf_counter() - start)
    return {"file": name, "seconds_of_audio": round(len(samples) / 16000, 1), "turns": len(truth),
            "speakers_true": len({t.speaker for t in truth}), "speakers_found": len(found), "found": found,
            **der(truth, body["segments"]),
            "transcription_s": [round(s, 2) for s in plain], "with_diarization_s": [round(s, 2) for s in diarized],
            "added_cost": round(statistics.median(diarized) / statistics.median(plain) - 1, 3),
            "diarization_alone_s": [round(s, 2) for s in alone],
            "alone_vs_transcription": round(statistics.median(alone) / statistics.median(plain), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path,
                        default=Path("bench/results") / f"diarization-{datetime.date.today().isoformat()}.json")
    args = parser.parse_args()
    conversation, truth = build()
    monologue, monologue_truth = build_monologue()
    files = [("conversation", conversation, truth), (f"conversation + noise {NOISE_RMS} RMS", with_noise(conversation), truth),
             ("one voice", monologue, monologue_truth)]
    server = ServerProcess()
    try:
        server.wait_ready()
        short, _ = build(short=True)
        warm = io.BytesIO()
        sf.write(warm, short, 16000, format="WAV", subtype="PCM_16")
        timed_post(server.url, warm.getvalue(), {"response_format": "diarized_json"})  # first-request costs, not measured
        rows = [run(server.url, name, samples, t, args.rounds) for name, samples, t in files]
    finally:
        server.stop()
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "collar_s": COLLAR_S,
              "rounds": args.rounds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for row in rows:
        print(f"{row['file']}: DER {row['der']:.1%} (miss {row['missed_detection']:.1%}, false alarm "
              f"{row['false_alarm']:.1%}, confusion {row['confusion']:.1%}), speakers {row['speakers_found']}/"
              f"{row['speakers_true']}, added wall time {row['added_cost']:+.1%} (diarization alone: "
              f"{row['alone_vs_transcription']:.1%} of the transcription's time)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
