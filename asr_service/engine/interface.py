"""The engine interface: what the pipeline, warmup and the server may ask of any engine.

Two engines implement it: the embedded BatchEngine (decodes in this process) and SGLangEngine
(sends each decode to SGLang servers). Callers use only these members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from adapters.decode_request import DecodeParams

from .params import Priority, UnsupportedDecode
from .stream import SequenceStream


@dataclass(frozen=True)
class EngineFigures:
    """What /health and /metrics report of an engine."""

    active_sequences: int  # being decoded
    queued_sequences: int  # submitted, waiting for a slot
    submitted_sequences: int
    cancelled_sequences: int
    tokens: int  # decoded in total
    steps: int | None = None  # decode steps run (the embedded engine; SGLang's are its own)
    batch_sizes: dict[int, int] | None = None  # {sequences decoded together: steps} (embedded)
    # Where the engine thread's time went, in seconds per phase (embedded; see ENGINE_PHASES).
    phase_seconds: dict[str, float] | None = None
    backends: list[dict] | None = None  # each SGLang server's state (SGLang)
    threads: int | None = None  # torch threads the engine thread's kernels run on (embedded)


# The embedded engine's phases, timed on its thread: encoder passes (with the log-mel), the
# prompt's prefill, the decoder layers of each step, the vocabulary projection, the logits
# pipeline (penalties, grammar mask, Whisper's rules, softmax, token choice), beam bookkeeping,
# and the teacher-forced pass that gives word timing its attention weights.
ENGINE_PHASES = ("encoder", "prefill", "decoder_layers", "vocabulary_projection", "logits_pipeline", "beam_search",
                 "word_alignment")


class Engine(Protocol):
    name: str  # "embedded" or "sglang"
    # How many decodes warmup sends per grammar variant, so every server behind it compiles each.
    warm_copies: int
    beam_search: bool  # whether it decodes params with beam_size above 1
    audio_sized_encoder: bool  # whether it decodes params with audio_sized_encoder set
    # Whether it can now carry text before <|startoftranscript|> in a prompt (a request's prompt,
    # hotwords, the previous window's text); a remote engine can say so only of the servers it
    # has admitted.
    carries_prompt_text: bool
    # How many windows of one request are submitted at once (a window with its continuations
    # counts once); its later windows are planned as these end. Enough to keep the engine's
    # batch full, few enough that a long file neither holds all its windows' samples at once
    # nor queues all of them ahead of the requests that come after it.
    max_request_windows: int

    def submit(self, audio: np.ndarray, params: DecodeParams, priority: Priority | None = None) -> SequenceStream:
        """Start decoding one sequence over one audio window (call from the event loop).
        Raises UnsupportedDecode for what ``refusal`` refuses. ``priority`` (None: file work
        planned now) orders the waiting sequences (params.Priority)."""

    def refusal(self, params: DecodeParams) -> UnsupportedDecode | None:
        """Why this engine cannot decode ``params`` (None: it can). Cheap: checked before any
        work, so a request gets a 400 instead of a failure midway."""

    def figures(self) -> EngineFigures: ...

    def shutdown(self) -> None: ...
