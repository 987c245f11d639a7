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


def test_continuations_stay_in_their_parents_rows_where_they_can():
    """Beam i continuing beam i needs no K/V copy: the engine places each continuation in its
    parent's row when that row is free, and the rest in the rows left."""
    from asr_service.engine.beam_step import in_parent_slots

    chosen = [(2, 10, -0.1), (0, 11, -0.2), (2, 12, -0.3), (1, 13, -0.4)]  # best first
    placed = in_parent_slots(chosen)
    assert sorted(placed) == sorted(chosen)
    assert [p for p, _, _ in placed][:3] == [0, 1, 2]  # parents 0, 1 and 2 keep their rows
    assert placed[3] == (2, 12, -0.3)  # parent 2's second continuation takes the free row
    assert [p for p, _, _ in in_parent_slots([(4, 1, 0.0), (3, 2, 0.0)])] == [4, 3]  # past the kept rows: in order


def test_in_the_forced_prefix_every_beam_takes_the_most_probable_token():
    """A fused detection's language token is chosen as greedy decoding chooses it (the beams
    stay one); the search begins with the text."""
    group = BeamGroup(size=3, eot_id=EOT)
    beams = [Hypothesis([], []) for _ in range(3)]
    prefix = logprobs([0.2, 0.5, 0.3, 0.0], [0.2, 0.5, 0.3, 0.0], [0.2, 0.5, 0.3, 0.0])
    assert group.select(beams, prefix, in_prefix=True) == [(i, 1, float(prefix[0, 1])) for i in range(3)]
    assert not group.expanded and not group.finished
    text = group.select([Hypothesis([1], [math.log(0.5)])] * 3, prefix)
    assert sorted(t for _, t, _ in text) == [0, 1, 2]  # then beam 0 expands into three


def test_the_continuations_chosen_are_the_best_over_every_beam_and_token():
    """The search ranks each beam's best tokens before ranking across beams; what it keeps must
    be what ranking every (beam, token) pair at once keeps, whichever beam holds the best ones."""
    generator = torch.Generator().manual_seed(3)
    size, vocab = 4, 600
    for trial in range(20):
        group = BeamGroup(size=size, eot_id=EOT, expanded=True)
        rows = torch.log_softmax(torch.randn(size, vocab, generator=generator) * 4, dim=-1)
        # Every other trial one beam is far ahead of the rest, so all the continuations kept are
        # its own; in the others the beams are close and the kept ones come from several.
        ahead = trial % size if trial % 2 == 0 else None
        beams = [Hypothesis([9, b], [0.0 if b == ahead else -0.5 * b - (50.0 if ahead is not None else 0.0), -0.2])
                 for b in range(size)]
        scores = torch.tensor([b.score for b in beams])[:, None] + rows
        ranked = sorted(((float(scores[b, t]), b, t) for b in range(size) for t in range(vocab)), reverse=True)
        expected = [(b, t) for _, b, t in ranked if t != EOT][:size]
        chosen = group.select(beams, rows)
        assert [(p, t) for p, t, _ in chosen] == expected
        assert all(lp == float(rows[p, t]) for p, t, lp in chosen)
