"""What the engine takes per sequence and what it gives back. Plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True, eq=False)
class Constraint:
    """A token-level constraint, as the adapter builds it: the elements of an xgrammar
    structural-tag ``sequence`` (for engines that compile it themselves: SGLang) and their
    compiled form (for the embedded engine's matcher). One value, two renderings of it."""

    elements: tuple[dict, ...]
    compiled: Any  # xgrammar.CompiledGrammar of exactly these elements


@dataclass(frozen=True)
class DecodeParams:
    """One sequence to decode over one audio window, as an adapter builds it.

    The engine knows nothing about languages or tasks: the adapter encodes them in the
    prompt, the grammar and the id sets below.
    """

    prompt_ids: tuple[int, ...]
    eot_id: int
    # What every generated token must follow (None: unconstrained).
    constraint: Constraint | None = None
    # The text part begins after the first of these tokens (in the prompt or generated);
    # the rules below apply only there.
    text_start_after_ids: frozenset[int] = frozenset()
    blank_ids: tuple[int, ...] = ()  # not as the first text token
    timestamp_begin: int | None = None  # set: Whisper's timestamp rules apply to the text
    # Report the raw next-token probabilities of probe_ids at prompt position probe_index
    # (Whisper: language and no-speech probabilities at <|startoftranscript|>).
    probe_index: int = 0
    probe_ids: tuple[int, ...] = ()
    max_new_tokens: int = 224
    temperature: float = 0.0  # 0: greedy; above: sampling, narrowed by top_k / top_p
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = 0.0  # sampling: drop tokens less likely than min_p x the most likely one
    seed: int | None = None
    # vLLM's penalties (neutral by default), on every decode: repetition divides positive logits
    # (multiplies negative ones) of tokens in the prompt or output; frequency and presence
    # subtract count x frequency + presence for tokens in the output.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Beam search (greedy when 1): beams that each hold a slot; the grammar holds in every beam.
    beam_size: int = 1
    length_penalty: float | None = None  # None: rank by log-probability per token
    # (layer, head) pairs whose cross-attention is returned for word timing (empty: none).
    alignment_heads: tuple[tuple[int, int], ...] = ()
    # Encode only the audio's own seconds (and a margin), not the whole padded window: the rest
    # of the window's positions are a silent window's encoder output. Far cheaper on short
    # audio, but the text may differ in a word from the whole window's, so only for a preview
    # that a whole-window decode replaces (realtime). Engines that cannot refuse it.
    audio_sized_encoder: bool = False
    # Tokens this decode will probably generate first (a realtime preview: what the preview
    # before it, on less of the same audio, generated). A greedy decode checks them all in one
    # pass as it is admitted and steps only from the first it would not have chosen: the tokens
    # a step-by-step decode chooses (but where two tie within rounding), in a few steps. An
    # engine that does not check drafts decodes as if there were none.
    draft_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Priority:
    """Where a sequence waits for the engine: live work (a person waits for its words as they
    speak: realtime) apart from bulk work, in a lane the engine serves first (the embedded
    engine: engine/lane.py); within each, the oldest work first: ``planned_at`` is
    time.monotonic() when the window it belongs to was planned, so a window's continuations and
    retries go ahead of windows planned after it (live work: since when a person has waited for
    its text)."""

    planned_at: float
    live: bool = False


@dataclass(frozen=True)
class StepEvent:
    token_id: int
    logprob: float


@dataclass
class SequenceResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    probe_probs: dict[int, float] = field(default_factory=dict)
    # alignment_heads' cross-attention when each generated token was predicted:
    # [heads, generated tokens, audio frames] (None unless asked for).
    cross_attention: Any = None
    # "stop" (end of text), "length", "grammar", "cancelled", "error", or "unavailable" (a remote
    # engine had no server that could finish it)
    finish_reason: str = ""
    error: str | None = None


@dataclass(frozen=True)
class CanaryDecode:
    """A decode that proves a remote engine applies both the prompt and the constraint it is
    sent: ``failure`` reads the output ids and says what the server did not apply (None: it
    applied both). The adapter builds it; remote engines run it before a server gets traffic."""

    params: DecodeParams
    failure: Callable[[list[int]], str | None]


class UnsupportedDecode(ValueError):
    """An engine cannot decode what the params ask for; ``param`` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class EngineUnavailable(RuntimeError):
    """The decode could not be finished for want of a working engine server (try again later)."""


class DecodeFailed(RuntimeError):
    """The engine failed while decoding (an exception in its step, a reply it could not use):
    this request gets the reason; the engine goes on serving the others."""


def raise_if_failed(result: SequenceResult) -> None:
    """A decode that did not end by itself (stop, length or grammar) raises here."""
    if result.finish_reason == "unavailable":
        raise EngineUnavailable(result.error or "no engine server available")
    if result.finish_reason in ("error", "cancelled"):
        raise DecodeFailed(f"the decode ended with {result.finish_reason}: {result.error or 'no result'}")
