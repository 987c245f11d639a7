"""How a beam-search step lands in the engine's rows: which row each chosen continuation takes,
and the state it takes from its parent (engine.beam_search chooses the continuations)."""

from __future__ import annotations

from .sequence import DecodingSequence


def in_parent_slots(chosen: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The continuations ordered so that as many as can stay in their parent's slot (beam i
    continues beam i), whose K/V then needs no copy; the beams of a group share their stream,
    so their order means nothing else."""
    placed: list[tuple[int, int, float] | None] = [None] * len(chosen)
    moved = []
    for continuation in chosen:
        parent = continuation[0]
        if parent < len(placed) and placed[parent] is None:
            placed[parent] = continuation
        else:
            moved.append(continuation)
    free = [i for i, c in enumerate(placed) if c is None]
    for continuation, i in zip(moved, free):
        placed[i] = continuation
    return placed


def take_parents(beams: list[DecodingSequence], chosen: list[tuple[int, int, float]]) -> None:
    """Beam i continues chosen[i]'s parent with its token: tokens, grammar state and logprobs
    copied from the parent (a parent chosen twice has its matcher forked)."""
    states, claimed = [], set()
    for p, token, lp in chosen:
        parent = beams[p]
        matcher = parent.matcher if p not in claimed or parent.matcher is None else parent.matcher.fork()
        claimed.add(p)
        states.append((list(parent.tokens), parent.text_start, matcher, parent.beam_logprobs + [lp], token))
    for beam, (tokens, text_start, matcher, beam_logprobs, token) in zip(beams, states):
        beam.tokens, beam.text_start, beam.matcher, beam.beam_logprobs = tokens, text_start, matcher, beam_logprobs
        beam.append(token)
        if beam.matcher is not None:
            beam.matcher.accept_token(token)
