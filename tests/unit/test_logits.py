"""The logit steps that are plain arithmetic: the vocabulary projection's fast form, vLLM's
penalties and min_p, as vLLM defines them, and the order Whisper's timestamps keep."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from asr_service.engine.logits import NEG_INF, apply_penalties, apply_whisper_rules, sample_one
from asr_service.engine.model import tall_projection
from adapters.decode_request import DecodeParams

pytestmark = pytest.mark.unit


@dataclass
class FakeRow:
    params: DecodeParams
    tokens: list[int] = field(default_factory=list)
    matcher: None = None
    generator: None = None
    text: list[int] | None = None  # the text part's tokens, once it has begun

    def text_tokens(self):
        return self.text


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33])
def test_tall_projection_is_the_plain_product(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(5000, 64, generator=generator)
    hidden = torch.randn(rows, 64, generator=generator)
    out = tall_projection(weight, hidden)
    assert out.shape == (rows, 5000) and out.is_contiguous()
    torch.testing.assert_close(out, hidden @ weight.T, rtol=1e-5, atol=1e-4)
    # Each row's logits are its own: the first row alone gives what it gives in the batch,
    # up to rounding.
    torch.testing.assert_close(tall_projection(weight, hidden[:1])[0], out[0], rtol=1e-5, atol=1e-4)


def test_penalties_follow_vllms_definitions():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]])
    prompt = (0,)
    neutral = FakeRow(DecodeParams(prompt_ids=prompt, eot_id=4), tokens=[0, 1, 1, 2])
    unchanged = logits.clone()
    apply_penalties([neutral], unchanged)
    assert torch.equal(unchanged, logits)  # neutral values: nothing changes

    row = FakeRow(DecodeParams(prompt_ids=prompt, eot_id=4, repetition_penalty=2.0), tokens=[0, 1, 1, 2])
    penalised = logits.clone()
    apply_penalties([row], penalised)
    # Tokens in the prompt (0) or the output (1, 2): positive logits halved, negative doubled.
    assert penalised.tolist() == [[1.0, -4.0, 0.5, 0.5, 3.0]]

    row = FakeRow(DecodeParams(prompt_ids=prompt, eot_id=4, frequency_penalty=0.5, presence_penalty=0.25),
                  tokens=[0, 1, 1, 2])
    penalised = logits.clone()
    apply_penalties([row], penalised)
    # Output tokens only (not the prompt's 0): 1 twice, 2 once.
    assert penalised.tolist() == [[2.0, -2.0 - 2 * 0.5 - 0.25, 1.0 - 0.5 - 0.25, 0.5, 3.0]]


def test_min_p_keeps_only_tokens_near_the_most_likely():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    strict = DecodeParams(prompt_ids=(0,), eot_id=3, temperature=1.0, min_p=0.9)
    assert {sample_one(logits, strict, generator) for _ in range(50)} == {0}
    loose = DecodeParams(prompt_ids=(0,), eot_id=3, temperature=1.0, min_p=0.5)  # 0.3 / 0.5 >= 0.5 stays
    assert {sample_one(logits, loose, generator) for _ in range(200)} == {0, 1}


def test_timestamps_pair_up_and_a_segment_opened_after_another_holds_text():
    eot, ts = 10, 11  # token ids: text below 10, timestamps from 11 (0.02 s apart)
    params = DecodeParams(prompt_ids=(0,), eot_id=eot, timestamp_begin=ts)

    def allowed(text: list[int]) -> set[int]:
        logits = torch.zeros(1, 40)
        logits[0, :ts] = 5.0  # text and the end likelier than all timestamps together: none is forced
        apply_whisper_rules([FakeRow(params, text=text)], logits)
        return {i for i, v in enumerate(logits[0].tolist()) if v > NEG_INF}

    text_ids = set(range(eot))
    assert allowed([ts]) == text_ids | {eot}  # the window's first timestamp: its text, or nothing said
    closed = allowed([ts, 1, 2, ts + 5])  # a segment closed at 0.10 s: the next opens there or later, or the end
    assert closed == {eot} | set(range(ts + 5, 40))
    # The next segment opened: its text follows, not the end (Whisper's sign of speech past the
    # window, which the service's windows never cut: see _timestamp_order).
    assert allowed([ts, 1, 2, ts + 5, ts + 6]) == text_ids
