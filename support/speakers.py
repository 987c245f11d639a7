"""A multi-speaker test set for diarization, and its truth (who spoke when).

Four voices from Debian's speech synthesizers (Festival's ``cmu_us_slt_arctic_hts`` and
``kal_diphone``, and espeak-ng's ``Storm`` and a female variant) take 23 turns of 0.3-10 s in
115 s: quick back-and-forth with pauses of 0.2-0.5 s, longer turns with pauses up to 1.5 s, and
one monologue of 37 s. The truth is where each voice's speech is, to the 10 ms: each
synthesized turn is trimmed to its sound, and a silence of MIN_TRUTH_PAUSE_S or more inside a
turn (between its sentences) is not speech, as an annotator marks it.

``short=True`` gives the first 11 turns only (40 s, every voice), for the tests;
build_monologue the whole script in one voice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asr_service.pcm import SAMPLE_RATE
from support.dialogue import synthesize

VOICES = {
    "A": ["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)"],
    "B": ["text2wave", "-eval", "(voice_kal_diphone)"],
    "C": ["espeak-ng", "-v", "en-us+Storm", "-s", "160"],
    "D": ["espeak-ng", "-v", "en-us+f4", "-p", "70", "-s", "170"],
}

SCRIPT = [
    ("A", "Thanks for coming in early. We have a lot to get through before the delivery arrives."),
    ("B", "No problem."),
    ("C", "Is the van still booked for ten o'clock?"),
    ("A", "Yes, ten o'clock."),
    ("D", "Good, because I promised the shop we would call them when it leaves the depot."),
    ("B", "I can call them."),
    ("C", "Then let us start with the stock count. Yesterday we found that the shelves in the back "
          "room did not match the list at all, and nobody could say where the difference came from."),
    ("D", "That was my fault. I moved two boxes to the front on Friday and forgot to write it down."),
    ("A", "Right."),
    ("B", "So the numbers are fine after all?"),
    ("D", "They should be. I will check them again this afternoon."),
    ("A", "Let me explain the plan for the next two weeks, because it changes how we work. The new "
          "supplier sends smaller loads, but more often, so we will have deliveries on Monday, "
          "Wednesday and Friday instead of one big one on Tuesday. Each delivery needs two people "
          "for about an hour. I would like us to take turns, so that nobody does every morning. "
          "I have drawn up a rota and put it on the board by the door. If a day does not suit you, "
          "swap with someone and tell me, that is all I ask. The first delivery under the new plan "
          "is next Monday, and the supplier's driver will bring the paperwork for the whole month."),
    ("C", "Monday is fine for me."),
    ("B", "And me."),
    ("D", "I cannot do Wednesday mornings, I have a class."),
    ("A", "That is fine, swap with Tom."),
    ("C", "What happens if the driver is late again, like last week?"),
    ("B", "We wait, I suppose."),
    ("A", "We wait half an hour, then we call the supplier. After that they pay for the extra time."),
    ("D", "That seems fair."),
    ("C", "One more thing. The cold room door does not close properly, and the alarm went off twice "
          "during the night. Someone should look at it before the summer, or we will lose stock."),
    ("B", "I will ask the landlord today."),
    ("A", "Thank you, everyone. Same time next week."),
]
SHORT_TURNS = 11  # the first turns: every voice, short and long turns

MIN_TRUTH_PAUSE_S = 0.5
SOUND_RMS = 1e-3  # a 10 ms frame quieter than this is silence (the synthesizers' output is clean)
NOISE_RMS = 0.003  # the noisy copy's background


@dataclass(frozen=True)
class Turn:
    speaker: str
    start: float
    end: float


def _sound_spans(audio: np.ndarray) -> list[tuple[int, int]]:
    """Sample spans of sound, with silences shorter than MIN_TRUTH_PAUSE_S inside them."""
    frame = SAMPLE_RATE // 100
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    loud = np.sqrt((frames * frames).mean(axis=1)) >= SOUND_RMS
    spans: list[list[int]] = []
    for i in np.flatnonzero(loud):
        if spans and i - spans[-1][1] < MIN_TRUTH_PAUSE_S * 100:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])
    return [(s * frame, e * frame) for s, e in spans]


def build(short: bool = False, seed: int = 0) -> tuple[np.ndarray, list[Turn]]:
    """The conversation and its truth, in time order."""
    return _join(SCRIPT[:SHORT_TURNS] if short else SCRIPT, seed)


def build_monologue(speaker: str = "B", seed: int = 3) -> tuple[np.ndarray, list[Turn]]:
    """The whole script read by one voice: one speaker must be found, not several."""
    return _join([(speaker, text) for _, text in SCRIPT], seed)


def _join(script: list[tuple[str, str]], seed: int) -> tuple[np.ndarray, list[Turn]]:
    rng = np.random.default_rng(seed)
    pieces, turns, position = [np.zeros(SAMPLE_RATE // 2, dtype=np.float32)], [], SAMPLE_RATE // 2
    for i, (speaker, text) in enumerate(script):
        speech = synthesize(VOICES[speaker], text)
        spans = _sound_spans(speech)
        speech = speech[spans[0][0] : spans[-1][1]]
        turns += [Turn(speaker, (position + s - spans[0][0]) / SAMPLE_RATE, (position + e - spans[0][0]) / SAMPLE_RATE)
                  for s, e in spans]
        quick = len(text) < 60 or (i + 1 < len(script) and len(script[i + 1][1]) < 60)
        pause = rng.uniform(0.2, 0.5) if quick else rng.uniform(0.6, 1.5)
        gap = np.zeros(int(pause * SAMPLE_RATE), dtype=np.float32)
        pieces += [speech, gap]
        position += speech.shape[0] + gap.shape[0]
    return np.concatenate(pieces), turns


def with_noise(audio: np.ndarray, rms: float = NOISE_RMS, seed: int = 1) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(audio.shape[0]).astype(np.float32) * rms
    return (audio + noise).astype(np.float32)
