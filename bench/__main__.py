"""Side-by-side speed and quality: this service against faster-whisper and HF, one run, same weights.

    python -m bench            # full: 27 clips, 1/4/8/16 clients, 4 min long file, all systems
    python -m bench --quick    # about 5 minutes: 12 clips, 1 and 8 clients, 1 min long file

Writes bench/results/<date>.json, .md and .png (throughput against concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jiwer
import numpy as np
import psutil
import soundfile as sf

from .clips import all_clips, load_clip, reference
from .server_process import ServerProcess
from .textnorm import normalize

RESULTS = Path(__file__).parent / "results"
CHARACTER_SCORED = {"zh", "ja"}


@dataclass
class Request:
    name: str
    language: str
    reference: str
    audio: np.ndarray
    path: str = ""
    wav: bytes = b""

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / 16000


@dataclass
class Outcome:
    text: str
    language: str | None
    latency_s: float


@dataclass
class Row:
    system: str
    workload: str
    concurrency: int
    requests: int
    audio_s: float
    wall_s: float
    p50_s: float
    p95_s: float
    wer: float | None
    cer: float | None
    detection: float | None
    peak_rss_mb: float
    extra: dict = field(default_factory=dict)

    @property
    def rtfx(self) -> float:
        return self.audio_s / self.wall_s

    def as_dict(self) -> dict:
        d = self.__dict__.copy()
        d["rtfx"] = round(self.rtfx, 2)
        d["req_per_s"] = round(self.requests / self.wall_s, 3)
        return d


def _wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def build_workloads(quick: bool, tmp: Path) -> dict[str, list[Request]]:
    clips = [c for c in all_clips() if not quick or c[0] in ("en", "es", "fr", "zh")]
    short = [Request(f"{lang}/{name}", lang, reference(lang, name), load_clip(lang, name)) for lang, name in clips]
    # A long file of real English speech with silences between sentences. The counting clip is
    # left out: the model writes it as "12345678910" or "1, 2, 3", and a normaliser cannot
    # score that difference fairly over minutes of audio.
    english = [r for r in short if r.language == "en" and not r.name.endswith("counting")]
    target = 60 if quick else 240
    pieces, refs, t = [], [], 0.0
    while t < target:
        for r in english:
            pieces += [r.audio, np.zeros(int(1.5 * 16000), np.float32)]
            refs.append(r.reference)
            t += r.seconds + 1.5
    long = [Request("long-en", "en", " ".join(refs), np.concatenate(pieces))]
    workloads = {"short": short, "long": long}
    for reqs in workloads.values():
        for i, r in enumerate(reqs):
            r.wav = _wav(r.audio)
            r.path = str(tmp / f"{i}-{r.name.replace('/', '_')}.wav")
            Path(r.path).write_bytes(r.wav)
    return workloads


class RssSampler:
    """Peak resident memory of a process and its children, sampled every 50 ms."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss + sum(c.memory_info().rss for c in self.proc.children(recursive=True))
                self.peak = max(self.peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def score(system: str, workload: str, concurrency: int, reqs: list[Request], outcomes: list[Outcome],
          wall: float, peak_rss: int, detect: bool) -> Row:
    words = [(normalize(r.reference), normalize(o.text)) for r, o in zip(reqs, outcomes) if r.language not in CHARACTER_SCORED]
    chars = [(normalize(r.reference).replace(" ", ""), normalize(o.text).replace(" ", ""))
             for r, o in zip(reqs, outcomes) if r.language in CHARACTER_SCORED]
    latencies = sorted(o.latency_s for o in outcomes)
    return Row(
        system=system, workload=workload, concurrency=concurrency, requests=len(reqs),
        audio_s=round(sum(r.seconds for r in reqs), 2), wall_s=round(wall, 3),
        p50_s=round(statistics.median(latencies), 3),
        p95_s=round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 3),
        wer=round(jiwer.wer([a for a, _ in words], [b for _, b in words]), 4) if words else None,
        cer=round(jiwer.cer([a for a, _ in chars], [b for _, b in chars]), 4) if chars else None,
        detection=round(sum(o.language == r.language for r, o in zip(reqs, outcomes)) / len(reqs), 3) if detect else None,
        peak_rss_mb=round(peak_rss / 2**20, 1),
    )


class Service:
    """This service over HTTP: a real server process, requests with or without a language."""

    def __init__(self, name: str, *server_args: str, fixed_language: bool = False):
        self.name, self.fixed_language = name, fixed_language
        self.server = ServerProcess("--threads", str(os.cpu_count()), *server_args)
        self.server.wait_ready()
        self.pid = self.server.proc.pid

    async def _one(self, client: httpx.AsyncClient, r: Request) -> Outcome:
        data = {"response_format": "verbose_json"}
        if self.fixed_language:
            data["language"] = r.language
        start = time.perf_counter()
        resp = await client.post(self.server.url + "/v1/audio/transcriptions", data=data,
                                 files={"file": ("a.wav", r.wav, "audio/wav")}, timeout=600)
        resp.raise_for_status()
        body = resp.json()
        return Outcome(body["text"], body["language"], time.perf_counter() - start)

    def run(self, reqs: list[Request], concurrency: int) -> tuple[list[Outcome], float]:
        async def go():
            sem = asyncio.Semaphore(concurrency)
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 2)) as client:
                async def limited(r):
                    async with sem:
                        return await self._one(client, r)

                start = time.perf_counter()
                outcomes = await asyncio.gather(*(limited(r) for r in reqs))
                return outcomes, time.perf_counter() - start

        return asyncio.run(go())

    def stream_first_delta(self, r: Request) -> tuple[float, float]:
        """(seconds to the first delta, seconds to the whole streamed response)."""
        start = time.perf_counter()
        first = None
        with httpx.stream("POST", self.server.url + "/v1/audio/transcriptions", data={"stream": "true"},
                          files={"file": ("a.wav", r.wav, "audio/wav")}, timeout=600) as resp:
            for line in resp.iter_lines():
                if first is None and "transcript.text.delta" in line:
                    first = time.perf_counter() - start
        return first or float("nan"), time.perf_counter() - start

    def stop(self):
        self.server.stop()


class Peer:
    """faster-whisper or HF in a worker process (bench/peer_worker.py)."""

    def __init__(self, name: str, *worker_args: str, fixed_language: bool = False):
        self.name, self.fixed_language = name, fixed_language
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.peer_worker", *worker_args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     cwd=Path(__file__).resolve().parent.parent)
        assert json.loads(self.proc.stdout.readline())["ready"]
        self.pid = self.proc.pid

    def run(self, reqs: list[Request], concurrency: int) -> tuple[list[Outcome], float]:
        job = {"files": [r.path for r in reqs], "concurrency": concurrency,
               "languages": [r.language if self.fixed_language else None for r in reqs]}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        outcomes = [Outcome(o["text"], o["language"], o["latency_s"]) for o in answer["results"]]
        return outcomes, answer["wall_s"]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def measure(system, workload: str, reqs: list[Request], concurrency: int, detect: bool) -> Row:
    system.run(reqs[:1], 1)  # warm: first-call costs are not what is measured
    with RssSampler(system.pid) as rss:
        outcomes, wall = system.run(reqs, concurrency)
    row = score(system.name, workload, concurrency, reqs, outcomes, wall, rss.peak, detect)
    print(f"  {row.system:24s} {workload:5s} c={concurrency:<2d} rtfx={row.rtfx:6.2f} p50={row.p50_s:.2f}s "
          f"wer={row.wer} det={row.detection} rss={row.peak_rss_mb}MB", flush=True)
    return row


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


def ratios(rows: list[Row], streaming: dict, encoder: dict) -> list[dict]:
    def get(system, workload, c):
        return next((r for r in rows if r.system == system and r.workload == workload and r.concurrency == c), None)

    # The targets: throughput at 8 clients, memory at the most clients measured.
    levels = {r.concurrency for r in rows if r.workload == "short"}
    top = 8 if 8 in levels else max(levels)
    most = max(levels)
    peers = [r for r in rows if r.system.startswith("faster-whisper") and r.workload == "short"]
    fw_best_top = max((r for r in peers if r.concurrency == top), key=lambda r: r.rtfx)
    fw_best_1 = min((r for r in peers if r.concurrency == 1), key=lambda r: r.p50_s)
    out = []
    for service in ("service-fused-int8", "service-fused"):
        s_top, s_1 = get(service, "short", top), get(service, "short", 1)
        out += [
            (f"{service} @{top} throughput / faster-whisper best @{top}", s_top.rtfx / fw_best_top.rtfx, ">=", 2.0, fw_best_top.system),
            (f"{service} latency p50 @1 / faster-whisper best @1", s_1.p50_s / fw_best_1.p50_s, "<=", 1.0, fw_best_1.system),
        ]
        for peer, want in (("faster-whisper-int8-batched", 1.0), ("faster-whisper-int8-sequential", 2.0)):
            if (p := get(peer, "long", 1)) is not None:
                out.append((f"long audio: {service} / {peer}", get(service, "long", 1).rtfx / p.rtfx, ">=", want, ""))
        out.append((f"WER points: {service} - faster-whisper", 100 * ((s_top.wer or 0) - (fw_best_top.wer or 0)), "<=", 0.5, fw_best_top.system))
        out.append((f"detection: {service} - faster-whisper", (s_top.detection or 0) - (fw_best_top.detection or 0), ">=", 0.0, fw_best_top.system))
        out.append((f"peak RSS GB @{most} clients: {service}", get(service, "short", most).peak_rss_mb / 1024, "<=", 1.5, ""))
    fused = get("service-fused", "short", top)
    out += [
        (f"fused / fixed-language throughput @{top}", fused.rtfx / get("service-fixed", "short", top).rtfx, ">=", 0.95, "fp32"),
        (f"fused / two-stage throughput @{top}", fused.rtfx / get("service-two-stage", "short", top).rtfx, ">=", 1.5, "fp32"),
        ("streaming 60 s: first delta / full response", streaming["first_delta_s"] / streaming["full_s"], "<=", 0.5, "fp32"),
        ("encoder GFLOP/s / matmul GFLOP/s", encoder["encoder_vs_matmul"], ">=", 0.70, "fp32"),
    ]
    return [{"target": name, "value": round(v, 3), "want": f"{op} {w}", "met": (v >= w) if op == ">=" else (v <= w), "versus": vs}
            for name, v, op, w, vs in out]


def write_outputs(report: dict, rows: list[Row], stem: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    cols = ["system", "workload", "concurrency", "rtfx", "req_per_s", "p50_s", "p95_s", "wer", "cer", "detection", "peak_rss_mb"]
    lines = [f"Machine: {report['machine']}; run {report['date']}; command `{report['command']}`", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.as_dict()[c]) for c in cols) + " |" for r in rows]
    lines += ["", "| target | measured | want | met | versus |", "|---|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['value']} | {t['want']} | {'yes' if t['met'] else 'no'} | {t['versus']} |" for t in report["targets"]]
    lines += ["", f"Streaming: {report['streaming']}", f"Encoder: {report['encoder']}"]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system in dict.fromkeys(r.system for r in rows):
        pts = sorted((r.concurrency, r.rtfx) for r in rows if r.system == system and r.workload == "short")
        if len(pts) > 1:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("audio seconds per wall second (short clips)")
    ax.set_title(f"Throughput, whisper-base, {report['machine']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)


def rescore(path: Path) -> None:
    """Recompute the targets of a saved run (same measurements) and rewrite its .json and .md."""
    report = json.loads(path.read_text())
    rows = [Row(**{k: v for k, v in r.items() if k not in ("rtfx", "req_per_s")}) for r in report["rows"]]
    report["targets"] = ratios(rows, report["streaming"], report["encoder"])
    write_outputs(report, rows, path.stem)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rescore", type=Path, help="recompute the targets of a saved results .json")
    args = parser.parse_args()
    if args.rescore:
        rescore(args.rescore)
        return
    levels = [1, 8] if args.quick else [1, 4, 8, 16]
    tmp = Path(tempfile.mkdtemp(prefix="asr-bench-"))
    workloads = build_workloads(args.quick, tmp)
    short, long = workloads["short"], workloads["long"]
    print(f"short: {len(short)} clips, {sum(r.seconds for r in short):.0f} s; long: {long[0].seconds:.0f} s", flush=True)
    rows: list[Row] = []

    top = levels[-1]
    fused = Service("service-fused")
    for c in levels:
        rows.append(measure(fused, "short", short, c, detect=True))
    rows.append(measure(fused, "long", long, 1, detect=True))
    stream_req = Request("stream-60s", "en", "", long[0].audio[: 60 * 16000])
    stream_req.wav = _wav(stream_req.audio)
    fused.stream_first_delta(short[0])
    first, full_stream = fused.stream_first_delta(stream_req)
    full = fused.run([stream_req], 1)[1]
    streaming = {"input_s": 60, "first_delta_s": round(first, 3), "full_stream_s": round(full_stream, 3), "full_s": round(full, 3)}
    print(f"  streaming 60 s: first delta {first:.2f}s, stream end {full_stream:.2f}s, non-stream {full:.2f}s", flush=True)
    fused.stop()

    int8 = Service("service-fused-int8", "--quantize", "int8")
    rows += [measure(int8, "short", short, c, detect=True) for c in levels]
    rows.append(measure(int8, "long", long, 1, detect=True))
    int8.stop()
    # The detection ratios compare like with like (fp32), at the top concurrency.
    fixed = Service("service-fixed", fixed_language=True)
    rows += [measure(fixed, "short", short, c, detect=False) for c in (levels if not args.quick else [top])]
    fixed.stop()
    two = Service("service-two-stage", "--detection-mode", "two-stage")
    rows += [measure(two, "short", short, c, detect=True) for c in (levels if not args.quick else [top])]
    two.stop()

    cores = str(os.cpu_count())
    # faster-whisper's configurations on this machine: one model and all threads (requests
    # queue), or one worker per core; and its BatchedInferencePipeline for long audio.
    sequential = ["--threads", cores, "--num-workers", "1"]
    workers = ["--threads", "1", "--num-workers", cores]
    precisions = ["int8"] if args.quick else ["int8", "float32"]
    for precision in precisions:
        short_name = "int8" if precision == "int8" else "f32"
        peer = Peer(f"faster-whisper-{short_name}-sequential", "faster-whisper", "--compute-type", precision, *sequential)
        rows += [measure(peer, "short", short, c, detect=True) for c in (levels if not args.quick else [1])]
        if precision == "int8":
            rows.append(measure(peer, "long", long, 1, detect=True))
        peer.stop()
        peer = Peer(f"faster-whisper-{short_name}-workers", "faster-whisper", "--compute-type", precision, *workers)
        rows += [measure(peer, "short", short, c, detect=True) for c in (levels if not args.quick else [top])]
        peer.stop()
    batched = Peer("faster-whisper-int8-batched", "faster-whisper", "--compute-type", "int8", "--threads", cores, "--batched")
    rows.append(measure(batched, "long", long, 1, detect=True))
    batched.stop()
    if not args.quick:
        hf = Peer("hf-transformers-fixed", "hf", "--threads", cores, fixed_language=True)
        rows.append(measure(hf, "short", short, 1, detect=False))
        hf.stop()

    encoder = encoder_efficiency()
    print(f"  encoder: {encoder}", flush=True)
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "command": "python -m bench" + (" --quick" if args.quick else ""),
        "rows": [r.as_dict() for r in rows],
        "streaming": streaming,
        "encoder": encoder,
    }
    report["targets"] = ratios(rows, streaming, encoder)
    stem = f"{dt.date.today()}{'-quick' if args.quick else ''}"
    write_outputs(report, rows, stem)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
