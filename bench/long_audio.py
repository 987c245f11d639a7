"""Long audio, scored against its truth: every system, every response format, one run.

    python -m bench.long_audio [--files clean noisy monologue slow] [--quantize bf16|int8] [--out bench/results/long-audio-DATE.json]

The workloads are support/dialogue.py's conversation, clean and noisy, its monologue and its
slow conversation (made on the spot). Systems: this service over HTTP in json, verbose_json (with word times), srt
and vtt with its defaults (a 5-beam search), and greedy (``use_beam_search=false``) in json
and verbose_json; faster-whisper on the same packaged model.bin with its defaults, with ``vad_filter=True``, and its BatchedInferencePipeline.
Figures per system and format: support/transcript_score.py's (WER after Whisper's own English
normaliser, utterances found, onset error, words inside silences), and ``seconds``, the wall
time of the request or call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import httpx
import soundfile as sf

from asr_service.runtime import QUANTIZATIONS
from support.dialogue import Utterance, crossings, read_truth, write
from support.packaged_model import ctranslate2_dir
from support.server_process import ServerProcess
from support.transcript_score import score, subtitles

# (row name, form fields): the defaults (5-beam search) in every format, then greedy decoding
# (what a stream gets) in json and verbose_json.
SERVICE_RUNS = [(fmt, {"response_format": fmt}) for fmt in ("json", "verbose_json", "srt", "vtt")] + [
    (f"{fmt}, greedy", {"response_format": fmt, "use_beam_search": "false"}) for fmt in ("json", "verbose_json")]


def service_rows(url: str, path: Path, truth: list[Utterance]) -> dict[str, dict]:
    rows = {}
    for name, fields in SERVICE_RUNS:
        fmt = fields["response_format"]
        data = dict(fields)
        if fmt == "verbose_json":
            data["timestamp_granularities[]"] = ["word", "segment"]
        start = time.perf_counter()
        r = httpx.post(url + "/v1/audio/transcriptions", data=data,
                       files={"file": (path.name, path.read_bytes(), "audio/wav")}, timeout=1800)
        seconds = time.perf_counter() - start
        r.raise_for_status()
        if fmt == "json":
            rows[name] = score(truth, r.json()["text"])
        elif fmt == "verbose_json":
            body = r.json()
            rows[name] = score(truth, body["text"], [(w["word"], w["start"], w["end"]) for w in body["words"]])
        else:
            text, cues = subtitles(r.text)
            rows[name] = score(truth, text, cues=cues)
        rows[name]["seconds"] = round(seconds, 1)
    return rows


def faster_whisper_rows(path: Path, truth: list[Utterance], threads: int) -> dict[str, dict]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(ctranslate2_dir(), device="cpu", cpu_threads=threads)
    runs = {"faster-whisper defaults": lambda: model.transcribe(str(path), word_timestamps=True),
            "faster-whisper vad_filter": lambda: model.transcribe(str(path), word_timestamps=True, vad_filter=True),
            "faster-whisper batched": lambda: BatchedInferencePipeline(model).transcribe(str(path), word_timestamps=True)}
    rows = {}
    for name, run in runs.items():
        start = time.perf_counter()
        segments, _ = run()
        segments = list(segments)  # the generator decodes as it is read
        seconds = time.perf_counter() - start
        words = [(w.word, w.start, w.end) for s in segments for w in (s.words or [])]
        rows[name] = score(truth, " ".join(s.text for s in segments), words) | {"seconds": round(seconds, 1)}
    return rows


FILES = ("clean", "noisy", "monologue", "slow")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="the service's --quantize (rows say so)")
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/long-audio-{datetime.date.today()}.json"))
    args = parser.parse_args()
    paths = write(Path(tempfile.mkdtemp(prefix="long-audio-")), monologue=True, slow=True)
    truths = {name: read_truth(paths[f"{name}_truth" if name in ("monologue", "slow") else "truth"])
              for name in args.files}
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
              "files": {name: {"seconds": round(sf.info(paths[name]).duration, 1), "utterances": len(truth),
                               "across_30s_marks": crossings(truth)} for name, truth in truths.items()},
              "rows": {}}
    quantize = ["--quantize", args.quantize] if args.quantize else []
    service = " ".join(["service", *quantize])
    server = ServerProcess("--threads", str(args.threads), *quantize)
    try:
        server.wait_ready()
        for name, truth in truths.items():
            report["rows"][name] = {f"{service} {fmt}": row for fmt, row in service_rows(server.url, paths[name], truth).items()}
    finally:
        server.stop()
    for name, truth in truths.items():
        report["rows"][name].update(faster_whisper_rows(paths[name], truth, args.threads))
    args.out.write_text(json.dumps(report, indent=1))
    columns = ["wer", "first_words_found", "utterances_found", "onset_median_s", "onset_p90_s", "words_in_silence",
               "seconds"]
    for name, rows in report["rows"].items():
        about = report["files"][name]
        print(f"\n{name}: {about['seconds']:.0f} s, {about['utterances']} utterances, "
              f"{about['across_30s_marks']} across 30 s marks")
        print("| system | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for system, row in rows.items():
            print(f"| {system} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
