"""Long audio, scored against its truth: every system, every response format, one run.

    python -m bench.long_audio [--files clean noisy monologue slow] [--quantize bf16|int8] [--turns 3] [--out bench/results/long-audio-DATE.json]

The workloads are support/dialogue.py's conversation, clean and noisy, its monologue and its
slow conversation (made on the spot). Systems: this service over HTTP in json, verbose_json (with word times), srt
and vtt with its defaults (a 5-beam search), and greedy (``use_beam_search=false``) in json
and verbose_json; faster-whisper on the same packaged model.bin with its defaults, with ``vad_filter=True``, and its BatchedInferencePipeline.
Figures per system and format: support/transcript_score.py's (WER after Whisper's own English
normaliser, utterances found, onset error, words inside silences), and ``seconds``, the wall
time of the request or call.

Then the throughput against faster-whisper's BatchedInferencePipeline again, the two taking
turns on each file (``turns``): the rows above run one system after the other over some ten
minutes, and a shared machine's speed drifts more than the difference measured.
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

from asr_service.runtime import QUANTIZATIONS
from support.dialogue import Utterance, crossings, read_truth, write
from support.packaged_model import ctranslate2_dir
from support.redecodes import redecodes, redecodes_since
from support.server_process import ServerProcess
from support.transcript_score import score, subtitles
from support.transcript_score import tokens as transcript_tokens

# (row name, form fields): the defaults (5-beam search) in every format, then greedy decoding
# in json and verbose_json.
SERVICE_RUNS = [(fmt, {"response_format": fmt}) for fmt in ("json", "verbose_json", "srt", "vtt")] + [
    (f"{fmt}, greedy", {"response_format": fmt, "use_beam_search": "false"}) for fmt in ("json", "verbose_json")]


def service_request(url: str, path: Path, fields: dict) -> tuple[httpx.Response, float]:
    """The response to one transcription request and its wall time; verbose_json asks for word
    and segment times."""
    data = dict(fields)
    if fields["response_format"] == "verbose_json":
        data["timestamp_granularities[]"] = ["word", "segment"]
    start = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", data=data,
                   files={"file": (path.name, path.read_bytes(), "audio/wav")}, timeout=1800)
    seconds = time.perf_counter() - start
    r.raise_for_status()
    return r, seconds


def service_rows(url: str, path: Path, truth: list[Utterance], tokens=transcript_tokens) -> dict[str, dict]:
    """The service's figures in every run of SERVICE_RUNS; ``tokens``: score's."""
    rows = {}
    for name, fields in SERVICE_RUNS:
        fmt = fields["response_format"]
        before = redecodes(url)
        r, seconds = service_request(url, path, fields)
        found = redecodes_since(url, before)
        if fmt == "json":
            rows[name] = score(truth, r.json()["text"], tokens=tokens)
        elif fmt == "verbose_json":
            body = r.json()
            rows[name] = score(truth, body["text"], [(w["word"], w["start"], w["end"]) for w in body["words"]],
                               tokens=tokens, segments=[(s["start"], s["end"]) for s in body["segments"]])
        else:
            text, cues = subtitles(r.text)
            rows[name] = score(truth, text, cues=cues, tokens=tokens)
        rows[name]["seconds"] = round(seconds, 1)
        rows[name]["redecodes"] = found  # why parts of windows were decoded again, by rule
    return rows


def faster_whisper_model(threads: int):
    from faster_whisper import WhisperModel

    return WhisperModel(ctranslate2_dir(), device="cpu", cpu_threads=threads)


def faster_whisper_call(run) -> tuple[list, float]:
    """The segments of a faster-whisper transcription and its wall time (the generator decodes
    as it is read)."""
    start = time.perf_counter()
    segments, _ = run()
    segments = list(segments)
    return segments, time.perf_counter() - start


def faster_whisper_rows(model, path: Path, truth: list[Utterance], tokens=transcript_tokens) -> dict[str, dict]:
    from faster_whisper import BatchedInferencePipeline

    runs = {"faster-whisper defaults": lambda: model.transcribe(str(path), word_timestamps=True),
            "faster-whisper vad_filter": lambda: model.transcribe(str(path), word_timestamps=True, vad_filter=True),
            "faster-whisper batched": lambda: BatchedInferencePipeline(model).transcribe(str(path), word_timestamps=True)}
    rows = {}
    for name, run in runs.items():
        segments, seconds = faster_whisper_call(run)
        words = [(w.word, w.start, w.end) for s in segments for w in (s.words or [])]
        rows[name] = score(truth, " ".join(s.text for s in segments), words, tokens=tokens,
                           segments=[(s.start, s.end) for s in segments]) | {"seconds": round(seconds, 1)}
    return rows


FILES = ("clean", "noisy", "monologue", "slow")

# The pairs that take turns: (pair name, the service's form fields, faster-whisper's batched
# pipeline's word_timestamps). Like with like: plain text against plain text, word times
# against word times; the service with its defaults (a 5-beam search), as the pipeline.
TURN_PAIRS = [("json", {"response_format": "json"}, False),
              ("verbose_json with word times", {"response_format": "verbose_json"}, True)]


def turns(url: str, model, paths: dict[str, Path], rounds: int) -> dict:
    """Per file and pair, ``rounds`` rounds of the service and the batched pipeline one right
    after the other (which goes first alternates), and the pipeline's seconds over the
    service's: its throughput as a multiple of the pipeline's, and the median ratio, the figure to quote."""
    from faster_whisper import BatchedInferencePipeline

    pipeline = BatchedInferencePipeline(model)
    out: dict = {}
    for name, path in paths.items():
        for pair, fields, words in TURN_PAIRS:
            measured = []
            for i in range(rounds):
                runs = [("service", lambda: service_request(url, path, fields)[1]),
                        ("batched", lambda: faster_whisper_call(
                            lambda: pipeline.transcribe(str(path), word_timestamps=words))[1])]
                seconds = dict((system, run()) for system, run in (runs if i % 2 == 0 else runs[::-1]))
                measured.append({"round": i + 1, "service_s": round(seconds["service"], 2),
                                 "batched_s": round(seconds["batched"], 2),
                                 "ratio": round(seconds["batched"] / seconds["service"], 3)})
            out.setdefault(name, {})[pair] = {"rounds": measured,
                                              "median_ratio": round(statistics.median(r["ratio"] for r in measured), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="the service's --quantize (rows say so)")
    parser.add_argument("--turns", type=int, default=3,
                        help="rounds of the service and faster-whisper's batched pipeline taking turns (0: none)")
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
        report["service_precision"] = httpx.get(server.url + "/health").json()["precision"]  # what --quantize resolved to
        for name, truth in truths.items():
            report["rows"][name] = {f"{service} {fmt}": row for fmt, row in service_rows(server.url, paths[name], truth).items()}
        model = faster_whisper_model(args.threads)
        for name, truth in truths.items():
            report["rows"][name].update(faster_whisper_rows(model, paths[name], truth))
        if args.turns:
            report["turns"] = turns(server.url, model, {name: paths[name] for name in truths}, args.turns)
    finally:
        server.stop()
    args.out.write_text(json.dumps(report, indent=1))
    columns = ["wer", "wer_compounds", "first_words_found", "utterances_found", "onset_median_s", "onset_p90_s",
               "words_in_silence", "thin_segments", "seconds"]
    for name, rows in report["rows"].items():
        about = report["files"][name]
        print(f"\n{name}: {about['seconds']:.0f} s, {about['utterances']} utterances, "
              f"{about['across_30s_marks']} across 30 s marks")
        print("| system | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for system, row in rows.items():
            print(f"| {system} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    if args.turns:
        print(f"\nTaking turns with faster-whisper's batched pipeline ({args.turns} rounds): its seconds over the "
              f"service's, each round, and the median")
        print("| file | pair | rounds (service s / batched s) | median ratio |\n|---|---|---|---|")
        for name, pairs in report["turns"].items():
            for pair, t in pairs.items():
                rounds = ", ".join(f"{r['service_s']} / {r['batched_s']}" for r in t["rounds"])
                print(f"| {name} | {pair} | {rounds} | {t['median_ratio']} |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
