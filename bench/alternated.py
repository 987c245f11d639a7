"""The headline throughput ratio measured with the two systems taking turns.

    python -m bench.alternated [--rounds 3] [--concurrency 8] [--peer faster-whisper-int8-workers]

Writes bench/results/alternated-DATE.json. ``python -m bench`` runs it too, at its end, against
the faster-whisper configuration its rows found best.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
from pathlib import Path

from .measure import measure
from .report import RESULTS
from .systems import Service, faster_whisper
from .workloads import Request, build_workloads


def alternated(reqs: list[Request], concurrency: int, peer_name: str, rounds: int) -> dict:
    """The headline ratio again, with the default service and faster-whisper's best taking turns.

    The rows above measure one system after another over some 40 minutes, and a shared machine's
    speed drifts in that time (seen here: the language-given row, less work than fused
    detection, measured 40 % slower than it twenty minutes later). Round by round, the two
    share the machine's state of the moment; the target takes the median round."""
    service, peer = Service("service-fused"), faster_whisper(peer_name)
    out = []
    try:
        for i in range(rounds):
            s, p = measure(service, "short", reqs, concurrency, True), measure(peer, "short", reqs, concurrency, True)
            out.append({"round": i + 1, "service_rtfx": s.rtfx, "peer_rtfx": p.rtfx, "ratio": round(s.rtfx / p.rtfx, 3)})
    finally:
        service.stop()
        peer.stop()
    ratios = sorted(r["ratio"] for r in out)
    return {"concurrency": concurrency, "service": "service-fused", "peer": peer_name, "rounds": out,
            "median_ratio": ratios[len(ratios) // 2]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--peer", default="faster-whisper-int8-workers",
                        help="faster-whisper-{int8,f32}-{workers,sequential}")
    args = parser.parse_args()
    short = build_workloads(False, Path(tempfile.mkdtemp(prefix="asr-bench-")))["short"]
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": f"python -m bench.alternated --rounds {args.rounds} --concurrency {args.concurrency} "
                         f"--peer {args.peer}",
              **alternated(short, args.concurrency, args.peer, args.rounds)}
    out = RESULTS / f"alternated-{datetime.date.today()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
