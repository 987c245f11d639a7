"""What this CPU's torch kernels offer the next speed-up, measured rather than assumed.

    python -m bench.kernel_probes [--threads 2] [--out bench/results/kernel-probes-DATE.json]

Five probes, one run, the packaged model's shapes (float32):
1. The encoder with torch's dynamic int8 linear layers (per-channel weights, one activation
   scale per tensor) against float32 on one 30 s window: time, the output's relative error,
   and whether a window gives the same output alone and beside another (per-tensor scales:
   it need not). The same with one activation scale per row (``RowScaledInt8Linear`` below),
   which cannot depend on the batch, and with float16-stored weights (the float32 default).
2. ``torch._int_mm`` (int8 x int8 -> exact int32 sums, what a per-row int8 scheme whose result
   cannot depend on the batch would run on) against the float32 product of the same shapes.
3. The decoder's cross-attention products over 7 windows' K/V, for 1 query a window (greedy)
   and 5 (a 5-beam search), with the K/V stored as the engine stores them ([audios, heads,
   frames, head dim]) and frames-last ([audios, heads, head dim, frames], read through
   transposed views), float32, and bfloat16 through the fused kernel and as the engine's
   bfloat16 products (engine/model.py ``_audio_attention``, what ``bf16`` decodes with), with
   each bfloat16 form's relative error against float32; plus whether a window's result is the
   same alone as among the seven.
4. fbgemm's float32 product with float16-stored weights (what float32 runs on, engine/quantize.py)
   against float32 BLAS, at the shapes of decoding (1-40 rows) and of the encoder (1500 rows),
   with the largest difference between the two. And the vocabulary projection with one int8
   activation scale per row, its time and relative error.
5. The cross-attention K/V stored in float16 (half the largest float32 cache), read by the
   fused kernel and by fbgemm's float16-weight product (K and V^T of each head packed as the
   "weights"), against today's float32 products over the same 8 windows, 1 query a window.
Best of five repeats each. Absolute times on a shared machine are noisy; compare rows of one run.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from asr_service.engine.features import SAMPLE_RATE, log_mel_spectrogram
from asr_service.engine.model import _audio_attention
from asr_service.engine.quantize import Fp16WeightLinear
from asr_service.model_loading import load_model
from support.clips import load_clip

WINDOWS, QUERIES = 7, (1, 5)
PRODUCT_SHAPES = ((1500, 512, 2048), (1500, 2048, 512), (40, 512, 51865))  # encoder MLP in/out, 40-row vocabulary
# Decoder MLP at 1 and 8 rows, the vocabulary at 1, 8 and 40 rows, the encoder's MLP.
FLOAT16_WEIGHT_SHAPES = ((1, 512, 2048), (8, 512, 2048), (8, 2048, 512), (1, 512, 51865), (8, 512, 51865),
                         (40, 512, 51865), (1500, 512, 2048), (1500, 2048, 512))


def best_ms(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 2)


class RowScaledInt8Linear(torch.nn.Module):
    """int8 with one activation scale per row on torch's dynamic int8 kernel (fbgemm), which
    takes one scale per tensor: each row is divided by its largest magnitude, and one extra row
    [1, -1, 0, ...] pins the tensor's range to [-1, 1], so the kernel's single scale is the same
    for every batch and each row's step is its own. int8 sums are exact and the kernel's
    rescaling is per element, so a row's output cannot depend on the rows beside it. Only a
    probe: the engine does not use it (docs/performance.md says why)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127).double()
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        self.packed = torch.ops.quantized.linear_prepack(
            torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8), None)
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        largest = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
        scaled = torch.zeros(n + 1, rows.shape[1])
        torch.div(rows, largest, out=scaled[:n])
        scaled[n, 0], scaled[n, 1] = 1.0, -1.0
        # reduce_range: 7-bit activations, as AVX2 without VNNI needs to keep int16 pair sums from saturating
        out = torch.ops.quantized.linear_dynamic(scaled, self.packed, True)[:n] * largest
        out = out if self.bias is None else out + self.bias
        return out.reshape(*x.shape[:-1], -1)


def _relative_error(out: torch.Tensor, reference: torch.Tensor, digits: int = 6) -> float:
    return round(float((out - reference).norm() / reference.norm()), digits)


def _with_linear_layers(module: torch.nn.Module, make) -> torch.nn.Module:
    """A copy of ``module`` whose nn.Linear layers are ``make(weight, bias)``."""
    module = copy.deepcopy(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, make(child.weight, child.bias))
    return module


def encoder_int8(model) -> dict:
    audio = np.zeros(30 * SAMPLE_RATE, np.float32)
    clip = load_clip("en", "quick_brown_fox")
    audio[: clip.shape[0]] = clip
    mel = log_mel_spectrogram(audio, model.dims.n_mels)[None]
    encoder = model.encoder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation notice of torch.ao.quantization
        qconfig = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(encoder), qconfig, dtype=torch.qint8)
    row_int8 = _with_linear_layers(encoder, RowScaledInt8Linear)
    float16 = _with_linear_layers(encoder, Fp16WeightLinear)
    reference = encoder(mel)
    report = {"float32_ms": best_ms(lambda: encoder(mel)), "float16_weights_ms": best_ms(lambda: float16(mel))}
    for name, variant in (("int8", int8), ("int8_per_row", row_int8)):
        out = variant(mel)
        beside_another = variant(torch.cat([mel, mel.flip(-1)]))[:1]
        report |= {f"{name}_ms": best_ms(lambda: variant(mel)),
                   f"{name}_relative_error": _relative_error(out, reference, 4),
                   f"{name}_same_beside_another_window": bool(torch.equal(beside_another, out))}
    return report


def int_products() -> list[dict]:
    rows = []
    for m, k, n in PRODUCT_SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        xq = torch.randint(-127, 128, (m, k), dtype=torch.int8)
        wq = torch.randint(-127, 128, (n, k), dtype=torch.int8).T  # weights kept [out, in], as nn.Linear's
        rows.append({"shape": [m, k, n], "float32_ms": best_ms(lambda: x @ w.T),
                     "int_mm_ms": best_ms(lambda: torch._int_mm(xq, wq))})
    return rows


def float16_weight_products(model) -> list[dict]:
    """Real weights (the packaged model's, float16 at heart) at each shape's (rows, in, out)."""
    weights = {(512, 2048): model.decoder.layers[0].mlp.fc1.weight, (2048, 512): model.decoder.layers[0].mlp.fc2.weight,
               (512, 51865): model.decoder.token_embedding.weight}
    rows = []
    for m, k, n in FLOAT16_WEIGHT_SHAPES:
        w, x = weights[(k, n)].float(), torch.randn(m, k)
        stored_float16 = Fp16WeightLinear(w, None)  # the engine's own layer
        reference = x @ w.T
        row = {"shape": [m, k, n], "float32_ms": best_ms(lambda: x @ w.T),
               "float16_weights_ms": best_ms(lambda: stored_float16(x)),
               "max_difference": float((stored_float16(x) - reference).abs().max())}
        if n == model.dims.n_vocab:
            row_int8 = RowScaledInt8Linear(w, None)
            row |= {"int8_per_row_ms": best_ms(lambda: row_int8(x)),
                    "int8_per_row_relative_error": _relative_error(row_int8(x), reference, 4)}
        rows.append(row)
    return rows


def _attention(q, k, v):
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)).softmax(-1) @ v


def cross_attention_layouts(dims) -> list[dict]:
    heads, frames = dims.n_text_head, dims.n_audio_ctx
    head_dim = dims.n_text_state // heads
    layers = dims.n_text_layer
    rows = []
    for queries in QUERIES:
        kv = [(torch.randn(WINDOWS, heads, frames, head_dim), torch.randn(WINDOWS, heads, frames, head_dim))
              for _ in range(layers)]
        frames_last = [tuple(t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in pair) for pair in kv]
        bf16 = [tuple(t.to(torch.bfloat16) for t in pair) for pair in kv]
        bf16_frames_last = [tuple(t.to(torch.bfloat16) for t in pair) for pair in frames_last]
        q = torch.randn(WINDOWS, heads, queries, head_dim)
        qb = q.to(torch.bfloat16)
        exact = _attention(q, *kv[0])
        engine_bf16 = _audio_attention(q, *bf16[0])
        k, v = frames_last[0]
        alone = _attention(q[:1], k[:1], v[:1])
        rows.append({
            "queries_per_window": queries, "windows": WINDOWS, "layers": layers,
            "float32_ms": best_ms(lambda: [_attention(q, k, v) for k, v in kv]),
            "float32_frames_last_ms": best_ms(lambda: [_attention(q, k, v) for k, v in frames_last]),
            "frames_last_max_difference": float((exact - _attention(q, k, v)).abs().max()),
            "frames_last_same_alone_and_batched": bool(torch.equal(alone, _attention(q, k, v)[:1])),
            "bfloat16_fused_ms": best_ms(lambda: [F.scaled_dot_product_attention(qb, k, v) for k, v in bf16]),
            "bfloat16_fused_frames_last_ms": best_ms(
                lambda: [F.scaled_dot_product_attention(qb, k, v) for k, v in bf16_frames_last]),
            "bfloat16_fused_relative_error": _relative_error(
                F.scaled_dot_product_attention(qb, *bf16[0]).float(), exact),
            "bfloat16_products_ms": best_ms(lambda: [_audio_attention(q, k, v) for k, v in bf16]),
            "bfloat16_products_relative_error": _relative_error(engine_bf16, exact),
            "bfloat16_products_same_alone_and_batched": bool(torch.equal(
                _audio_attention(q[:1], bf16[0][0][:1], bf16[0][1][:1]), engine_bf16[:1])),
        })
    return rows


def float16_audio_cache(dims) -> dict:
    heads, frames = dims.n_text_head, dims.n_audio_ctx
    head_dim = dims.n_text_state // heads
    windows = 8
    k, v = torch.randn(windows, heads, frames, head_dim), torch.randn(windows, heads, frames, head_dim)
    q = torch.randn(windows, heads, 1, head_dim)
    k16, v16 = k.half(), v.half()
    prepack = torch.ops.quantized.linear_prepack_fp16
    product = torch.ops.quantized.linear_dynamic_fp16
    packed = [[(prepack(k[w, h] * head_dim ** -0.5, None), prepack(v[w, h].T.contiguous(), None))
               for h in range(heads)] for w in range(windows)]

    def per_head_fbgemm():
        out = torch.empty_like(q)
        for w in range(windows):
            for h in range(heads):
                keys, values_t = packed[w][h]
                out[w, h] = product(product(q[w, h], keys).softmax(dim=-1), values_t)
        return out

    def fused():
        return F.scaled_dot_product_attention(q.half(), k16, v16).float()

    reference = _attention(q, k, v)
    return {"windows": windows, "queries_per_window": 1, "one_layer": True,
            "float32_ms": best_ms(lambda: _attention(q, k, v)),
            "float16_fused_ms": best_ms(fused),
            "float16_fused_relative_error": _relative_error(fused(), reference),
            "float16_per_head_fbgemm_ms": best_ms(per_head_fbgemm),
            "float16_per_head_fbgemm_relative_error": _relative_error(per_head_fbgemm(), reference)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/kernel-probes-{datetime.date.today()}.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model().model  # float32 nn.Linear layers, as loaded (the runtime's may hold float16 weights)
    with torch.inference_mode():
        report = {"run": datetime.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
                  "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "encoder_int8": encoder_int8(model), "int_mm": int_products(),
                  "cross_attention": cross_attention_layouts(model.dims),
                  "float16_weights": float16_weight_products(model),
                  "float16_audio_cache": float16_audio_cache(model.dims)}
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
