"""Engine-level figures on the pytest-audioeval clips, all modes measured in one run.

    python -m bench.engine_clips [--threads N] [--device cpu|cuda] [--out bench/results/engine-clips-DATE.json]

Per mode (fused detection, fixed language, two-stage detection) it times the 27 clips one at
a time and all at once (one batch), and reports WER per language family and detection
accuracy. Absolute seconds on a shared 2-core machine are noisy; compare ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import time
from pathlib import Path

import jiwer

from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions

from support.clips import all_clips, load_clip, reference
from .report import CHARACTER_SCORED  # scored by characters (CER), the rest by words
from support.textnorm import normalize as _normalize



def load_clips():
    return [(lang, name, load_clip(lang, name), reference(lang, name)) for lang, name in all_clips()]


def score_results(clips, results) -> dict:
    """Detection accuracy, WER (English; languages written with spaces) and CER (zh, ja)."""
    correct = sum(r.language == lang for (lang, *_), r in zip(clips, results))
    refs_w, hyps_w, refs_c, hyps_c = [], [], [], []
    for (lang, _, _, ref), r in zip(clips, results):
        if lang in CHARACTER_SCORED:
            refs_c.append(_normalize(ref).replace(" ", ""))
            hyps_c.append(_normalize(r.text).replace(" ", ""))
        else:
            refs_w.append(_normalize(ref))
            hyps_w.append(_normalize(r.text))
    english = [(_normalize(ref), _normalize(r.text)) for (lang, _, _, ref), r in zip(clips, results) if lang == "en"]
    return {
        "detection_accuracy": f"{correct}/{len(clips)}",
        "wer_english": round(jiwer.wer([a for a, _ in english], [b for _, b in english]), 4),
        "wer_space_languages": round(jiwer.wer(refs_w, hyps_w), 4),
        "cer_zh_ja": round(jiwer.cer(refs_c, hyps_c), 4),
    }


async def run_mode(rt, clips, mode: str) -> dict:
    def options(lang):
        if mode == "fixed":
            return TranscriptionOptions(language=lang)
        return TranscriptionOptions(detection="two-stage" if mode == "two-stage" else "fused")

    start = time.perf_counter()
    for lang, _, audio, _ in clips:
        await rt.transcriber.transcribe(audio, options(lang))
    sequential = time.perf_counter() - start
    start = time.perf_counter()
    results = await asyncio.gather(*(rt.transcriber.transcribe(a, options(lang)) for lang, _, a, _ in clips))
    batched = time.perf_counter() - start
    audio_seconds = sum(a.shape[0] for _, _, a, _ in clips) / 16000
    scores = score_results(clips, results)
    return {
        "mode": mode,
        "clips": len(clips),
        "audio_seconds": round(audio_seconds, 2),
        "sequential_seconds_per_clip": round(sequential / len(clips), 3),
        "batched_seconds_per_clip": round(batched / len(clips), 3),
        "sequential_rtfx": round(audio_seconds / sequential, 2),
        "batched_rtfx": round(audio_seconds / batched, 2),
        **scores,
    }


async def main_async(args) -> dict:
    rt = build_runtime(RuntimeSettings(threads=args.threads, quantize=args.quantize, device=args.device))
    clips = load_clips()
    # One warm-up pass so no mode pays first-call costs.
    await rt.transcriber.transcribe(clips[0][2], TranscriptionOptions())
    rows = [await run_mode(rt, clips, mode) for mode in ("fused", "fixed", "two-stage")]
    rt.close()
    fused, fixed, two = rows
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "device": str(rt.engine.device),
        "rows": rows,
        "ratios": {
            "fused_vs_fixed_batched_throughput": round(fixed["batched_seconds_per_clip"] / fused["batched_seconds_per_clip"], 3),
            "fused_vs_two_stage_batched_throughput": round(two["batched_seconds_per_clip"] / fused["batched_seconds_per_clip"], 3),
            "batched_vs_sequential_fused": round(fused["sequential_seconds_per_clip"] / fused["batched_seconds_per_clip"], 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quantize", choices=("int8",))
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when torch sees a GPU")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    out = args.out or Path(__file__).parent / "results" / f"engine-clips-{dt.date.today()}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    cols = list(report["rows"][0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in report["rows"]:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    print(json.dumps(report["ratios"]))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
