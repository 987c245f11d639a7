"""Does warmup work? Time the first request after /health says ready against later ones.

    python -m bench.first_request [--repeats 5]

Starts a real `asr-service serve`, waits for /health 200, then sends the same clip for each
grammar variant (detect / known language x notimestamps / timestamps x transcribe /
translate) once as "first" and then --repeats times more; prints first vs median of the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from support.clips import clip_path
from support.server_process import ServerProcess

VARIANTS = [
    ("/v1/audio/transcriptions", {}),
    ("/v1/audio/transcriptions", {"language": "en"}),
    ("/v1/audio/transcriptions", {"response_format": "verbose_json"}),
    ("/v1/audio/transcriptions", {"response_format": "verbose_json", "language": "en"}),
    ("/v1/audio/translations", {}),
    ("/v1/audio/translations", {"response_format": "verbose_json"}),
]


def timed_post(url: str, path: str, fields: dict) -> float:
    with open(clip_path("en", "quick_brown_fox"), "rb") as f:
        start = time.perf_counter()
        r = httpx.post(url + path, data=fields, files={"file": ("a.wav", f, "audio/wav")}, timeout=120)
        elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    server = ServerProcess("--threads", "2")
    try:
        server.wait_ready()
        rows = []
        for path, fields in VARIANTS:
            first = timed_post(server.url, path, fields)
            later = [timed_post(server.url, path, fields) for _ in range(args.repeats)]
            rows.append({"variant": f"{path.rsplit('/', 1)[-1]} {json.dumps(fields)}", "first_s": round(first, 3),
                         "later_median_s": round(statistics.median(later), 3),
                         "later_max_s": round(max(later), 3), "first_over_median": round(first / statistics.median(later), 2)})
    finally:
        server.stop()
    print("| variant | first s | later median s | later max s | first / median |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['variant']} | {row['first_s']} | {row['later_median_s']} | {row['later_max_s']} | {row['first_over_median']} |")


if __name__ == "__main__":
    main()
