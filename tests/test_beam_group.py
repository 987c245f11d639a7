"""Beam-search bookkeeping on its own: which continuations live on, which finish, which wins."""

import math

import pytest
import torch

from asr_service.engine.beam_search import BeamGroup, Hypothesis

pytestmark = pytest.mark.unit

EOT = 3


def logprobs(*rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_first_step_expands_one_beam_and_keeps_the_best_continuations():
    group = BeamGroup(size=2, eot_id=EOT)
    beams = [Hypothesis([], []), Hypothesis([], [])]  # identical until the first step
    chosen = group.select(beams, logprobs([0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]))
    assert [(p, t) for p, t, _ in chosen] == [(0, 0), (0, 1)]  # only beam 0 was expanded
    assert math.isclose(chosen[0][2], math.log(0.5), rel_tol=1e-6)


def test_ended_continuations_finish_and_the_best_is_ranked_per_token():
    group = BeamGroup(size=2, eot_id=EOT, expanded=True)
    beams = [Hypothesis([7], [math.log(0.9)]), Hypothesis([8], [math.log(0.1)])]
    chosen = group.select(beams, logprobs([0.1, 0.1, 0.1, 0.7], [0.6, 0.2, 0.1, 0.1]))
    assert group.finished and group.finished[0].tokens == [7, EOT]  # beam 0 ended
    assert all(t != EOT for _, t, _ in chosen)
    best = group.best([Hypothesis([8, 0], [math.log(0.1), math.log(0.6)])])
    assert best.tokens == [7, EOT]


def test_a_dead_end_leaves_nothing_to_return():
    group = BeamGroup(size=2, eot_id=EOT, expanded=True)
    masked = torch.full((1, 4), float("-inf"))
    assert group.select([Hypothesis([5], [-0.1])], masked) == []
    assert group.best([]) is None
