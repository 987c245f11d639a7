"""Long audio, scored against its truth: every system, every response format, one run.

    python -m bench.long_audio [--files clean noisy] [--out bench/results/long-audio-DATE.json]

The workload is bench/dialogue.py's conversation (made on the spot). Systems: this service over
HTTP in json, verbose_json (with word times), srt and vtt; faster-whisper on the same packaged
model.bin with its defaults, with ``vad_filter=True``, and its BatchedInferencePipeline.
Figures per system and format:
- ``wer``: word error rate over the whole file, after Whisper's own English normaliser
  (the ``whisper-normalizer`` package), so systems are compared, not number spellings;
- ``first_words_found`` / ``utterances_found``: utterances whose first word is in the output, and
  those with at least half their words in it (from one alignment of the whole file);
- ``onset_median_s`` / ``onset_p90_s``: |start of the output word matched to an utterance's first
  word - the utterance's true start| (formats with word times);
- ``words_in_silence``: output words (or, for subtitles, cues) lying inside a silence of 1 s or
  more (0.2 s margins), the 15 s lead-in included;
- ``seconds``: wall time of the request or call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import tempfile
import time
from pathlib import Path

import httpx
import jiwer
import numpy as np
from whisper_normalizer.english import EnglishTextNormalizer

from support.packaged_model import ctranslate2_dir
from support.server_process import ServerProcess

from .dialogue import Utterance, crossings, write

normalize = EnglishTextNormalizer()
SILENCE_MIN_S = 1.0
SILENCE_MARGIN_S = 0.2


def _tokens(text: str) -> list[str]:
    return normalize(text).split()


def _silences(truth: list[Utterance]) -> list[tuple[float, float]]:
    edges = [(0.0, truth[0].start)] + [(a.end, b.start) for a, b in zip(truth, truth[1:])]
    return [(s + SILENCE_MARGIN_S, e - SILENCE_MARGIN_S) for s, e in edges if e - s >= SILENCE_MIN_S]


def _matches(ref: list[str], hyp: list[str]) -> dict[int, int]:
    """ref index -> hyp index for the words the alignment calls equal."""
    if not ref or not hyp:
        return {}
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    pairs = {}
    for chunk in out.alignments[0]:
        if chunk.type == "equal":
            for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
                pairs[chunk.ref_start_idx + k] = chunk.hyp_start_idx + k
    return pairs


def score(truth: list[Utterance], text: str, timed: list[tuple[str, float, float]] | None,
          cues: list[tuple[float, float]] | None, seconds: float) -> dict:
    ref, owner = [], []
    for i, u in enumerate(truth):
        words = _tokens(u.text)
        ref += words
        owner += [i] * len(words)
    hyp = _tokens(text)
    matched = _matches(ref, hyp)
    firsts = {i: owner.index(i) for i in range(len(truth))}
    per_utterance = [sum(1 for r in matched if owner[r] == i) / max(1, owner.count(i)) for i in range(len(truth))]
    row = {"wer": round(jiwer.wer(" ".join(ref), " ".join(hyp)), 4) if hyp else 1.0,
           "first_words_found": sum(firsts[i] in matched for i in range(len(truth))),
           "utterances_found": sum(r >= 0.5 for r in per_utterance), "utterances": len(truth),
           "seconds": round(seconds, 1)}
    silences = _silences(truth)

    def in_silence(start: float, end: float) -> bool:
        return any(s <= start and end <= e for s, e in silences)

    if timed is not None:  # words with times: onsets from an alignment of the per-word tokens
        hyp_words, hyp_times = [], []
        for word, start, end in timed:
            for token in _tokens(word):
                hyp_words.append(token)
                hyp_times.append(start)
        timed_matches = _matches(ref, hyp_words)
        errors = [abs(hyp_times[timed_matches[firsts[i]]] - u.start) for i, u in enumerate(truth)
                  if firsts[i] in timed_matches]
        row["onset_median_s"] = round(float(np.median(errors)), 3) if errors else None
        row["onset_p90_s"] = round(float(np.percentile(errors, 90)), 3) if errors else None
        row["words_in_silence"] = sum(in_silence((s + e) / 2, (s + e) / 2) for _, s, e in timed)
    elif cues is not None:
        row["words_in_silence"] = sum(in_silence(s, e) for s, e in cues)
    return row


_CUE = re.compile(r"(\d+):(\d\d):(\d\d)[,.](\d{3}) --> (\d+):(\d\d):(\d\d)[,.](\d{3})")


def _subtitles(body: str) -> tuple[str, list[tuple[float, float]]]:
    """(text, cue times) of an srt or vtt body."""
    texts, cues = [], []
    for block in re.split(r"\n\s*\n", body.strip()):
        lines = block.strip().splitlines()
        for k, line in enumerate(lines):
            m = _CUE.search(line)
            if m:
                g = [int(x) for x in m.groups()]
                cues.append((g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000, g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000))
                texts.append(" ".join(lines[k + 1 :]))
                break
    return " ".join(texts), cues


def service_rows(url: str, path: Path, truth: list[Utterance]) -> dict[str, dict]:
    rows = {}
    for fmt in ("json", "verbose_json", "srt", "vtt"):
        data = {"response_format": fmt}
        if fmt == "verbose_json":
            data["timestamp_granularities[]"] = ["word", "segment"]
        start = time.perf_counter()
        r = httpx.post(url + "/v1/audio/transcriptions", data=data,
                       files={"file": (path.name, path.read_bytes(), "audio/wav")}, timeout=1800)
        seconds = time.perf_counter() - start
        r.raise_for_status()
        if fmt == "json":
            rows[fmt] = score(truth, r.json()["text"], None, None, seconds)
        elif fmt == "verbose_json":
            body = r.json()
            rows[fmt] = score(truth, body["text"], [(w["word"], w["start"], w["end"]) for w in body["words"]], None,
                              seconds)
        else:
            text, cues = _subtitles(r.text)
            rows[fmt] = score(truth, text, None, cues, seconds)
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
        rows[name] = score(truth, " ".join(s.text for s in segments), words, None, seconds)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", nargs="+", default=["clean", "noisy"], choices=["clean", "noisy"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/long-audio-{datetime.date.today()}.json"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="long-audio-"))
    paths = write(workdir)
    meta = json.loads(paths["truth"].read_text())
    truth = [Utterance(**u) for u in meta["utterances"]]
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "seconds": meta["seconds"],
              "utterances": len(truth), "across_30s_marks": crossings(truth), "threads": args.threads, "rows": {}}
    server = ServerProcess("--threads", str(args.threads))
    try:
        server.wait_ready()
        for name in args.files:
            report["rows"][name] = {f"service {fmt}": row for fmt, row in service_rows(server.url, paths[name], truth).items()}
    finally:
        server.stop()
    for name in args.files:
        report["rows"][name].update(faster_whisper_rows(paths[name], truth, args.threads))
    args.out.write_text(json.dumps(report, indent=1))
    columns = ["wer", "first_words_found", "utterances_found", "onset_median_s", "onset_p90_s", "words_in_silence",
               "seconds"]
    for name, rows in report["rows"].items():
        print(f"\n{name}: {report['seconds']:.0f} s, {len(truth)} utterances, {report['across_30s_marks']} across 30 s marks")
        print("| system | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for system, row in rows.items():
            print(f"| {system} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
