"""Wires one model into a ready-to-use pipeline: weights -> adapter -> engine -> transcriber."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from adapters import WhisperAdapter

from .engine.batch_engine import BatchEngine
from .model_loading import DEFAULT_MODEL, LoadedModel, load_model, return_freed_memory
from .speech_gate import SpeechGate
from .transcription import Transcriber


# "int8": dynamic int8 linear layers everywhere; "bf16": the encoder's matrix products in
# bfloat16, decoder in fp32 (see BatchEngine). Both are opt-in: each changes some transcripts.
QUANTIZATIONS = ("int8", "bf16")


@dataclass
class Runtime:
    loaded: LoadedModel
    adapter: WhisperAdapter
    engine: BatchEngine
    transcriber: Transcriber

    def close(self) -> None:
        self.engine.shutdown()


def build_runtime(model: str = DEFAULT_MODEL, threads: int | None = None, max_batch_size: int = 16,
                  quantize: str | None = None) -> Runtime:
    loaded = load_model(model)
    encoder_dtype = None
    if quantize == "bf16":
        encoder_dtype = torch.bfloat16
    elif quantize == "int8":
        from .engine.quantize import quantize_int8

        quantize_int8(loaded.model)
        return_freed_memory()  # the float weights that quantization replaced
    elif quantize is not None:
        raise ValueError(f"unknown quantization {quantize!r}; supported: {', '.join(QUANTIZATIONS)}")
    adapter = WhisperAdapter.from_loaded(loaded)
    # Threads: all cores by default; more processes or threads than cores only add contention.
    engine = BatchEngine(loaded.model, max_batch_size=max_batch_size, threads=threads or os.cpu_count(),
                         encoder_dtype=encoder_dtype)
    return Runtime(loaded, adapter, engine, Transcriber(engine, adapter, SpeechGate()))
