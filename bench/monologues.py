"""Speech that runs on without pauses, in every voice: word errors and encoder passes, in-process.

    python -m bench.monologues [--beams 5 1]

support/dialogue.py's script read by each of its four voices with breaths of 0.1-0.35 s only,
clean and with its background noise (eight files of 130-150 s), so the VAD hears few pauses
and windows end at short breaths or inside speech: where a window's last words are most at
risk. The service's own runtime transcribes each file (timestamps, as every response format
decodes), with 5 beams and greedy; the figures per file are the word errors after Whisper's
English normaliser (support/transcript_score.py) and the encoder passes (windows and their
continuations). For comparing one commit with another on the same machine; no peer runs here
(bench.long_audio compares with faster-whisper).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import jiwer
import soundfile as sf

from asr_service.pcm import SAMPLE_RATE
from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions
from support.dialogue import build_monologue, with_noise
from support.transcript_score import tokens

VOICE_SEEDS = {"A": 11, "B": 12, "C": 13, "D": 14}
LONGEST_BREATH_S = 0.35


def files(directory: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a 16-bit wav file, its true text), each voice clean and with noise."""
    out = {}
    for voice, seed in VOICE_SEEDS.items():
        audio, truth = build_monologue(seed, voice, LONGEST_BREATH_S)
        text = " ".join(u.text for u in truth)
        for name, samples in ((voice, audio), (f"{voice}-noisy", with_noise(audio, seed=seed))):
            path = directory / f"{name}.wav"
            sf.write(path, samples, SAMPLE_RATE, subtype="PCM_16")
            out[name] = (path, text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    args = parser.parse_args()
    runtime = build_runtime(RuntimeSettings())
    with tempfile.TemporaryDirectory() as tmp:
        made = files(Path(tmp))
        for beams in args.beams:
            errors = words = passes = 0
            for name, (path, text) in made.items():
                audio = sf.read(path, dtype="float32")[0]
                before = runtime.engine.encoder_windows
                result = asyncio.run(runtime.transcriber.transcribe(audio, TranscriptionOptions(timestamps=True, beam_size=beams)))
                measured = jiwer.process_words(" ".join(tokens(text)), " ".join(tokens(result.text)))
                wrong = measured.substitutions + measured.deletions + measured.insertions
                used = runtime.engine.encoder_windows - before
                errors, words, passes = errors + wrong, words + len(tokens(text)), passes + used
                print(f"beams {beams}  {name:8s} WER {100 * measured.wer:5.2f} %  errors {wrong:3d}  encoder passes {used}", flush=True)
            print(f"beams {beams}  all      WER {100 * errors / words:5.2f} %  errors {errors} of {words} words  encoder passes {passes}", flush=True)
    runtime.close()


if __name__ == "__main__":
    main()
