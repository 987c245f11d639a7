"""Who spoke when: speech found by the speech gate (Silero VAD), a voice embedding every
WINDOW_STEP_S over it, the embeddings clustered into speakers, and each stretch of speech given
the speaker of the window centred nearest to it.

Speakers are named ``A``, ``B``, ... in order of first appearance (OpenAI's labels), or by the
name of the known speaker whose reference clip matches their voice.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from ..pcm import SAMPLE_RATE
from ..speech_gate import SpeechGate
from .clustering import centroids, cluster, match_known
from .voice_encoder import EMBEDDING_SIZE, WINDOW_SAMPLES, VoiceEncoder

WINDOW_STEP_S = 0.4  # a window every 0.4 s: a change of speaker is placed within ~0.2 s
MIN_SILENCE_S = 0.1  # a pause this long ends a stretch of speech (where turns may change)
# A shorter pause between two stretches of one speaker's speech is part of the turn, as
# annotators mark turns (and as the DER of a reference made that way expects).
TURN_PAUSE_S = 0.5
BATCH = 64  # windows embedded per forward pass


@dataclass(frozen=True)
class SpeakerTurn:
    speaker: str
    start: float  # seconds
    end: float


def letter_names():
    """A, B, ..., Z, AA, AB, ..."""
    for length in range(1, 4):
        for i in range(26 ** length):
            name, rest = "", i
            for _ in range(length):
                rest, digit = divmod(rest, 26)
                name = string.ascii_uppercase[digit] + name
            yield name


class Diarizer:
    def __init__(self, gate: SpeechGate, encoder: VoiceEncoder):
        self.gate = gate
        self.encoder = encoder

    def enrol(self, audio: np.ndarray) -> np.ndarray:
        """A known speaker's voice from a reference clip: the mean of its windows' embeddings."""
        regions = self._speech(audio) or [(0, len(audio))]
        per_region = [self._window_starts(s, e, len(audio)) for s, e in regions]
        mean = self._embed_regions(audio, regions, per_region).mean(axis=0)
        return mean / max(float(np.linalg.norm(mean)), 1e-8)

    def diarize(self, audio: np.ndarray, min_speakers: int | None = None, max_speakers: int | None = None,
                known: dict[str, np.ndarray] | None = None) -> list[SpeakerTurn]:
        """Turns in time order covering the speech of ``audio``; ``known``: name -> enrolled voice."""
        regions = self._speech(audio)
        per_region = [self._window_starts(s, e, len(audio)) for s, e in regions]
        if not regions:
            return []
        embeddings = self._embed_regions(audio, regions, per_region)
        labels = cluster(embeddings, min_speakers, max_speakers)
        names = self._names(embeddings, labels, known or {})
        turns, offset = [], 0
        for (start, end), region_starts in zip(regions, per_region):
            region_labels = labels[offset : offset + len(region_starts)]
            offset += len(region_starts)
            for turn in self._region_turns(start, end, region_starts, region_labels, names):
                if turns and turns[-1].speaker == turn.speaker and turn.start - turns[-1].end < TURN_PAUSE_S:
                    turns[-1] = SpeakerTurn(turn.speaker, turns[-1].start, turn.end)
                else:
                    turns.append(turn)
        return turns

    # ---- steps ----

    def _speech(self, audio: np.ndarray) -> list[tuple[int, int]]:
        return self.gate.speech_regions(audio, MIN_SILENCE_S)

    @staticmethod
    def _window_starts(start: int, end: int, length: int) -> np.ndarray:
        """Window starts covering [start, end): one centred window when the stretch is shorter
        than a window, else one every WINDOW_STEP_S and the last ending at ``end``."""
        step = int(WINDOW_STEP_S * SAMPLE_RATE)
        if end - start <= WINDOW_SAMPLES:
            centred = start - (WINDOW_SAMPLES - (end - start)) // 2
            return np.array([max(0, min(centred, length - WINDOW_SAMPLES))])
        return np.unique(np.append(np.arange(start, end - WINDOW_SAMPLES, step), end - WINDOW_SAMPLES))

    def _embed(self, audio: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return np.concatenate([self.encoder.embed(audio, starts[i : i + BATCH]) for i in range(0, len(starts), BATCH)])

    def _embed_regions(self, audio: np.ndarray, regions: list[tuple[int, int]],
                       per_region: list[np.ndarray]) -> np.ndarray:
        """One embedding per window; a region shorter than a window is embedded from its own
        samples only."""
        short = np.concatenate([np.full(len(st), e - s < WINDOW_SAMPLES) for (s, e), st in zip(regions, per_region)])
        out = np.empty((len(short), EMBEDDING_SIZE), dtype=np.float32)
        if not short.all():
            out[~short] = self._embed(audio, np.concatenate(per_region)[~short])
        for row, (start, end) in zip(np.flatnonzero(short), [r for r in regions if r[1] - r[0] < WINDOW_SAMPLES]):
            out[row] = self.encoder.embed_short(audio[start:end])
        return out

    @staticmethod
    def _names(embeddings: np.ndarray, labels: np.ndarray, known: dict[str, np.ndarray]) -> list[str]:
        matched = {}
        if known:
            known_names = list(known)
            pairs = match_known(centroids(embeddings, labels), np.stack([known[n] for n in known_names]))
            matched = {speaker: known_names[ref] for speaker, ref in pairs.items()}
        letters = (name for name in letter_names() if name not in known)
        return [matched[i] if i in matched else next(letters) for i in range(int(labels.max()) + 1)]

    @staticmethod
    def _region_turns(start: int, end: int, starts: np.ndarray, labels: np.ndarray,
                      names: list[str]) -> list[SpeakerTurn]:
        """Each sample of the region goes to the window whose centre is nearest; runs of one
        speaker become turns (the borders between windows lie halfway between centres)."""
        centres = np.clip(starts + WINDOW_SAMPLES // 2, start, end)
        borders = [start, *((centres[:-1] + centres[1:]) // 2), end]
        turns: list[SpeakerTurn] = []
        for i, label in enumerate(labels):
            s, e = borders[i] / SAMPLE_RATE, borders[i + 1] / SAMPLE_RATE
            if turns and turns[-1].speaker == names[label]:
                turns[-1] = SpeakerTurn(names[label], turns[-1].start, e)
            elif e > s:
                turns.append(SpeakerTurn(names[label], s, e))
        return turns
