"""The logits pipeline of one decode step, as small parts with one job each (openai/whisper's
LogitFilter / TokenDecoder split): the grammar mask and Whisper's rules only edit logits, the
sampler only picks tokens. The batch loop runs them in that order over all active rows.

Logits arrive in float32 on the model's device; masks are applied in place.
"""

from __future__ import annotations

from typing import Protocol

import torch
import xgrammar as xgr

from adapters.decode_request import DecodeParams

NEG_INF = float("-inf")


class Row(Protocol):
    """What the pipeline reads of one active sequence."""

    params: DecodeParams
    matcher: xgr.GrammarMatcher | None
    generator: torch.Generator | None
    tokens: list[int]  # prompt + generated

    def text_tokens(self) -> list[int] | None: ...


def apply_penalties(rows: list[Row], logits: torch.Tensor) -> None:
    """vLLM's repetition, frequency and presence penalties (see DecodeParams), for the rows that
    set them; a request that sets none pays nothing."""
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(row.tokens)), device=logits.device)
            values = logits[i, seen]
            logits[i, seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        generated = row.tokens[len(p.prompt_ids):] if p.frequency_penalty or p.presence_penalty else ()
        if generated:
            ids, counts = torch.tensor(generated, device=logits.device).unique(return_counts=True)
            logits[i, ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty


class GrammarMask:
    """Each row's grammar, as one bitmask over the batch: filled on the CPU by xgrammar's matchers,
    applied on the logits' device."""

    def __init__(self, max_rows: int, vocab_size: int):
        self._bitmask = xgr.allocate_token_bitmask(max_rows, vocab_size)

    def __call__(self, rows: list[Row], logits: torch.Tensor) -> None:
        bitmask = self._bitmask[: len(rows)]
        constrained = False
        for i, row in enumerate(rows):
            if row.matcher is not None:
                row.matcher.fill_next_token_bitmask(bitmask, i)
                constrained = True
            else:
                bitmask[i] = -1  # every token allowed
        if not constrained:
            return
        if logits.device.type == "cpu":
            xgr.apply_token_bitmask_inplace(logits, bitmask)
        else:
            apply_bitmask(logits, bitmask.to(logits.device, non_blocking=True))


def apply_whisper_rules(rows: list[Row], logits: torch.Tensor) -> None:
    """Whisper's rules that a constraint cannot say, for each row whose text part has begun
    (the others are in the adapter's grammar: see adapters/whisper_grammar.py)."""
    timed: dict[int, list[int]] = {}  # timestamp_begin -> the rows whose text is timed
    for i, row in enumerate(rows):
        text = row.text_tokens()
        if text is None:
            continue
        params = row.params
        if not text and params.blank_ids:
            logits[i, list(params.blank_ids)] = NEG_INF  # no blank first token
        if params.timestamp_begin is not None:
            _timestamp_order(logits[i], params.timestamp_begin, params.eot_id, text)
            timed.setdefault(params.timestamp_begin, []).append(i)
    for ts_begin, indices in timed.items():
        _force_likely_timestamps(logits, ts_begin, indices)


def _force_likely_timestamps(logits: torch.Tensor, ts_begin: int, indices: list[int]) -> None:
    """A timestamp is forced where the timestamps' summed probability beats every text token's:
    one pass over all the rows (per row it was most of a timed step's logits time). Both sides
    share the row's softmax normaliser, so the logits are compared without it; each row is
    reduced on its own, so its result does not depend on the others."""
    rows = torch.tensor(indices, device=logits.device)
    timed = logits if len(indices) == logits.shape[0] else logits[rows]  # every row timed: no copy
    timestamp_mass = torch.logsumexp(timed[:, ts_begin:], dim=-1)
    forced = rows[timestamp_mass > timed[:, :ts_begin].max(dim=-1).values]
    if forced.numel():
        logits[forced, :ts_begin] = NEG_INF


def _timestamp_order(logits: torch.Tensor, ts_begin: int, eot: int, seq: list[int]) -> None:
    """Timestamps come in pairs and never go back, and a segment opened after another holds text.

    The last rule is not OpenAI's. Whisper may end a decode on the opening timestamp of a
    segment it leaves empty: its sign that speech runs on past the end of its 30 s window, and
    the sequential algorithm seeks there. This service's windows end where speech pauses, or at
    the quietest point where it does not (asr_service/chunking.py), so that sign is wrong in them,
    and it left the window's last words to a continuation decoded from the second or two of
    audio after the timestamp, heard alone, which misheard them (docs/long-form.md). Text
    must follow instead, heard with the whole window. A window's very first timestamp may still
    end the decode (nothing said in the window)."""
    last_ts = len(seq) >= 1 and seq[-1] >= ts_begin
    penultimate_ts = len(seq) < 2 or seq[-2] >= ts_begin
    if last_ts:
        if penultimate_ts:
            logits[ts_begin:] = NEG_INF  # a segment has opened: its text follows
            if len(seq) >= 2:
                logits[eot] = NEG_INF  # after another segment: not the end either
        else:
            logits[:eot] = NEG_INF  # a segment has closed: the next one opens, or the decode ends
    timestamps = [t for t in seq if t >= ts_begin]
    if timestamps:
        # Never go back in time; a segment may not have zero length unless it closes a pair.
        floor = timestamps[-1] if (last_ts and not penultimate_ts) else timestamps[-1] + 1
        logits[ts_begin:floor] = NEG_INF


def choose_tokens(rows: list[Row], logits: torch.Tensor) -> list[int]:
    """Greedy for every row, sampled for rows that have a generator (temperature > 0)."""
    chosen = logits.argmax(dim=-1).tolist()
    for i, row in enumerate(rows):
        if row.generator is not None:  # on the CPU, where its generator is: a seed gives one result anywhere
            chosen[i] = sample_one(logits[i].cpu(), row.params, row.generator)
    return chosen


def sample_one(logits: torch.Tensor, params: DecodeParams, generator: torch.Generator) -> int:
    """Temperature sampling over the tokens that survive top_k, then top_p (nucleus), then min_p.

    When the grammar leaves no token (all -inf), the argmax is returned: its log-probability is
    -inf, which ends the sequence as "grammar" exactly as in the greedy path (softmax of all -inf
    is NaN, which multinomial refuses)."""
    scaled = torch.nan_to_num(logits / params.temperature, nan=NEG_INF)
    if not torch.isfinite(scaled).any():
        return int(torch.argmax(logits))
    if params.top_k:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1])).values[-1]
        scaled = scaled.masked_fill(scaled < kth, NEG_INF)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        drop[0] = False
        scaled = scaled.scatter(0, order[drop], NEG_INF)
    probabilities = torch.softmax(scaled, dim=-1)
    if params.min_p > 0:
        probabilities = probabilities.masked_fill(probabilities < params.min_p * probabilities.max(), 0.0)
    return int(torch.multinomial(probabilities, 1, generator=generator))


_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """xgrammar's token bitmask (int32 words, token i = bit i % 32 of word i // 32) applied with
    plain torch ops, on any device: xgrammar's own GPU kernels need triton or a compiler at run
    time; this needs neither. Disallowed tokens get -inf in place."""
    shifts = _BIT_SHIFTS.get(bitmask.device)
    if shifts is None:
        shifts = _BIT_SHIFTS[bitmask.device] = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)[:, : logits.shape[-1]]
    logits.masked_fill_(~allowed, NEG_INF)
