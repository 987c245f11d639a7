"""Scoring, targets and the written results (json, Markdown table, PNG plot)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import jiwer

from support.textnorm import normalize
from .workloads import Outcome, Request

RESULTS = Path(__file__).parent / "results"
CHARACTER_SCORED = {"zh", "ja"}  # scripts without spaces: scored by characters (CER)


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


def ratios(rows: list[Row], streaming: dict, encoder: dict, alternated: dict | None = None) -> list[dict]:
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
    for service in ("service-fused-int8", "service-fused-bf16", "service-fused-fp32", "service-fused"):
        s_top, s_1 = get(service, "short", top), get(service, "short", 1)
        if s_top is None or s_1 is None:  # a results file from before this system was measured
            continue
        out += [
            (f"{service} @{top} throughput / faster-whisper best @{top}", s_top.rtfx / fw_best_top.rtfx, ">=", 2.0, fw_best_top.system),
            (f"{service} latency p50 @1 / faster-whisper best @1", s_1.p50_s / fw_best_1.p50_s, "<=", 1.0, fw_best_1.system),
        ]
        for peer, want in (("faster-whisper-int8-batched", 1.0), ("faster-whisper-int8-sequential", 2.0)):
            if (p := get(peer, "long", 1)) is not None:
                out.append((f"long audio: {service} / {peer}", get(service, "long", 1).rtfx / p.rtfx, ">=", want, ""))
        out.append((f"WER points: {service} - faster-whisper", 100 * ((s_top.wer or 0) - (fw_best_top.wer or 0)), "<=", 0.5, fw_best_top.system))
        out.append((f"detection: {service} - faster-whisper", (s_top.detection or 0) - (fw_best_top.detection or 0), ">=", 0.0, fw_best_top.system))
        out.append((f"peak RSS GB @{most} clients: {service}", get(service, "short", most).peak_rss_mb / 1024, "<=", 1.0, ""))
    fused = get("service-fused", "short", top)
    out += [
        (f"fused / fixed-language throughput @{top}", fused.rtfx / get("service-fixed", "short", top).rtfx, ">=", 0.95, "default"),
        (f"fused / two-stage throughput @{top}", fused.rtfx / get("service-two-stage", "short", top).rtfx, ">=", 1.5, "default"),
        ("streaming 60 s: first delta / full response", streaming["first_delta_s"] / streaming["full_s"], "<=", 0.5, "default"),
        ("encoder GFLOP/s / matmul GFLOP/s", encoder["encoder_vs_matmul"], ">=", 0.70, "fp32"),
    ]
    if alternated is not None:  # a results file from before the alternated rounds has none
        a = alternated
        out.append((f"{a['service']} @{a['concurrency']} throughput / {a['peer']}, taking turns "
                     f"(median of {len(a['rounds'])} rounds)", a["median_ratio"], ">=", 2.0, a["peer"]))
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
    if report.get("alternated"):
        lines += [f"Taking turns: {report['alternated']}"]
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
    report["targets"] = ratios(rows, report["streaming"], report["encoder"], report.get("alternated"))
    write_outputs(report, rows, path.stem)
