"""One sequence being decoded by the batch engine: its tokens, grammar state and sampler."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import xgrammar as xgr

from adapters.decode_request import DecodeParams

from .beam_search import BeamGroup, Hypothesis
from .stream import SequenceStream


@dataclass
class DecodingSequence:
    params: DecodeParams
    audio: np.ndarray
    stream: SequenceStream
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    text_start: int | None = None  # index in ``tokens`` where the text part begins
    matcher: xgr.GrammarMatcher | None = None
    generator: torch.Generator | None = None
    group: BeamGroup | None = None  # set: this is one beam of a beam-search sequence
    beam_logprobs: list[float] = field(default_factory=list)  # a beam's generated log-probabilities
    audio_slot: int = -1  # the engine's audio slot (cross-attention K/V) it reads, once admitted

    def __post_init__(self):
        self.tokens = []
        for token in self.params.prompt_ids:
            self.append(token)
        if self.params.constraint is not None:
            self.matcher = xgr.GrammarMatcher(self.params.constraint.compiled)
        if self.params.temperature > 0:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.params.seed if self.params.seed is not None else int(time.time_ns()))

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - len(self.params.prompt_ids)

    @property
    def slots_needed(self) -> int:
        return max(1, self.params.beam_size)

    def at_limit(self, context: int) -> bool:
        """No room for another token: the token budget or the model's ``context`` is spent."""
        return self.n_generated >= self.params.max_new_tokens or len(self.tokens) >= context

    def append(self, token: int) -> None:
        self.tokens.append(token)
        if self.text_start is None and token in self.params.text_start_after_ids:
            self.text_start = len(self.tokens)

    def text_tokens(self) -> list[int] | None:
        """The text part so far (None: it has not begun)."""
        return None if self.text_start is None else self.tokens[self.text_start :]

    def as_hypothesis(self) -> Hypothesis:
        return Hypothesis(self.tokens[len(self.params.prompt_ids) :], list(self.beam_logprobs))

    def with_beams(self) -> list[DecodingSequence]:
        """A beam-search sequence becomes ``beam_size`` beams sharing its stream and audio."""
        size = self.params.beam_size
        if size <= 1:
            return [self]
        group = BeamGroup(size, self.params.eot_id, self.params.length_penalty, live=size)
        beams = [self] + [DecodingSequence(self.params, self.audio, self.stream) for _ in range(size - 1)]
        for beam in beams:
            beam.group = group
        return beams

    def probe_due(self) -> bool:
        """The logits about to choose the sequence's first token are the ones its probe reads
        (the probe is at the prompt's last position, which the prefill does not compute)."""
        p = self.params
        return bool(p.probe_ids) and self.n_generated == 0 and p.probe_index == len(p.prompt_ids) - 1

    def record_probe(self, logits: torch.Tensor) -> None:
        """The raw next-token probabilities of the params' probe ids (language, no-speech)."""
        probs = torch.softmax(logits, dim=-1)
        self.stream.result.probe_probs = {t: float(probs[t]) for t in self.params.probe_ids}
