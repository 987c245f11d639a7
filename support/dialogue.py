"""A long-form workload with real structure, and its truth.

Several minutes of a four-voice conversation made with Debian's speech synthesizers (Festival's
``cmu_us_slt_arctic_hts``, ``kal_diphone`` and ``ked_diphone`` voices, and espeak-ng), with a
15 s silence before the first word, pauses of 0.3 to 1.6 s between turns, one 8 s silence, and
turns long enough that speech runs across 30 s marks. A second copy has background noise. A
monologue reads the same script in one voice with breaths of 0.1-0.3 s only, so windows must be
cut inside speech. A slow conversation has the four voices pause 1.5-4 s between turns, so
windows hold many stretches of speech with the silence between them left out.
The truth keeps every utterance's text, speaker, start and end (seconds, to the sample).

Needs ``festival``, ``festvox-us-slt-hts``, ``festvox-kallpc16k``, ``festvox-kdlpc16k`` and
``espeak-ng`` (``make test`` and ``make bench-long`` install them when run as root).
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from asr_service.audio import AudioLimits, decode_audio
from asr_service.pcm import SAMPLE_RATE

VOICE_DIRS = ("/usr/share/festival/voices/us/cmu_us_slt_arctic_hts", "/usr/share/festival/voices/english/kal_diphone",
              "/usr/share/festival/voices/english/ked_diphone")
VOICES = {
    "A": ["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)"],
    "B": ["text2wave", "-eval", "(voice_kal_diphone)"],
    "C": ["text2wave", "-eval", "(voice_ked_diphone)"],
    "D": ["espeak-ng", "-v", "en-us+f3", "-s", "165"],
}

SCRIPT = [
    ("A", "Good morning everyone, thanks for joining the planning call for the river survey."),
    ("B", "Morning. I have the equipment list open in front of me."),
    ("C", "Before we start, can someone confirm the date of the first field trip?"),
    ("A", "The first trip is on the twelfth of March, and we leave from the north gate at seven."),
    ("D", "That works for me. I will bring the water samplers and the spare batteries."),
    ("B", "We also need more water for the long walk to the second station, at least four litres "
          "per person, because last year we ran out before noon and had to turn back early."),
    ("C", "Agreed. I will check the weather forecast on Monday and send it to the whole group."),
    ("A", "Next item is the boat. The rental company wants a deposit of two hundred dollars, and "
          "they need the names of everyone who will be on board, together with a phone number "
          "that works in the valley, where the signal is weak and calls often drop."),
    ("D", "I can collect the names today."),
    ("B", "Please add my brother as well, he wants to help with the heavy cases."),
    ("C", "Fine. What about the permits from the park office?"),
    ("A", "They arrived yesterday. There are three of them, one for each station."),
    ("D", "Where should we keep the paper copies?"),
    ("A", "In the red folder, inside the dry bag, so they survive the rain."),
    ("B", "Let us take a short break and continue in a few seconds."),
    ("C", "We are back. The last topic is the report, which is due at the end of April, and the "
          "editor asked for shorter chapters, more photographs of the sampling sites, and a clear "
          "table of every measurement with its time and the name of the person who took it."),
    ("D", "I will draft the chapter on water quality."),
    ("B", "Then I take the chapter on the fish counts and the map of the river bed."),
    ("A", "Good. Send the drafts to me by the first of April, and I will put them together."),
    ("C", "One more question. Do we need a second car for the trip to the lake?"),
    ("D", "Yes, the van only has seven seats, and we are nine people with all the equipment."),
    ("B", "My neighbour can lend us his car for the weekend if we return it with a full tank."),
    ("A", "Perfect. Thank you all, that was a useful meeting. See you on the twelfth."),
    ("C", "Goodbye and safe travels."),
]

LEAD_IN_SECONDS = 15.0
LONG_SILENCE_SECONDS = 8.0
LONG_SILENCE_AFTER = 14  # the index of the turn after which the long silence comes
NOISE_SNR_DB = 15.0


@dataclass(frozen=True)
class Utterance:
    speaker: str
    text: str
    start: float
    end: float


def synthesize(command: list[str], text: str) -> np.ndarray:
    """``text`` said by a Festival (text2wave) or espeak-ng ``command``: 16 kHz mono, peak 0.5.
    Both synthesizers are deterministic, so each (voice, text) is synthesized once per process
    (several workloads say the same turns); every caller gets its own copy."""
    return _synthesized(tuple(command), text).copy()


@functools.lru_cache(maxsize=None)
def _synthesized(command: tuple[str, ...], text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "turn.wav"
        if command[0] == "text2wave":
            subprocess.run([*command, "-o", str(out)], input=text, text=True, check=True, capture_output=True)
        else:
            subprocess.run([*command, "-w", str(out), text], check=True, capture_output=True)
        audio = decode_audio(out.read_bytes(), AudioLimits())  # PyAV: mono, 16 kHz
    peak = float(np.abs(audio).max()) or 1.0
    return (audio / peak * 0.5).astype(np.float32)  # the voices come at very different levels


def build(seed: int = 0) -> tuple[np.ndarray, list[Utterance]]:
    """The clean conversation and its truth."""
    rng = np.random.default_rng(seed)
    pauses = [LONG_SILENCE_SECONDS if i == LONG_SILENCE_AFTER else float(rng.uniform(0.3, 1.6))
              for i in range(len(SCRIPT))]
    return _join(SCRIPT, pauses, LEAD_IN_SECONDS)


def build_monologue(seed: int = 2, voice: str = "D", longest_breath: float = 0.3) -> tuple[np.ndarray, list[Utterance]]:
    """The same script read by one voice (``VOICES``) with breaths of 0.1 s to ``longest_breath``
    only: speech that runs far past 30 s without a pause, so windows are cut inside speech."""
    rng = np.random.default_rng(seed)
    return _join([(voice, text) for _, text in SCRIPT], [float(rng.uniform(0.1, longest_breath)) for _ in SCRIPT], 0.5)


def build_slow(seed: int = 5) -> tuple[np.ndarray, list[Utterance]]:
    """The conversation with pauses of 1.5-4 s between turns and a 3 s lead-in: each pause is
    long enough that a window leaves it out (chunking.speech_windows)."""
    rng = np.random.default_rng(seed)
    return _join(SCRIPT, [float(rng.uniform(1.5, 4.0)) for _ in SCRIPT], 3.0)


def _join(turns: list[tuple[str, str]], pauses: list[float], lead_in: float) -> tuple[np.ndarray, list[Utterance]]:
    pieces = [np.zeros(int(lead_in * SAMPLE_RATE), dtype=np.float32)]
    position = pieces[0].shape[0]
    truth: list[Utterance] = []
    for (speaker, text), pause in zip(turns, pauses):
        speech = synthesize(VOICES[speaker], text)
        truth.append(Utterance(speaker, text, position / SAMPLE_RATE, (position + speech.shape[0]) / SAMPLE_RATE))
        gap = np.zeros(int(pause * SAMPLE_RATE), dtype=np.float32)
        pieces += [speech, gap]
        position += speech.shape[0] + gap.shape[0]
    return np.concatenate(pieces), truth


def with_noise(audio: np.ndarray, snr_db: float = NOISE_SNR_DB, seed: int = 1) -> np.ndarray:
    """White noise over the whole file (silences too) at ``snr_db`` below the speech's power."""
    speech_power = float(np.mean(audio[np.abs(audio) > 1e-4] ** 2))
    noise = np.random.default_rng(seed).standard_normal(audio.shape[0]).astype(np.float32)
    return (audio + noise * np.sqrt(speech_power / 10 ** (snr_db / 10))).astype(np.float32)


def crossings(truth: list[Utterance], window: float = 30.0) -> int:
    """Utterances that run across a multiple of ``window`` seconds (a fixed window seam)."""
    return sum(int(u.start // window) != int(u.end // window) for u in truth)


def write(directory: Path, monologue: bool = False, slow: bool = False) -> dict[str, Path]:
    """clean.wav, noisy.wav and clean.json (the truth of both) in ``directory`` (with ``monologue``, also
    monologue.wav and monologue.json; with ``slow``, slow.wav and slow.json); returns their
    paths."""
    import soundfile as sf

    directory.mkdir(parents=True, exist_ok=True)
    audio, truth = build()
    paths = {"clean": write_pair(directory, "clean", audio, truth), "noisy": directory / "noisy.wav",
             "truth": directory / "clean.json"}
    sf.write(paths["noisy"], np.clip(with_noise(audio), -1, 1), SAMPLE_RATE, subtype="PCM_16")
    for name, wanted, made in (("monologue", monologue, build_monologue), ("slow", slow, build_slow)):
        if wanted:
            paths[name] = write_pair(directory, name, *made())
            paths[f"{name}_truth"] = directory / f"{name}.json"
    return paths


def write_pair(directory: Path, name: str, audio: np.ndarray, truth: list[Utterance]) -> Path:
    """``<name>.wav`` (16-bit PCM) and its truth ``<name>.json`` in ``directory``; returns the wav's path."""
    import soundfile as sf

    wav = directory / f"{name}.wav"
    sf.write(wav, np.clip(audio, -1, 1), SAMPLE_RATE, subtype="PCM_16")
    (directory / f"{name}.json").write_text(json.dumps(
        {"seconds": audio.shape[0] / SAMPLE_RATE, "utterances": [asdict(u) for u in truth]}, indent=1))
    return wav


def read_truth(path: Path) -> list[Utterance]:
    return [Utterance(**u) for u in json.loads(path.read_text())["utterances"]]


if __name__ == "__main__":
    made = write(Path(tempfile.gettempdir()) / "asr-dialogue", monologue=True, slow=True)  # wav files: not for bench/results
    print(f"written to {made['clean'].parent}")
    truth = json.loads(made["truth"].read_text())
    utterances = [Utterance(**u) for u in truth["utterances"]]
    print(f"{truth['seconds']:.1f} s, {len(utterances)} utterances, {crossings(utterances)} across a 30 s mark")
