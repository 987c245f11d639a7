"""Beam search bookkeeping for one sequence decoded as a group of beams.

The engine gives each beam a slot of its own (its own KV cache rows, grammar matcher and
Whisper rules, so the grammar holds in every beam) and asks the group each step which beams
live on: the ``size`` best continuations over all beams, by summed log-probability. A beam
that ends (end-of-text) becomes a finished hypothesis; the group is done when it holds
``size`` of them, and the best is chosen by length-normalised score (openai/whisper's ranker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Hypothesis:
    tokens: list[int]  # generated tokens
    logprobs: list[float]

    @property
    def score(self) -> float:
        return sum(self.logprobs)


@dataclass
class BeamGroup:
    size: int
    eot_id: int
    length_penalty: float | None = None  # None: divide by length; else ((5 + n) / 6) ** penalty
    finished: list[Hypothesis] = field(default_factory=list)
    live: int = 0  # beams holding a slot
    expanded: bool = False  # until the first step all beams are the same: expand beam 0 only
    finish_reason: str = ""  # set when the group is done: what its last released beam reports

    def select(self, beams: list[Hypothesis], logprobs: torch.Tensor,
               in_prefix: bool = False) -> list[tuple[int, int, float]]:
        """(parent beam, token, token log-probability) for each beam of the next step, best
        first; continuations that end go to ``finished`` instead.

        ``in_prefix``: the step is in the forced prefix before the text (a fused detection's
        language and task tokens). There the beams, still identical, all take beam 0's most
        probable token, so the language is the one a greedy decode (and the reported language
        probabilities) would choose, not one picked for the text that follows it; the search
        is over the text."""
        if in_prefix:
            token = int(logprobs[0].argmax())
            lp = float(logprobs[0, token])
            if lp == float("-inf"):
                return []  # the constraint leaves no way on
            if token == self.eot_id:
                self.finished.append(Hypothesis(beams[0].tokens + [token], beams[0].logprobs + [lp]))
                return []
            return [(i, token, lp) for i in range(len(beams))]
        rows = logprobs if self.expanded else logprobs[:1]
        self.expanded = True
        # Each beam's best 2 * size tokens first: the best 2 * size continuations over all beams
        # are among them (adding a beam's score keeps the order of its row), and ranking these few
        # costs far less than ranking every beam's whole vocabulary as one list.
        per_beam = rows.topk(min(2 * self.size, rows.shape[1]), dim=-1)
        scores = torch.tensor([b.score for b in beams[: rows.shape[0]]], dtype=rows.dtype)[:, None] + per_beam.values
        top = torch.topk(scores.flatten(), min(2 * self.size, scores.numel()))
        width, tokens, values = scores.shape[1], per_beam.indices.tolist(), per_beam.values.tolist()
        chosen: list[tuple[int, int, float]] = []
        for score, flat in zip(top.values.tolist(), top.indices.tolist()):
            if score == float("-inf"):
                break  # the constraint leaves no more ways on
            parent, rank = divmod(flat, width)
            token, lp = tokens[parent][rank], values[parent][rank]
            if token == self.eot_id:
                if len(self.finished) < self.size:
                    self.finished.append(Hypothesis(beams[parent].tokens + [token], beams[parent].logprobs + [lp]))
            else:
                chosen.append((parent, token, lp))
            if len(chosen) == self.size:
                break
        return chosen

    def done(self, n_live: int, at_limit: bool) -> bool:
        return len(self.finished) >= self.size or n_live == 0 or at_limit

    def best(self, live: list[Hypothesis]) -> Hypothesis | None:
        """The hypothesis to return; None when the constraint left no way on from the start."""
        candidates = self.finished + (live if len(self.finished) < self.size else [])
        return max(candidates, key=self._ranked, default=None)

    def _ranked(self, h: Hypothesis) -> float:
        n = max(1, len(h.tokens))
        penalty = n if self.length_penalty is None else ((5 + n) / 6) ** self.length_penalty
        return h.score / penalty
