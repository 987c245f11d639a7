"""Which precision the engine runs in, and what the bfloat16 vocabulary projection gives."""

import pytest
import torch
import torch.nn.functional as F

from asr_service.engine.model import Whisper, WhisperDims
from asr_service.engine.quantize import Bf16Projection, Fp16WeightLinear, fbgemm_available, float16_weights
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


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm (x86) holds the float16 weights")
def test_float16_weights_replace_exactly_the_layers_float16_holds():
    """A layer whose weights float16 holds exactly keeps them in float16 and still computes in
    float32; one it does not hold (a float32 fine-tune, an int8 checkpoint dequantized) stays."""
    dims = WhisperDims(n_mels=8, n_audio_ctx=16, n_audio_state=32, n_audio_head=2, n_audio_layer=1,
                       n_vocab=100, n_text_ctx=8, n_text_state=32, n_text_head=2, n_text_layer=1)
    generator = torch.Generator().manual_seed(0)
    model = Whisper(dims)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator).half().float())
        model.decoder.layers[0].mlp.fc1.weight.add_(1e-6)  # no longer a float16 value
    fc1, fc2 = model.decoder.layers[0].mlp.fc1, model.decoder.layers[0].mlp.fc2
    table = model.decoder.token_embedding.weight.detach().clone()
    rows = torch.randn(5, 4 * 32, generator=generator)  # fc2's input: the MLP's width
    expected = F.linear(rows, fc2.weight, fc2.bias)
    float16_weights(model)
    layer = model.decoder.layers[0]
    assert layer.mlp.fc1 is fc1 and isinstance(layer.mlp.fc2, Fp16WeightLinear)
    assert isinstance(model.encoder.layers[0].qkv, Fp16WeightLinear)
    assert layer.mlp.fc2(rows).dtype == torch.float32
    assert torch.allclose(layer.mlp.fc2(rows), expected, rtol=1e-6, atol=1e-5)
    # The table serves lookups in float16 (exactly its values) and the projection from fbgemm.
    tokens = torch.tensor([[0, 7, 99], [3, 3, 50]])
    looked_up = model.decoder.token_embedding(tokens)
    assert looked_up.dtype == torch.float16 and torch.equal(looked_up.float(), table[tokens])
    hidden = torch.randn(3, 32, generator=generator)
    assert torch.allclose(model.decoder.logits(hidden), hidden @ table.T, rtol=1e-6, atol=1e-5)
