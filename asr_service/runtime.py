"""Wires one model into a ready-to-use pipeline: weights -> adapter -> engine -> transcriber.

Two engines sit behind the same interface: the embedded BatchEngine (CPU, or CUDA in float16)
and SGLangEngine, which sends every decode to SGLang servers. With SGLang the model named here
must be the one the servers load: the front still needs its tokenizer and config for prompts,
grammars and parsing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from adapters import WhisperAdapter

from .engine.batch_engine import BatchEngine
from .engine.interface import Engine
from .heap import map_large_blocks, return_freed_memory
from .model_loading import DEFAULT_MODEL, LoadedModel, load_model
from .request_options import DEFAULT_BEAM_SIZE
from .speech_gate import SpeechGate
from .transcription import Transcriber


# "bf16": the encoder under bfloat16 autocast and the decoder's linear layers in bfloat16
# (engine/quantize.py); "int8": dynamic int8 linear layers everywhere (opt-in: a sequence's result
# then depends on its batch); "none": float32 arithmetic (on x86, on weights kept in float16 where
# that is exact, as for Whisper's float16 checkpoints: engine/quantize.py). "auto", the default,
# is bf16 where the CPU multiplies bfloat16 in hardware and none elsewhere (see cpu_has_native_bf16).
QUANTIZATIONS = ("auto", "none", "bf16", "int8")
ENGINES = ("embedded", "sglang")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class RuntimeSettings:
    """Which model, and which engine decodes it where."""

    model: str = DEFAULT_MODEL
    engine: str = "embedded"  # or "sglang": decodes go to sglang_urls
    device: str | None = None  # None: cuda when torch sees a GPU, else cpu
    quantize: str = "auto"  # see QUANTIZATIONS
    threads: int | None = None  # torch threads (None: all cores)
    max_batch_size: int = 40  # sequences the embedded engine decodes together (each beam of a search is one)
    # Encoded windows whose cross-attention K/V it holds at once: on the CPU, where the encoder
    # bounds throughput, 6 decode as fast as 8 in less memory (docs/performance.md, "Memory").
    max_audio_windows: int = 6
    sglang_urls: tuple[str, ...] = ()
    sglang_retry_after_s: float = 2.0  # a failed SGLang server is left out this long (doubling)


@dataclass
class Runtime:
    precision: str  # what "auto" resolved to: none / bf16 / int8 on the CPU, float16 on CUDA, remote with SGLang
    loaded: LoadedModel
    adapter: WhisperAdapter
    engine: Engine
    transcriber: Transcriber

    @property
    def default_beam_size(self) -> int:
        """Beams for a request that does not choose: faster-whisper's default search where the
        engine can search, else greedy (request_options.build_options)."""
        return DEFAULT_BEAM_SIZE if self.engine.beam_search else 1

    def close(self) -> None:
        self.engine.shutdown()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: there oneDNN multiplies bfloat16 several times faster than float32
    (bench/decoder_profile.py, docs/performance.md); without them it emulates bfloat16 and gains
    nothing. torch.cpu's checks are private but are what torch's own CPU dispatch consults."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(quantize: str, device: str) -> str:
    if device == "cuda":
        return "float16"
    if quantize == "auto":
        return "bf16" if cpu_has_native_bf16() else "none"
    return quantize


def _check_choices(engine: str, sglang_urls, device: str, quantize: str) -> str:
    """Refuse a bad combination before the model is loaded (seconds) rather than after."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; supported: {', '.join(ENGINES)}")
    if engine == "sglang" and not sglang_urls:
        raise ValueError("--engine sglang needs at least one --sglang-url")
    if engine == "sglang" and quantize != "auto":
        raise ValueError("--quantize is for the embedded engine; SGLang servers choose their own precision")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; supported: {', '.join(DEVICES)}")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantize!r}; supported: {', '.join(QUANTIZATIONS)}")
    if engine == "embedded" and device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA device (is this a CUDA build of torch?)")
        if quantize != "auto":
            raise ValueError("--quantize is for the CPU engine; on CUDA the model runs in float16")
    return device


def sglang_canaries(adapter: WhisperAdapter) -> dict:
    """The canary decode an SGLang server must pass for each way of carrying the prompt. The one
    sent as input_ids holds previous text: a server that passes it carries any prompt."""
    from .engine.sglang import Carrier

    return {Carrier.INPUT_IDS: adapter.build_canary(previous_text="Hello."), Carrier.DETECT_KEY: adapter.build_canary()}


def build_runtime(settings: RuntimeSettings = RuntimeSettings()) -> Runtime:
    s = settings
    device = _check_choices(s.engine, s.sglang_urls, s.device or default_device(), s.quantize)
    map_large_blocks()  # before the weights and caches are allocated
    loaded = load_model(s.model, weights=s.engine == "embedded")
    adapter = WhisperAdapter.from_loaded(loaded)
    if s.engine == "sglang":
        from .engine.sglang import SGLangEngine

        remote = SGLangEngine(list(s.sglang_urls), decoder_start_id=adapter.tok.sot, canaries=sglang_canaries(adapter),
                              retry_after_s=s.sglang_retry_after_s)
        return Runtime("remote", loaded, adapter, remote, Transcriber(remote, adapter, SpeechGate()))
    precision = resolve_precision(s.quantize, device)
    encoder_dtype = None
    if device == "cuda":
        # Half precision on the GPU, as openai/whisper and faster-whisper decode there by default:
        # it halves the memory traffic that bounds each decode step.
        loaded.model.to(device="cuda", dtype=torch.float16)
    elif precision == "bf16":
        from .engine.quantize import bf16

        encoder_dtype = torch.bfloat16
        bf16(loaded.model)
        return_freed_memory()  # the float weights that bfloat16 copies replaced
    elif precision == "int8":
        from .engine.quantize import quantize_int8

        quantize_int8(loaded.model)
        return_freed_memory()  # the float weights that quantization replaced
    else:
        from .engine.quantize import fbgemm_available, float16_weights

        if fbgemm_available():
            float16_weights(loaded.model, loaded.mapped_float16_token_rows)
            return_freed_memory()  # the float32 weights that float16 copies replaced
    # Threads: all cores by default; more processes or threads than cores only add contention.
    batch = BatchEngine(loaded.model, max_batch_size=s.max_batch_size, max_audio_windows=s.max_audio_windows,
                        threads=s.threads or os.cpu_count(), encoder_dtype=encoder_dtype)
    return Runtime(precision, loaded, adapter, batch, Transcriber(batch, adapter, SpeechGate()))
