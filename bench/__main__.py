"""Side-by-side speed and quality: this service against faster-whisper and HF, one run, same weights.

    python -m bench            # full: 27 clips, 1/4/8/16 clients, a 3 min conversation, all systems
    python -m bench --quick    # about 5 minutes: 12 clips, 1 and 8 clients, its first minute

Writes bench/results/<date>.json, .md and .png (throughput against concurrency).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import psutil

from .alternated import alternated
from .measure import measure
from .report import RESULTS, Row, ratios, rescore, write_outputs
from .systems import Peer, Service, faster_whisper
from .workloads import Request, build_workloads, wav_bytes


def encoder_efficiency() -> dict:
    """Encoder GFLOP/s against a same-shape matmul (the encoder's largest GEMM) in this process."""
    import torch

    from asr_service.engine.features import N_FRAMES
    from asr_service.model_loading import load_model

    torch.set_num_threads(os.cpu_count())
    model = load_model().model
    d = model.dims
    T, D = d.n_audio_ctx, d.n_audio_state
    flops = 2 * (d.n_mels * 3 * D * 2 * T + D * 3 * D * T)  # conv1 (3000 frames) + conv2 (1500)
    flops += d.n_audio_layer * 2 * (T * D * 3 * D + 2 * T * T * D + T * D * D + 2 * T * D * 4 * D)
    mel = torch.randn(1, d.n_mels, N_FRAMES)
    with torch.inference_mode():
        model.encoder(mel)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            model.encoder(mel)
            times.append(time.perf_counter() - start)
        a, b = torch.randn(T, D), torch.randn(D, 4 * D)
        a @ b
        reps, start = 50, time.perf_counter()
        for _ in range(reps):
            a @ b
        mm = 2 * T * D * 4 * D * reps / (time.perf_counter() - start)
    enc = flops / min(times)
    return {"encoder_gflop_per_window": round(flops / 1e9, 1), "encoder_seconds_per_window": round(min(times), 3),
            "encoder_gflops": round(enc / 1e9, 1), "matmul_gflops": round(mm / 1e9, 1),
            "encoder_vs_matmul": round(enc / mm, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rescore", type=Path, help="recompute the targets of a saved results .json")
    parser.add_argument("--levels", help="concurrency levels, e.g. 1,8,16 (default: 1,8 quick, else 1,4,8,16)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the default service and faster-whisper's best measured in turn (default 3)")
    args = parser.parse_args()
    if args.rescore:
        rescore(args.rescore)
        return
    levels = [int(c) for c in args.levels.split(",")] if args.levels else ([1, 8] if args.quick else [1, 4, 8, 16])
    tmp = Path(tempfile.mkdtemp(prefix="asr-bench-"))
    workloads = build_workloads(args.quick, tmp)
    short, long = workloads["short"], workloads["long"]
    print(f"short: {len(short)} clips, {sum(r.seconds for r in short):.0f} s; long: {long[0].seconds:.0f} s", flush=True)
    rows: list[Row] = []

    top = 8 if 8 in levels else levels[-1]  # the targets compare throughput at 8 clients
    fused = Service("service-fused")
    default_precision = fused.precision
    for c in levels:
        rows.append(measure(fused, "short", short, c, detect=True))
    rows.append(measure(fused, "long", long, 1, detect=True))
    stream_req = Request("stream-60s", "en", "", long[0].audio[: 60 * 16000])
    stream_req.wav = wav_bytes(stream_req.audio)
    fused.stream_first_delta(short[0])
    first, full_stream = fused.stream_first_delta(stream_req)
    full = fused.run([stream_req], 1)[1]
    streaming = {"input_s": 60, "first_delta_s": round(first, 3), "full_stream_s": round(full_stream, 3), "full_s": round(full, 3)}
    print(f"  streaming 60 s: first delta {first:.2f}s, stream end {full_stream:.2f}s, non-stream {full:.2f}s", flush=True)
    fused.stop()

    # The default (--quantize auto: bf16 where the CPU has AVX512-BF16 or AMX) against float32 and int8.
    for name, quantize in (("fp32", "none"), ("int8", "int8")):
        reduced = Service(f"service-fused-{name}", "--quantize", quantize)
        rows += [measure(reduced, "short", short, c, detect=True) for c in levels]
        rows.append(measure(reduced, "long", long, 1, detect=True))
        reduced.stop()
    # The detection ratios compare like with like (the default precision), at the top concurrency.
    fixed = Service("service-fixed", fixed_language=True)
    rows += [measure(fixed, "short", short, c, detect=False) for c in (levels if not args.quick else [top])]
    fixed.stop()
    two = Service("service-two-stage", "--detection-mode", "two-stage")
    rows += [measure(two, "short", short, c, detect=True) for c in (levels if not args.quick else [top])]
    two.stop()

    cores = str(os.cpu_count())
    precisions = ["int8"] if args.quick else ["int8", "float32"]
    for precision in precisions:
        short_name = "int8" if precision == "int8" else "f32"
        peer = faster_whisper(f"faster-whisper-{short_name}-sequential")
        rows += [measure(peer, "short", short, c, detect=True) for c in (levels if not args.quick else [1])]
        if precision == "int8":
            rows.append(measure(peer, "long", long, 1, detect=True))
        peer.stop()
        peer = faster_whisper(f"faster-whisper-{short_name}-workers")
        rows += [measure(peer, "short", short, c, detect=True) for c in (levels if not args.quick else [top])]
        peer.stop()
    batched = Peer("faster-whisper-int8-batched", "faster-whisper", "--compute-type", "int8", "--threads", cores, "--batched")
    rows.append(measure(batched, "long", long, 1, detect=True))
    batched.stop()
    if not args.quick:
        hf = Peer("hf-transformers-fixed", "hf", "--threads", cores, fixed_language=True)
        rows.append(measure(hf, "short", short, 1, detect=False))
        hf.stop()

    fw_best = max((r for r in rows if r.system.startswith("faster-whisper") and r.workload == "short"
                   and r.concurrency == top), key=lambda r: r.rtfx).system
    paired = alternated(short, top, fw_best, args.rounds)
    encoder = encoder_efficiency()
    print(f"  encoder: {encoder}", flush=True)
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "command": "python -m bench" + (" --quick" if args.quick else "") + (f" --levels {args.levels}" if args.levels else ""),
        "default_precision": default_precision,
        "rows": [r.as_dict() for r in rows],
        "streaming": streaming,
        "encoder": encoder,
        "alternated": paired,
    }
    stem = f"{dt.date.today()}{'-quick' if args.quick else ''}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")  # the rows survive a failure below
    report["targets"] = ratios(rows, streaming, encoder, paired)
    write_outputs(report, rows, stem)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
