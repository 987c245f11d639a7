"""Logit filters applied per sequence before sampling: grammar, suppression, timestamp rules.

Each function only edits logits in place (the openai/whisper LogitFilter idea); the batch
loop decides which apply to which row.
"""

from __future__ import annotations

import torch

from .params import DecodeParams

NEG_INF = float("-inf")


def apply_text_rules(logits: torch.Tensor, params: DecodeParams, text_tokens: list[int]) -> None:
    """Rules for a row whose text part has begun; ``text_tokens`` are the text tokens so far."""
    if params.suppress_ids:
        logits[list(params.suppress_ids)] = NEG_INF
    if not text_tokens and params.blank_ids:
        logits[list(params.blank_ids)] = NEG_INF
    if params.timestamp_begin is not None:
        _apply_timestamp_rules(logits, params, text_tokens)


def _apply_timestamp_rules(logits: torch.Tensor, params: DecodeParams, seq: list[int]) -> None:
    """Whisper's timestamp rules: timestamps come in pairs and never go back, the first text
    token is a timestamp no later than max_initial, and a timestamp is forced when their
    summed probability beats every text token."""
    ts_begin, eot = params.timestamp_begin, params.eot_id
    last_ts = len(seq) >= 1 and seq[-1] >= ts_begin
    penultimate_ts = len(seq) < 2 or seq[-2] >= ts_begin
    if last_ts:
        if penultimate_ts:
            logits[ts_begin:] = NEG_INF  # a closed pair: text (or end) must follow
        else:
            logits[:eot] = NEG_INF  # an open segment: close it, or end
    timestamps = [t for t in seq if t >= ts_begin]
    if timestamps:
        # Never go back in time; a segment may not have zero length unless it closes a pair.
        floor = timestamps[-1] if (last_ts and not penultimate_ts) else timestamps[-1] + 1
        logits[ts_begin:floor] = NEG_INF
    if not seq:
        logits[:ts_begin] = NEG_INF
        if params.max_initial_timestamp_index is not None:
            logits[ts_begin + params.max_initial_timestamp_index + 1 :] = NEG_INF
    logprobs = torch.log_softmax(logits, dim=-1)
    timestamp_logprob = torch.logsumexp(logprobs[ts_begin:], dim=-1)
    if timestamp_logprob > logprobs[:ts_begin].max():
        logits[:ts_begin] = NEG_INF
