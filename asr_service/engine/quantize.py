"""Reduced precision on the CPU (``--quantize``): int8 or bfloat16 linear layers; and float32
arithmetic on weights kept in float16.

int8 (opt-in): dynamic quantization of every linear layer (fbgemm). Weights are int8 with one
scale per output channel; activations take one scale per tensor, i.e. per batch, so a sequence's
result depends on what it is batched with. torch.ao.quantization is deprecated upstream in favour
of torchao but still ships in torch 2.x; it is used because it needs nothing beyond torch.

bf16 (what ``auto`` picks where the CPU multiplies bfloat16 natively, runtime.resolve_precision):
the decoder's linear layers and its vocabulary projection keep their weights in bfloat16 (kept
once: the token embedding shares the projection's table) and multiply in bfloat16 with float32
accumulation (oneDNN, fast on CPUs with AVX512-BF16 or AMX); activations, layer norms and the
self-attention caches stay float32. The cross-attention K/V are cached in bfloat16, exactly as
their bfloat16 products come out (V's bias is added after the attention), which halves the
largest cache and what each decode step reads. With the decoder's self-attention written as
plain products and its cross-attention as bfloat16 products (engine/model.py), a sequence decoded
this way gets the same log-probabilities bit for bit whatever it is batched with
(tests/model/test_engine.py), which float32 BLAS does not give. The encoder runs under bfloat16
autocast (BatchEngine's encoder_dtype) with its linear and convolution weights stored in
bfloat16: autocast would round them to exactly those values on every pass, so the output is the
same bit for bit and the float32 copies are not kept. Their WER is measured in bench/.

float16 weights (what float32, ``none``, runs on where fbgemm is there: x86 CPUs): every linear
layer whose weights float16 holds exactly (all of them for Whisper's float16 checkpoints) keeps
them in float16, packed by fbgemm, which widens them to float32 inside its product: the inputs,
products, sums and outputs stay float32, so it is float32 inference on the same weights in half
their memory, and the few-row products of decoding, which are bound by reading weights, go
faster (bench/kernel_probes.py). Like float32 BLAS, fbgemm rounds a row's sums in another order
for some row counts (its kernels for one and two rows differ from the rest), so a sequence keeps
its tokens in any batch (tests/model/test_engine.py), not every last digit. Token lookups, which the
packed copy cannot serve, read the checkpoint's float16 rows mapped from its file where the loader
found them there (Float16TokenRows), so the weights are held in memory once.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

from .model import Whisper


def quantize_int8(model: Whisper) -> Whisper:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation notice of torch.ao.quantization
        projection = nn.Linear(model.dims.n_text_state, model.dims.n_vocab, bias=False)
        projection.weight = model.decoder.token_embedding.weight
        model.decoder.output_projection = projection
        # Per output channel, as CTranslate2 quantizes: per-tensor scales cost real WER here.
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)


class Bf16Linear(nn.Module):
    """A linear layer multiplying in bfloat16: bfloat16 weight, input rounded to bfloat16, the
    product returned in the input's precision; the bias (if any) is added there, in float32.

    oneDNN's product rounds a row the same for any number of rows from two on; a lone row goes
    through another kernel that can round differently, so it is given twice."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if rows.shape[0] == 1:
            out = F.linear(torch.cat([rows, rows]), self.weight)[:1]
        else:
            out = F.linear(rows, self.weight)
        out = out.to(x.dtype).reshape(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias


class Bf16Projection(Bf16Linear):
    """The tied vocabulary projection in bfloat16, its leading candidates made exact.

    oneDNN returns a bfloat16 product, about three significant digits: logits near 32 come in
    steps of 0.25, and two tokens can tie exactly where float32 tells them apart (seen: "-" and
    "," after "1" in a counting clip). The few tokens that can win are recomputed from the
    float32 input and the same bfloat16 weights with float32 products and sums, which costs a
    few thousand multiply-adds a row. Each is one row's own sum, so the result still does not
    depend on the batch."""

    REFINED = 8  # candidates per row

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        logits = super().forward(rows)
        top = logits.topk(self.REFINED, dim=-1).indices
        exact = (self.weight[top].to(rows.dtype) * rows[:, None, :]).sum(dim=-1)
        return logits.scatter_(-1, top, exact)


def bf16(model: Whisper) -> Whisper:
    for module in model.encoder.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):  # layer norms and positions stay float32, as autocast wants
            module.to(torch.bfloat16)
    decoder = model.decoder
    for layer in decoder.layers:
        for name in ("self_qkv", "self_out", "cross_q", "cross_out"):
            setattr(layer, name, _bf16(getattr(layer, name)))
        # K and V without bias: K's only shifts a query's scores alike (softmax ignores it), V's
        # is added after the attention; the products are cached as oneDNN gives them, exactly.
        d = layer.cross_kv.in_features
        layer.cross_value_bias = layer.cross_kv.bias.detach()[d:].clone()
        layer.cross_kv = Bf16Linear(layer.cross_kv.weight, None)
        layer.mlp.fc1, layer.mlp.fc2 = _bf16(layer.mlp.fc1), _bf16(layer.mlp.fc2)
    projection = Bf16Projection(decoder.token_embedding.weight, None)
    decoder.token_embedding.weight = projection.weight  # one bfloat16 table for both
    decoder.output_projection = projection
    # engine/model.py's _audio_attention reads the cached K/V in bfloat16.
    model.audio_cache_dtype = torch.bfloat16
    return model


def _bf16(linear: nn.Linear) -> Bf16Linear:
    return Bf16Linear(linear.weight, linear.bias)


class Fp16WeightLinear(nn.Module):
    """A float32 linear layer whose weight is stored as float16 (fbgemm's packed layout) and
    widened to float32 inside the product: float32 inputs, products, sums and output.

    Only for weights that float16 holds exactly (Whisper's checkpoints are float16), so it is the
    same float32 layer in half the memory; a decode step reads its weights once per step, and
    reading half the bytes makes the few-row products of decoding faster (bench/kernel_probes.py)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # The bias stays float32 inside the packed layer.
        bias = None if bias is None else bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().float(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        return torch.ops.quantized.linear_dynamic_fp16(rows, self.packed).reshape(*x.shape[:-1], self.out_features)


def fbgemm_available() -> bool:
    """fbgemm (x86 only) has the float16-weight product; elsewhere float32 keeps float32 weights."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def holds_exactly_in_float16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.to(torch.float16).to(t.dtype), t))


class Float16TokenRows(nn.Module):
    """Token embedding lookups from a float16 table held as the bytes of its rows ([vocab, 2 * d]
    uint8): the checkpoint's table mapped from the model file, whose rows need not start at an
    even byte, or a float16 copy. A lookup copies the rows it needs into a new (aligned) tensor
    and reads them as float16. Lookups only: the projection is the decoder's output_projection."""

    def __init__(self, row_bytes: torch.Tensor):
        super().__init__()
        self.row_bytes = row_bytes  # an attribute, not a buffer: a mapped file is no model state

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.row_bytes[tokens].view(torch.float16)


def float16_weights(model: Whisper, mapped_token_rows: torch.Tensor | None = None) -> Whisper:
    """Float32 linear layers with float16 weights (see above), where that loses nothing: layers
    whose weights float16 does not hold exactly (an int8 checkpoint's dequantized weights, a
    float32 fine-tune) stay as they are.

    The token embedding's table is also the vocabulary projection's, and fbgemm's packed copy
    cannot be indexed, so lookups need the table a second time. ``mapped_token_rows``, the
    checkpoint's own float16 rows mapped from the model file (model_loading), serves them with
    only the rows looked up read into memory, so the weights are held in memory once; without
    it, lookups read a float16 copy."""
    decoder = model.decoder
    table = decoder.token_embedding.weight
    # (parent, attribute, weight, bias) of every layer to pack; the vocabulary projection, the
    # largest by far, first, so that the others are packed beside it.
    layers = [(decoder, "output_projection", table, None)]
    layers += [(parent, name, child.weight, child.bias) for parent in list(model.modules())
               for name, child in list(parent.named_children()) if isinstance(child, nn.Linear)]

    def packed(layer) -> Fp16WeightLinear | None:
        _, _, weight, bias = layer
        return Fp16WeightLinear(weight, bias) if holds_exactly_in_float16(weight) else None

    # fbgemm packs a layer on one core and lets go of the GIL meanwhile: the layers are packed
    # side by side, one per torch thread.
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        for (parent, name, _, _), layer in zip(layers, list(pool.map(packed, layers))):
            if layer is not None:
                setattr(parent, name, layer)
    if isinstance(decoder.output_projection, Fp16WeightLinear):
        vocab, width = table.shape
        if mapped_token_rows is None or mapped_token_rows.shape != (vocab, 2 * width):
            mapped_token_rows = table.detach().to(torch.float16).view(torch.uint8)
        decoder.token_embedding = Float16TokenRows(mapped_token_rows)
    return model
