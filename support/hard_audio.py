"""Hard long audio with its truth: speech that repeats itself, the audio on which a decoder
conditioned on its own text drops sentences and a sampled retry invents words.

- ``sentence-<voice>-<n>``: one sentence of the conversation (support/dialogue.py) said ``n``
  times by one voice, with equal pauses of 0.5 s or varied pauses of 0.35-1.2 s;
- ``drill``: the three English clips pytest-audioeval ships (counting to ten, "Hello world",
  the quick brown fox), real recorded speech, joined with half-second pauses and said over for a
  minute, faint noise added;
- ``phrase-across-pauses``: a short phrase said again and again by one voice with 4-7 s of
  silence between, so windows leave the pauses out and join the copies.
Every copy is one utterance of the truth, so support/transcript_score.py's ``utterances_found``
is the number of repeats found.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asr_service.pcm import SAMPLE_RATE

from .clips import load_clip, reference
from .dialogue import SCRIPT, VOICES, Utterance, synthesize, write_pair

SENTENCE = SCRIPT[3][1]  # "The first trip is on the twelfth of March, and we leave from the north gate at seven."
PHRASE = "Please hold the line."
DRILL_CLIPS = ("counting", "hello_world", "quick_brown_fox")
DRILL_SECONDS = 60.0
DRILL_NOISE_RMS = 0.003

# (voice, copies, pauses): every voice, counts on both sides of a 30 s window's worth.
SENTENCES = (("A", 6, "varied"), ("B", 8, "equal"), ("C", 10, "equal"), ("D", 9, "varied"))


def _pauses(count: int, kind: str, seed: int) -> list[float]:
    if kind == "equal":
        return [0.5] * count
    return [float(p) for p in np.random.default_rng(seed).uniform(0.35, 1.2, count)]


def _joined(pieces: list[tuple[str, np.ndarray]], pauses: list[float], lead_in: float = 0.5,
            speaker: str = "") -> tuple[np.ndarray, list[Utterance]]:
    """(text, speech) pieces with the given pauses after each, after ``lead_in`` of silence."""
    out = [np.zeros(int(lead_in * SAMPLE_RATE), np.float32)]
    position, truth = out[0].shape[0], []
    for (text, speech), pause in zip(pieces, pauses):
        truth.append(Utterance(speaker, text, position / SAMPLE_RATE, (position + speech.shape[0]) / SAMPLE_RATE))
        gap = np.zeros(int(pause * SAMPLE_RATE), np.float32)
        out += [speech, gap]
        position += speech.shape[0] + gap.shape[0]
    return np.concatenate(out), truth


def sentence_repeats(voice: str, count: int, pauses: str, seed: int = 7) -> tuple[np.ndarray, list[Utterance]]:
    speech = synthesize(VOICES[voice], SENTENCE)
    return _joined([(SENTENCE, speech)] * count, _pauses(count, pauses, seed), speaker=voice)


def drill(seconds: float = DRILL_SECONDS, seed: int = 1) -> tuple[np.ndarray, list[Utterance]]:
    clips = [(reference("en", name), load_clip("en", name)) for name in DRILL_CLIPS]
    pieces, length = [], 0.5
    while length < seconds:
        clip = clips[len(pieces) % len(clips)]
        pieces.append(clip)
        length += clip[1].shape[0] / SAMPLE_RATE + 0.5
    audio, truth = _joined(pieces, [0.5] * len(pieces))
    noise = np.random.default_rng(seed).standard_normal(audio.shape[0]).astype(np.float32) * DRILL_NOISE_RMS
    return (audio + noise).astype(np.float32), truth


def phrase_across_pauses(count: int = 8, seed: int = 11) -> tuple[np.ndarray, list[Utterance]]:
    speech = synthesize(VOICES["A"], PHRASE)
    pauses = [float(p) for p in np.random.default_rng(seed).uniform(4.0, 7.0, count)]
    return _joined([(PHRASE, speech)] * count, pauses, speaker="A")


def workloads() -> dict[str, tuple[np.ndarray, list[Utterance]]]:
    """Every hard file by name, with its truth."""
    files = {f"sentence-{voice}-{count}-{pauses}": sentence_repeats(voice, count, pauses)
             for voice, count, pauses in SENTENCES}
    files["drill"] = drill()
    files["phrase-across-pauses"] = phrase_across_pauses()
    return files


def write(directory: Path) -> dict[str, tuple[Path, list[Utterance]]]:
    """Each workload as ``<name>.wav`` and ``<name>.json`` in ``directory``: name -> (wav, truth)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {name: (write_pair(directory, name, audio, truth), truth) for name, (audio, truth) in workloads().items()}
