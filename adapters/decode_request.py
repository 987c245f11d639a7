"""What an adapter asks an engine to decode: one sequence's prompt, token constraint and decode
settings, as plain data. Adapters build these and engines read them, so the adapters package
needs nothing from the engines it is adapted to."""

from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def timed(self) -> bool:
        """Whether the decode writes timestamps (Whisper's timestamp rules apply)."""
        return self.timestamp_begin is not None


@dataclass(frozen=True)
class CanaryDecode:
    """A decode that proves a remote engine applies both the prompt and the constraint it is
    sent: ``failure`` reads the output ids and says what the server did not apply (None: it
    applied both). The adapter builds it; remote engines run it before a server gets traffic."""

    params: DecodeParams
    failure: Callable[[list[int]], str | None]
