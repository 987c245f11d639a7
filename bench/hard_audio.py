"""Hard long audio, scored against its truth: does every repeat survive, in every format?

    python -m bench.hard_audio [--files NAME ...] [--quantize bf16|int8] [--out bench/results/hard-audio-DATE.json]

The files are support/hard_audio.py's: a sentence said 6-10 times by each of four voices, the
pytest-audioeval English clips said over for a minute, a short phrase repeated across long
pauses. Systems and figures as bench/long_audio.py's (words compared as ``words`` says) (the service in every response format with
its defaults and greedy, faster-whisper's defaults, ``vad_filter`` and batched pipeline on the
same packaged model); ``utterances_found`` of ``utterances`` is the number of repeats found.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import tempfile
from pathlib import Path

import httpx

from asr_service.runtime import QUANTIZATIONS
from support import hard_audio
from support.server_process import ServerProcess
from support.transcript_score import normalize

from .long_audio import faster_whisper_model, faster_whisper_rows, service_rows

COLUMNS = ["wer", "wer_compounds", "utterances_found", "utterances", "words_in_silence", "thin_segments", "seconds",
           "redecodes"]


def words(text: str) -> list[str]:
    """The words compared: split at anything but letters, digits and apostrophes, then each
    through Whisper's English normaliser on its own. On a whole text the normaliser joins number
    words said in a row into one number ("One two three ... ten" becomes 12345678910) and leaves
    "1,2,3" whole, so the drill's counting would match in no spelling."""
    return [token for word in re.split(r"[^\w']+", text) if word for token in normalize(word).split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", help="workload names (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="the service's --quantize (rows say so)")
    parser.add_argument("--no-peers", action="store_true", help="the service only")
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/hard-audio-{datetime.date.today()}.json"))
    args = parser.parse_args()
    files = hard_audio.write(Path(tempfile.mkdtemp(prefix="hard-audio-")))
    files = {name: f for name, f in files.items() if not args.files or name in args.files}
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
              "files": {name: {"seconds": round(truth[-1].end, 1), "utterances": len(truth)}
                        for name, (_, truth) in files.items()},
              "rows": {}}
    quantize = ["--quantize", args.quantize] if args.quantize else []
    server = ServerProcess("--threads", str(args.threads), *quantize)
    try:
        server.wait_ready()
        report["service_precision"] = httpx.get(server.url + "/health").json()["precision"]
        for name, (path, truth) in files.items():
            report["rows"][name] = {f"service {fmt}": row for fmt, row in service_rows(server.url, path, truth, words).items()}
            print(name, {system: row["utterances_found"] for system, row in report["rows"][name].items()}, flush=True)
    finally:
        server.stop()
    if not args.no_peers:
        model = faster_whisper_model(args.threads)
        for name, (path, truth) in files.items():
            report["rows"][name].update(faster_whisper_rows(model, path, truth, words))
    args.out.write_text(json.dumps(report, indent=1))
    for name, rows in report["rows"].items():
        about = report["files"][name]
        print(f"\n{name}: {about['seconds']:.0f} s, {about['utterances']} utterances")
        print("| system | " + " | ".join(COLUMNS) + " |")
        print("|---" * (len(COLUMNS) + 1) + "|")
        for system, row in rows.items():
            print(f"| {system} | " + " | ".join(str(row.get(c, "")) for c in COLUMNS) + " |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
