"""Which precision the engine runs in, and what the bfloat16 vocabulary projection gives."""

import pytest
import torch

from asr_service.engine.quantize import Bf16Projection
from asr_service.runtime import RuntimeSettings, build_runtime, cpu_has_native_bf16, resolve_precision

pytestmark = pytest.mark.unit


def test_auto_is_bf16_exactly_where_the_cpu_multiplies_bfloat16():
    assert resolve_precision("auto", "cpu") == ("bf16" if cpu_has_native_bf16() else "none")
    assert [resolve_precision(q, "cpu") for q in ("none", "bf16", "int8")] == ["none", "bf16", "int8"]
    assert resolve_precision("auto", "cuda") == "float16"


@pytest.mark.parametrize("settings, message", [
    (RuntimeSettings(quantize="fp8"), "unknown quantization 'fp8'"),
    (RuntimeSettings(engine="sglang", sglang_urls=("http://127.0.0.1:9",), quantize="bf16"), "embedded engine"),
])
def test_a_precision_that_cannot_apply_is_refused_before_loading(settings, message):
    with pytest.raises(ValueError, match=message):
        build_runtime(settings)


def test_the_leading_logits_are_float32_sums_whatever_the_batch():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(5000, 64, generator=generator)
    rows = 4 * torch.randn(6, 64, generator=generator)
    projection = Bf16Projection(weight, None)
    logits = projection(rows)
    top = logits.topk(Bf16Projection.REFINED, dim=-1).indices
    exact = (projection.weight.double()[top] * rows.double()[:, None, :]).sum(-1)
    assert torch.allclose(logits.gather(-1, top).double(), exact, rtol=0, atol=1e-4)
    # The rest keep bfloat16's steps; the leading ones do not.
    assert not torch.equal(logits.gather(-1, top), logits.gather(-1, top).bfloat16().float())
    alone = torch.cat([projection(rows[i:i + 1]) for i in range(len(rows))])
    pairs = torch.cat([projection(rows[i:i + 2]) for i in range(0, len(rows), 2)])
    assert torch.equal(alone, logits) and torch.equal(pairs, logits)
