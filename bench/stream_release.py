"""A stream is the full response released early: how early, at what cost, and the same bytes.

    python -m bench.stream_release [--files clean noisy monologue slow] [--rounds 2] [--out bench/results/stream-release-DATE.json]

For each long file (support/dialogue.py's, made on the spot) and each streamed format (json;
verbose_json with word and segment times), the same request with ``stream=true`` and without
it, taking turns (which goes first alternates), on one server with its defaults. Per pair:
- ``first_delta_fraction``: seconds to the stream's first text delta over the full response's
  seconds (the target: at most 0.25 on files of two minutes or more);
- ``stream_over_full``: the stream's seconds to its done event over the full response's
  (the target: at most 1.1);
- ``identical``: the done event's text is the full response's text byte for byte, the deltas
  join to it, and (verbose_json) its segments and words are the full response's.
Medians over the rounds are the figures to quote.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import soundfile as sf

from support.dialogue import write
from support.server_process import ServerProcess

FILES = ("clean", "noisy", "monologue", "slow")
FORMATS = {"json": {"response_format": "json"},
           "verbose_json": {"response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]}}


def full_response(url: str, audio: bytes, fields: dict) -> tuple[dict, float]:
    start = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", data=fields, files={"file": ("a.wav", audio, "audio/wav")},
                   timeout=1800)
    seconds = time.perf_counter() - start
    r.raise_for_status()
    return r.json(), seconds


def streamed(url: str, audio: bytes, fields: dict) -> tuple[list[str], dict, float, float]:
    """The deltas, the done event, seconds to the first delta and to the done event."""
    deltas, done, first = [], None, None
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/audio/transcriptions", data={**fields, "stream": "true"},
                      files={"file": ("a.wav", audio, "audio/wav")}, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("type") == "transcript.text.delta":
                first = first if first is not None else time.perf_counter() - start
                deltas.append(event["delta"])
            elif event.get("type") == "transcript.text.done":
                done = event
                total = time.perf_counter() - start
            else:
                raise RuntimeError(f"unexpected event {event}")
    return deltas, done, first, total


def same_bytes(deltas: list[str], done: dict, full: dict) -> bool:
    return ("".join(deltas) == done["text"] == full["text"]
            and all(done.get(k) == full.get(k) for k in ("segments", "words", "language", "duration")
                    if k in full))


def pair_rounds(url: str, audio: bytes, fields: dict, rounds: int) -> dict:
    measured = []
    for i in range(rounds):
        order = ("stream", "full") if i % 2 == 0 else ("full", "stream")
        got = {}
        for kind in order:
            got[kind] = streamed(url, audio, fields) if kind == "stream" else full_response(url, audio, fields)
        deltas, done, first, total = got["stream"]
        full, full_s = got["full"]
        measured.append({"round": i + 1, "full_s": round(full_s, 2), "first_delta_s": round(first, 2),
                         "stream_s": round(total, 2), "first_delta_fraction": round(first / full_s, 3),
                         "stream_over_full": round(total / full_s, 3), "identical": same_bytes(deltas, done, full),
                         "deltas": len(deltas)})
    return {"rounds": measured,
            "first_delta_fraction": round(statistics.median(r["first_delta_fraction"] for r in measured), 3),
            "stream_over_full": round(statistics.median(r["stream_over_full"] for r in measured), 3),
            "identical": all(r["identical"] for r in measured)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/stream-release-{datetime.date.today()}.json"))
    args = parser.parse_args()
    paths = write(Path(tempfile.mkdtemp(prefix="stream-release-")), monologue=True, slow=True)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
              "files": {name: {"seconds": round(sf.info(paths[name]).duration, 1)} for name in args.files},
              "pairs": {}}
    server = ServerProcess("--threads", str(args.threads))
    try:
        server.wait_ready()
        report["service_precision"] = httpx.get(server.url + "/health").json()["precision"]
        for name in args.files:
            audio = paths[name].read_bytes()
            for fmt in args.formats:
                report["pairs"].setdefault(name, {})[fmt] = pair_rounds(server.url, audio, FORMATS[fmt], args.rounds)
    finally:
        server.stop()
    args.out.write_text(json.dumps(report, indent=1))
    print("| file | seconds | format | full s | first delta s | stream s | first delta / full | stream / full "
          "| same bytes |\n|---|---|---|---|---|---|---|---|---|")
    for name, formats in report["pairs"].items():
        for fmt, pair in formats.items():
            rounds = pair["rounds"]
            print(f"| {name} | {report['files'][name]['seconds']} | {fmt} "
                  f"| {', '.join(str(r['full_s']) for r in rounds)} | {', '.join(str(r['first_delta_s']) for r in rounds)} "
                  f"| {', '.join(str(r['stream_s']) for r in rounds)} | {pair['first_delta_fraction']} "
                  f"| {pair['stream_over_full']} | {'yes' if pair['identical'] else 'NO'} |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
