"""Where the embedded engine's time goes, so the next speed-up starts from facts.

    python -m bench.decoder_profile [--threads 2] [--quantize bf16|int8] [--out bench/results/profile-DATE.json]

Three parts, one run, the packaged model (in float32, or as ``--quantize`` makes it):
1. The vocabulary projection (the largest matrix product of a decode step) for 1-64 rows, in
   the two float32 forms BLAS can run it: rows @ W.T (the textbook form) and engine/model.py's
   ``tall_projection``, and the model's own (in float32 on x86, fbgemm's product on float16
   weights: engine/quantize.py; bfloat16 with ``--quantize bf16``); best of five repeats each.
2. One decoder step's layers for rows reading their own audio, and beams sharing one
   (cross-attention K/V is what a step reads most).
3. The engine's phase clock (engine/phase_clock.py) over whole requests: the long-form
   conversation (support/dialogue.py) in json, json with 5 beams and verbose_json with word
   times, and the 27 pytest-audioeval clips at once. Seconds per phase, steps, tokens.
Absolute times on a shared machine are noisy; compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import tempfile
import time
from pathlib import Path

import soundfile as sf
import torch

from asr_service.engine.model import SharedAudio, tall_projection
from asr_service.model_loading import load_model
from asr_service.runtime import QUANTIZATIONS, RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions
from support.clips import all_clips, load_clip
from support.dialogue import write

PROJECTION_ROWS = (1, 2, 4, 8, 16, 32, 64)
STEP_SHAPES = ((1, 1), (4, 4), (8, 8), (16, 16), (5, 1), (15, 3), (40, 8))  # (rows, audios)
SELF_POSITIONS = 64


def best_ms(fn, repeats: int = 5, calls: int = 10) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return round(best * 1000, 2)


def projection_rows(decoder, weight: torch.Tensor) -> list[dict]:
    """The float32 forms over ``weight`` (the table in float32), and the model's own projection
    (tall_projection only where no layer replaced it: engine/quantize.py)."""
    rows = []
    for n in PROJECTION_ROWS:
        hidden = torch.randn(n, weight.shape[1])
        rows.append({"rows": n, "rows_at_weight_T_ms": best_ms(lambda: hidden @ weight.T),
                     "tall_projection_ms": best_ms(lambda: tall_projection(weight, hidden)),
                     "model_projection_ms": best_ms(lambda: decoder.logits(hidden))})
    return rows


def decoder_step_rows(decoder, dims) -> list[dict]:
    head_dim = dims.n_text_state // dims.n_text_head
    out = []
    for n, audios in STEP_SHAPES:
        caches = [tuple(torch.zeros(n, dims.n_text_head, SELF_POSITIONS, head_dim) for _ in "kv")
                  for _ in range(dims.n_text_layer)]
        cross = [tuple(torch.randn(audios, dims.n_text_head, dims.n_audio_ctx, head_dim) for _ in "kv")
                 for _ in range(dims.n_text_layer)]
        per = n // audios
        shared = None if per == 1 else SharedAudio.from_slots([row // per for row in range(n)])
        positions = torch.full((n, 1), SELF_POSITIONS // 2)
        tokens = torch.full((n, 1), 400)
        mask = (torch.arange(SELF_POSITIONS)[None, :] <= positions)[:, None, None, :]
        out.append({"rows": n, "audios": audios,
                    "decoder_layers_ms": best_ms(lambda: decoder(tokens, positions, caches, cross, mask, shared))})
    return out


async def request_rows(rt) -> list[dict]:
    paths = write(Path(tempfile.mkdtemp(prefix="profile-")))
    conversation = sf.read(paths["clean"], dtype="float32")[0]
    clips = [load_clip(lang, name) for lang, name in all_clips()]
    runs = [("long-form json", [conversation], TranscriptionOptions()),
            ("long-form json, 5 beams", [conversation], TranscriptionOptions(beam_size=5)),
            ("long-form verbose_json, word times", [conversation],
             TranscriptionOptions(timestamps=True, word_timestamps=True)),
            (f"{len(clips)} clips at once, json", clips, TranscriptionOptions())]
    await rt.transcriber.transcribe(clips[0], TranscriptionOptions())  # first-call costs out of the way
    rows = []
    for name, audios, options in runs:
        before = rt.engine.figures()
        start = time.perf_counter()
        await asyncio.gather(*(rt.transcriber.transcribe(a, options) for a in audios))
        wall = time.perf_counter() - start
        after = rt.engine.figures()
        phases = {p: round(s - before.phase_seconds[p], 2) for p, s in after.phase_seconds.items()}
        rows.append({"run": name, "audio_seconds": round(sum(a.shape[0] for a in audios) / 16000, 1),
                     "wall_seconds": round(wall, 2), "steps": after.steps - before.steps,
                     "tokens": after.tokens - before.tokens, "phase_seconds": phases,
                     "engine_seconds": round(sum(phases.values()), 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantize", choices=QUANTIZATIONS)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/profile-{datetime.date.today()}.json"))
    args = parser.parse_args()
    rt = build_runtime(RuntimeSettings(threads=args.threads, quantize=args.quantize))
    decoder = rt.engine.model.decoder
    with torch.inference_mode():
        report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
                  "quantize": args.quantize,
                  "projection": projection_rows(decoder, load_model().model.decoder.token_embedding.weight),
                  "decoder_step": decoder_step_rows(decoder, rt.engine.dims)}
    report["requests"] = asyncio.run(request_rows(rt))
    rt.close()
    args.out.write_text(json.dumps(report, indent=1))
    print("| rows | rows @ W.T ms | tall_projection ms | the model's projection ms |\n|---|---|---|---|")
    for r in report["projection"]:
        print(f"| {r['rows']} | {r['rows_at_weight_T_ms']} | {r['tall_projection_ms']} | {r['model_projection_ms']} |")
    print("\n| rows | audios | decoder layers ms |\n|---|---|---|")
    for r in report["decoder_step"]:
        print(f"| {r['rows']} | {r['audios']} | {r['decoder_layers_ms']} |")
    phases = list(report["requests"][0]["phase_seconds"])
    print("\n| run | audio s | wall s | steps | tokens | " + " | ".join(phases) + " |")
    print("|---" * (5 + len(phases)) + "|")
    for r in report["requests"]:
        print(f"| {r['run']} | {r['audio_seconds']} | {r['wall_seconds']} | {r['steps']} | {r['tokens']} | "
              + " | ".join(str(r["phase_seconds"][p]) for p in phases) + " |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
