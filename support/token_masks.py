"""What a compiled constraint lets through next, as a set of token ids (grammar tests)."""

from __future__ import annotations

import torch
import xgrammar as xgr


def allowed(matcher: xgr.GrammarMatcher, vocab_size: int) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    return set((logits[0] == 0).nonzero().flatten().tolist())
