"""The cost and the gain of the long-form options, all measured in one run.

    python -m bench.long_form [--quantize int8] [--out FILE]

On the 27 pytest-audioeval clips (all at once, one batch) and on the bench's long file: WER
with and without temperature fallback and beam search, and throughput with and without word
timestamps.
Ratios of one run are what to quote; absolute seconds on a shared machine drift.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import tempfile
import time
from pathlib import Path

import jiwer

from asr_service.audio import decode_audio
from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions

from .engine_clips import load_clips, score_results
from support.textnorm import normalize
from .workloads import build_workloads

VARIANTS = {
    "greedy, no fallback": TranscriptionOptions(fallback_temperatures=()),
    "fallback (default)": TranscriptionOptions(),
    "fallback + word timestamps": TranscriptionOptions(word_timestamps=True),
    "fallback + segment timestamps": TranscriptionOptions(timestamps=True),
    "fallback + segment and word timestamps": TranscriptionOptions(timestamps=True, word_timestamps=True),
    "beam search (5), no fallback": TranscriptionOptions(beam_size=5, fallback_temperatures=()),
    "beam search (5) + fallback": TranscriptionOptions(beam_size=5),
}


async def measure(rt, clips, long, long_audio, options: TranscriptionOptions) -> dict:
    start = time.perf_counter()
    results = await asyncio.gather(*(rt.transcriber.transcribe(a, options) for _, _, a, _ in clips))
    clips_seconds = time.perf_counter() - start
    start = time.perf_counter()
    long_result = await rt.transcriber.transcribe(long_audio, options)
    long_seconds = time.perf_counter() - start
    audio = sum(a.shape[0] for _, _, a, _ in clips) / 16000
    return {
        "clips_rtfx": round(audio / clips_seconds, 2),
        "long_rtfx": round(long.seconds / long_seconds, 2),
        "long_wer": round(jiwer.wer(normalize(long.reference), normalize(long_result.text)), 4),
        **score_results(clips, results),
    }


async def main_async(args) -> dict:
    rt = build_runtime(RuntimeSettings(threads=args.threads, quantize=args.quantize))
    clips = load_clips()
    long = build_workloads(True, Path(tempfile.mkdtemp(prefix="asr-bench-")))["long"][0]
    long_audio = decode_audio(long.wav)  # as the server gets it: through the WAV file
    await rt.transcriber.transcribe(clips[0][2], TranscriptionOptions(word_timestamps=True))  # warm
    rows = {}
    for name, options in VARIANTS.items():
        before = rt.engine.submitted_total
        row = await measure(rt, clips, long, long_audio, options)
        row["decodes"] = rt.engine.submitted_total - before
        rows[name] = row
        print(name, row, flush=True)
    rt.close()
    base, words = rows["fallback (default)"], rows["fallback + word timestamps"]
    timed, timed_words = rows["fallback + segment timestamps"], rows["fallback + segment and word timestamps"]
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "quantize": args.quantize,
        "long_seconds": round(long.seconds, 1),
        "rows": rows,
        "ratios": {
            "word_timestamps_throughput_clips": round(words["clips_rtfx"] / base["clips_rtfx"], 3),
            "word_timestamps_throughput_long": round(words["long_rtfx"] / base["long_rtfx"], 3),
            "word_timestamps_throughput_long_timed": round(timed_words["long_rtfx"] / timed["long_rtfx"], 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int)
    parser.add_argument("--quantize", choices=("int8", "bf16"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    suffix = f"-{args.quantize}" if args.quantize else ""
    out = args.out or Path(__file__).parent / "results" / f"long-form-{dt.date.today()}{suffix}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"]))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
