"""One measured run of a system on a workload at a concurrency: a scored Row."""

from __future__ import annotations

from .report import Row, score
from .systems import RssSampler
from .workloads import Request


def measure(system, workload: str, reqs: list[Request], concurrency: int, detect: bool) -> Row:
    system.run(reqs[:1], 1)  # warm: first-call costs are not what is measured
    with RssSampler(system.pid) as rss:
        outcomes, wall = system.run(reqs, concurrency)
    row = score(system.name, workload, concurrency, reqs, outcomes, wall, rss.peak, detect)
    print(f"  {row.system:24s} {workload:5s} c={concurrency:<2d} rtfx={row.rtfx:6.2f} p50={row.p50_s:.2f}s "
          f"wer={row.wer} det={row.detection} rss={row.peak_rss_mb}MB", flush=True)
    return row
