"""A transcript of a conversation scored against its truth (support/dialogue.py).

One alignment of the whole file, after Whisper's own English normaliser (the
``whisper-normalizer`` package), so number spellings and punctuation do not count:
- ``wer``: word error rate over the whole file;
- ``wer_compounds``: the same where a compound written as one word on one side and as two on
  the other ("Northgate" and "north gate", "everyone" and "every one") counts as one word on
  both: a spacing the listener cannot hear, as NIST's scoring maps such forms with its GLM
  files. Whisper's normaliser leaves them apart;
- ``first_words_found`` / ``utterances_found``: utterances whose first word is in the output, and
  those with at least half their words in it;
- ``onset_median_s`` / ``onset_p90_s``: |start of the output word matched to an utterance's first
  word - the utterance's true start| (when words have times);
- ``words_in_silence``: output words (or, for subtitles, cues) lying inside a silence of 1 s or
  more (0.2 s margins), a lead-in silence included;
- ``missing``: the utterances not found (their text);
- ``thin_segments``: segments (when given, with word times) over at least a second of speech
  whose words cover less than half of it: text that cannot account for the speech it is
  placed over.
Shared by bench/long_audio.py and the tests, so both judge a transcript the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jiwer
import numpy as np
from whisper_normalizer.english import EnglishTextNormalizer

from .dialogue import Utterance

normalize = EnglishTextNormalizer()
SILENCE_MIN_S = 1.0
SILENCE_MARGIN_S = 0.2


def tokens(text: str) -> list[str]:
    return normalize(text).split()


def _silences(truth: list[Utterance]) -> list[tuple[float, float]]:
    edges = [(0.0, truth[0].start)] + [(a.end, b.start) for a, b in zip(truth, truth[1:])]
    return [(s + SILENCE_MARGIN_S, e - SILENCE_MARGIN_S) for s, e in edges if e - s >= SILENCE_MIN_S]


def _closed_compounds(ref: list[str], hyp: list[str]) -> tuple[list[str], list[str]]:
    """``ref`` and ``hyp`` with each pair of neighbouring words that the other side (or the same
    side elsewhere) writes as one word joined into that word."""
    words = set(ref) | set(hyp)
    closed = {a + b for side in (ref, hyp) for a, b in zip(side, side[1:]) if a + b in words}

    def join(side: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(side):
            if i + 1 < len(side) and side[i] + side[i + 1] in closed:
                out.append(side[i] + side[i + 1])
                i += 2
            else:
                out.append(side[i])
                i += 1
        return out

    return join(ref), join(hyp)


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


def score(truth: list[Utterance], text: str, timed: list[tuple[str, float, float]] | None = None,
          cues: list[tuple[float, float]] | None = None, tokens: Callable[[str], list[str]] = tokens,
          segments: list[tuple[float, float]] | None = None) -> dict:
    """The figures of the module docstring; ``tokens`` splits a text into the words compared."""
    ref, owner = [], []
    for i, u in enumerate(truth):
        words = tokens(u.text)
        ref += words
        owner += [i] * len(words)
    hyp = tokens(text)
    matched = _matches(ref, hyp)
    firsts = {i: owner.index(i) for i in range(len(truth))}
    per_utterance = [sum(1 for r in matched if owner[r] == i) / max(1, owner.count(i)) for i in range(len(truth))]
    closed_ref, closed_hyp = _closed_compounds(ref, hyp)
    row = {"wer": round(jiwer.wer(" ".join(ref), " ".join(hyp)), 4) if hyp else 1.0,
           "wer_compounds": round(jiwer.wer(" ".join(closed_ref), " ".join(closed_hyp)), 4) if hyp else 1.0,
           "first_words_found": sum(firsts[i] in matched for i in range(len(truth))),
           "utterances_found": sum(r >= 0.5 for r in per_utterance), "utterances": len(truth),
           "missing": [u.text for u, r in zip(truth, per_utterance) if r < 0.5]}
    silences = _silences(truth)

    def in_silence(start: float, end: float) -> bool:
        return any(s <= start and end <= e for s, e in silences)

    if timed is not None:  # words with times: onsets from an alignment of the per-word tokens
        hyp_words, hyp_times = [], []
        for word, start, end in timed:
            for token in tokens(word):
                hyp_words.append(token)
                hyp_times.append(start)
        timed_matches = _matches(ref, hyp_words)
        errors = [abs(hyp_times[timed_matches[firsts[i]]] - u.start) for i, u in enumerate(truth)
                  if firsts[i] in timed_matches]
        row["onset_median_s"] = round(float(np.median(errors)), 3) if errors else None
        row["onset_p90_s"] = round(float(np.percentile(errors, 90)), 3) if errors else None
        row["words_in_silence"] = int(sum(in_silence((s + e) / 2, (s + e) / 2) for _, s, e in timed))
    elif cues is not None:
        row["words_in_silence"] = sum(in_silence(s, e) for s, e in cues)
    if segments is not None and timed is not None:
        row["thin_segments"] = _thin_segments(truth, segments, [(s, e) for _, s, e in timed])
    return row


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, e) - max(start, s)) for s, e in spans)


def _thin_segments(truth: list[Utterance], segments: list[tuple[float, float]],
                   words: list[tuple[float, float]], min_speech_s: float = 1.0) -> int:
    speech = [(u.start, u.end) for u in truth]
    thin = 0
    for start, end in segments:
        heard = _overlap(speech, start, end)
        inside = [(max(s, start), min(e, end)) for s, e in words if start <= (s + e) / 2 <= end]
        covered = sum(_overlap(speech, s, e) for s, e in inside)  # words do not overlap one another
        thin += int(heard >= min_speech_s and covered < heard / 2)
    return thin


_CUE = re.compile(r"(\d+):(\d\d):(\d\d)[,.](\d{3}) --> (\d+):(\d\d):(\d\d)[,.](\d{3})")


def subtitles(body: str) -> tuple[str, list[tuple[float, float]]]:
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
