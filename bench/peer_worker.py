"""A peer system in its own process, so its memory and threads are measured apart.

    python -m bench.peer_worker faster-whisper --compute-type int8 --num-workers 2 [--batched]
    python -m bench.peer_worker hf

Reads one JSON job per stdin line: {"files": [...], "languages": [...|null], "concurrency": N}
and answers one JSON line: {"wall_s": ..., "results": [{"text", "language", "latency_s"}]}.
Requests run on N threads at once, as N clients would send them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.packaged_model import ctranslate2_dir


def faster_whisper_runner(args):
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(ctranslate2_dir(), device="cpu", compute_type=args.compute_type,
                         cpu_threads=args.threads, num_workers=args.num_workers)
    pipeline = BatchedInferencePipeline(model) if args.batched else None

    def run(path: str, language: str | None):
        if pipeline is not None:
            segments, info = pipeline.transcribe(path, language=language, beam_size=1, batch_size=args.batch_size)
        else:
            segments, info = model.transcribe(path, language=language, beam_size=1)
        return " ".join(s.text.strip() for s in segments).strip(), info.language

    return run


def hf_runner(args):
    import torch

    from asr_service.audio import decode_audio
    from asr_service.engine.features import log_mel_spectrogram
    from asr_service.model_loading import load_model
    from adapters.whisper_tokenizer import WhisperTokenizer

    from support.hf_reference import hf_model_from

    torch.set_num_threads(args.threads)
    loaded = load_model()
    hf = hf_model_from(loaded)
    tok = WhisperTokenizer(loaded.tokenizer_file, loaded.dims.n_vocab)

    def run(path: str, language: str | None):
        # HF generate() with the language given (its own detection is a separate pass).
        audio = decode_audio(Path(path).read_bytes())
        mel = log_mel_spectrogram(audio, loaded.dims.n_mels)[None]
        prompt = [tok.sot, tok.language_ids[language or "en"], tok.transcribe, tok.no_timestamps]
        with torch.inference_mode():
            out = hf.generate(input_features=mel, decoder_input_ids=torch.tensor([prompt]), max_new_tokens=200)
        return tok.decode(out[0].tolist()).strip(), language

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=("faster-whisper", "hf"))
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    run = faster_whisper_runner(args) if args.engine == "faster-whisper" else hf_runner(args)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)

        def one(item):
            path, language = item
            start = time.perf_counter()
            text, detected = run(path, language)
            return {"text": text, "language": detected, "latency_s": time.perf_counter() - start}

        start = time.perf_counter()
        with ThreadPoolExecutor(job["concurrency"]) as pool:
            results = list(pool.map(one, zip(job["files"], job["languages"])))
        print(json.dumps({"wall_s": time.perf_counter() - start, "results": results}), flush=True)


if __name__ == "__main__":
    main()
