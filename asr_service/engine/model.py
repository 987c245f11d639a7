"""Whisper as plain torch modules, shaped for a batched decode loop.

Why not transformers' WhisperModel: the engine owns its KV caches (one slot per active
sequence, cross-attention K/V computed once per chunk) and steps every sequence together;
a small module set with explicit cache tensors keeps that loop short and fast (the
gpt-fast idea). Weight names follow this file; loaders map CTranslate2 or HF names here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class WhisperDims:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int


class Mlp(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


@dataclass(frozen=True)
class AudioRun:
    """Consecutive audio slots ``first`` .. ``first + audios - 1``, each read by exactly
    ``rows_per_audio`` rows; ``rows`` [audios * rows_per_audio] lists those rows audio by audio,
    each audio's rows in their rank order."""
    first: int
    audios: int
    rows_per_audio: int
    rows: torch.Tensor


@dataclass(frozen=True)
class SharedAudio:
    """How a one-token step's rows map onto audio slots when they are not one audio per row
    (the beams of a search share their window's cross-attention K/V, the largest thing a step
    reads, so it is read once for all of them).

    The slots are cut into runs of equal reader counts, and each run is multiplied on its own
    with exactly its own count of queries per audio. Why not one product padded to the largest
    count: BLAS rounds a query's scores differently for another number of queries beside it, so
    a greedy row (or a search) would decode differently beside a larger search than alone."""
    runs: tuple[AudioRun, ...]

    @classmethod
    def from_slots(cls, audio_of_row: list[int], device: torch.device | str = "cpu") -> SharedAudio:
        """``audio_of_row[i]``: the audio slot row i reads (slots 0 .. n-1, every one read)."""
        rows_of: dict[int, list[int]] = {}
        for row, audio in enumerate(audio_of_row):
            rows_of.setdefault(audio, []).append(row)
        runs: list[AudioRun] = []
        audio = 0
        while audio < len(rows_of):
            count, end = len(rows_of[audio]), audio + 1
            while end < len(rows_of) and len(rows_of[end]) == count:
                end += 1
            rows = [r for a in range(audio, end) for r in rows_of[a]]
            runs.append(AudioRun(audio, end - audio, count, torch.tensor(rows, device=device)))
            audio = end
        return cls(tuple(runs))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) | mask) v as plain matrix products: the decoder's attention.

    Why not F.scaled_dot_product_attention: its CPU kernel splits the work differently by batch
    size, so a row's result changes in its last digits with the batch around it. These products
    round each row alike in any batch, and at any key span that is a whole number of 64-position
    blocks (masked keys add exact zeros; the engine rounds the span up: batch_engine._forward),
    which keeps a sequence's result its own. For the one-query steps of decoding they are no
    slower. The encoder (one window, 1500 queries) keeps the fused kernel."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # scaled first: no overflow in float16
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def _audio_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention over cached audio K/V, in the precision the cache keeps them in.

    bfloat16 K/V (``--quantize bf16``, see engine/quantize.py) are multiplied as bfloat16
    products (oneDNN: float32 sums, bfloat16 results): the scores come out rounded to bfloat16,
    as every bfloat16 layer's output does, the softmax runs in float32 on them and its weights
    are rounded to bfloat16 for the product with V, as the fused kernel rounds them too. The
    fused kernel (F.scaled_dot_product_attention) keeps the scores in float32 but took two to
    six times as long for the few queries of a decode step on an AVX512-BF16 CPU
    (bench/kernel_probes.py), and this is the largest thing a step reads. The products give a
    query the same result whatever the number of audios beside it (each audio's heads are their
    own products), so a sequence still decodes the same in any batch (tests/model/test_engine.py
    checks the decode bit for bit)."""
    if k.dtype == torch.bfloat16:
        scores = (q * q.shape[-1] ** -0.5).to(torch.bfloat16) @ k.transpose(-1, -2)
        return (scores.softmax(dim=-1) @ v).to(q.dtype)
    return _attention(q, k, v)


def _cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shared: SharedAudio | None) -> torch.Tensor:
    """q [rows, H, T, hd] against k/v [audios, H, frames, hd]: one audio per row, or as
    ``shared`` says (then T is 1). Each run's K/V is a view: nothing of it is copied."""
    if shared is None:
        return _audio_attention(q, k, v)
    out = torch.empty_like(q)
    heads, head_dim = q.shape[1], q.shape[-1]
    for run in shared.runs:
        grouped = q[run.rows, :, 0].view(run.audios, run.rows_per_audio, heads, head_dim).transpose(1, 2)
        end = run.first + run.audios
        a = _audio_attention(grouped, k[run.first:end], v[run.first:end])  # [audios, H, rows_per_audio, hd]
        out[run.rows] = a.transpose(1, 2).reshape(-1, heads, 1, head_dim)
    return out


class EncoderLayer(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.attn_ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)  # fused q,k,v (k has no bias in Whisper: kept at zero)
        self.out = nn.Linear(d, d)
        self.mlp_ln = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_ln(x)).chunk(3, dim=-1)
        h = self.n_head
        a = F.scaled_dot_product_attention(_split_heads(q, h), _split_heads(k, h), _split_heads(v, h))
        x = x + self.out(_merge_heads(a))
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        d = dims.n_audio_state
        self.conv1 = nn.Conv1d(dims.n_mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positions", torch.zeros(dims.n_audio_ctx, d))
        self.layers = nn.ModuleList(EncoderLayer(d, dims.n_audio_head) for _ in range(dims.n_audio_layer))
        self.ln_post = nn.LayerNorm(d)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, 3000] -> audio features [B, 1500, d]."""
        x = F.gelu(self.conv1(mel))
        # Made contiguous here: else every residual sum below keeps the convolution's
        # channel-first layout, and each add and layer norm walks it with a stride.
        x = F.gelu(self.conv2(x)).transpose(1, 2).contiguous()
        x = x + self.positions[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.ln_post(x)


class DecoderLayer(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.self_ln = nn.LayerNorm(d)
        self.self_qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.cross_ln = nn.LayerNorm(d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)  # fused cross k,v (k without bias)
        # Set by engine/quantize.py's bf16: V's bias, added to the attention's output instead of
        # to the cached V (softmax weights sum to one), so a bfloat16 cache holds V exactly.
        self.cross_value_bias: torch.Tensor | None = None
        self.cross_out = nn.Linear(d, d)
        self.mlp_ln = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def cross_kv_for(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.cross_kv(audio).chunk(2, dim=-1)
        return _split_heads(k, self.n_head), _split_heads(v, self.n_head)

    def forward(
        self,
        x: torch.Tensor,
        self_k: torch.Tensor,
        self_v: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        write_index: torch.Tensor,
        attn_mask: torch.Tensor,
        attention_heads: list[int] | None = None,
        shared: SharedAudio | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer over new tokens x [B, T, d].

        self_k/self_v [B, H, T_ctx, hd] are cache views written in place at write_index
        [B, T] (the positions of the new tokens); attn_mask [B, 1, T, T_ctx] says which cache
        positions each new token may see; cross_k/cross_v hold one audio per row unless ``shared``
        maps rows onto them. With ``attention_heads`` it also returns those
        heads' cross-attention weights [B, len(heads), T, T_audio] (for word timing).
        """
        h = self.n_head
        q, k, v = self.self_qkv(self.self_ln(x)).chunk(3, dim=-1)
        q, k, v = _split_heads(q, h), _split_heads(k, h), _split_heads(v, h)
        idx = write_index[:, None, :, None].expand(-1, h, -1, k.shape[-1])
        self_k.scatter_(2, idx, k)
        self_v.scatter_(2, idx, v)
        a = _attention(q, self_k, self_v, attn_mask)
        x = x + self.self_out(_merge_heads(a))
        q = _split_heads(self.cross_q(self.cross_ln(x)), h)
        a = _cross_attention(q, cross_k, cross_v, shared)
        if self.cross_value_bias is not None:
            a = a + self.cross_value_bias.view(1, h, 1, -1)
        x = x + self.cross_out(_merge_heads(a))
        x = x + self.mlp(self.mlp_ln(x))
        if attention_heads is None:
            return x
        heads_k = cross_k[:, attention_heads].to(q.dtype)  # a copy of a few heads, when the cache is bfloat16
        scores = q[:, attention_heads] @ heads_k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return x, scores.softmax(dim=-1)


class TextDecoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        d = dims.n_text_state
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.positions = nn.Parameter(torch.zeros(dims.n_text_ctx, d))
        self.layers = nn.ModuleList(DecoderLayer(d, dims.n_text_head) for _ in range(dims.n_text_layer))
        self.ln = nn.LayerNorm(d)
        # Set by engine/quantize.py: a linear layer in another precision or storage (int8, bfloat16,
        # float16-stored weights) standing in for the tied projection. With float16-stored weights
        # it also replaces token_embedding by a lookup-only module (tokens -> float16 rows).
        self.output_projection: nn.Module | None = None

    def forward(self, tokens, positions, caches, cross, attn_mask, shared: SharedAudio | None = None) -> torch.Tensor:
        """tokens/positions [B, T] -> hidden states [B, T, d] (logits are taken by the caller,
        only where needed: the vocabulary projection is the costliest matmul of a step)."""
        x = self.token_embedding(tokens) + self.positions[positions]
        for layer, (sk, sv), (ck, cv) in zip(self.layers, caches, cross):
            x = layer(x, sk, sv, ck, cv, positions, attn_mask, shared=shared)
        return self.ln(x)

    def cross_attention(self, tokens: torch.Tensor, cross: list, heads: list[tuple[int, int]]) -> torch.Tensor:
        """Teacher-forced pass over ``tokens`` [1, T] (one sequence, from scratch) returning the
        cross-attention weights of the (layer, head) pairs: [len(heads), T, T_audio]."""
        n = tokens.shape[1]
        positions = torch.arange(n, device=tokens.device)[None]
        causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()[None, None]
        x = self.token_embedding(tokens) + self.positions[positions]
        found: dict[tuple[int, int], torch.Tensor] = {}
        for i, (layer, (ck, cv)) in enumerate(zip(self.layers, cross)):
            wanted = [h for l, h in heads if l == i]
            # The self-attention caches' precision (the activations'), not the audio cache's.
            scratch_k = torch.zeros(1, layer.n_head, n, ck.shape[-1], device=ck.device, dtype=self.positions.dtype)
            scratch_v = torch.zeros_like(scratch_k)
            if wanted:
                x, weights = layer(x, scratch_k, scratch_v, ck, cv, positions, causal, wanted)
                found.update({(i, h): weights[0, j] for j, h in enumerate(wanted)})
            elif i <= max(l for l, _ in heads):
                x = layer(x, scratch_k, scratch_v, ck, cv, positions, causal)
            else:
                break  # later layers cannot change the weights asked for
        return torch.stack([found[h] for h in heads])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        if self.output_projection is not None:  # its layers take 2-D input
            return self.output_projection(rows).reshape(*hidden.shape[:-1], -1)
        return tall_projection(self.token_embedding.weight, rows).reshape(*hidden.shape[:-1], -1)


def tall_projection(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows [n, d] @ weight.T ([vocab, d]) as (weight @ rows.T).T: for the few rows of a decode
    step, CPU BLAS (MKL) runs the product with the vocabulary as its long side several times
    faster than with the rows as the short side, and a single column slower than two (so one
    row is given twice; a stride-0 view of it is slow again). bench/decoder_profile.py measures
    both forms. The sums are the same dot products; only their rounding order may differ, as it
    already does between batch sizes."""
    if rows.shape[0] == 1 and rows.device.type == "cpu":
        return (weight @ torch.cat([rows, rows]).T)[:, :1].T.contiguous()
    return (weight @ rows.T).T.contiguous()


class Whisper(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
        # The precision the engine caches cross-attention K/V in; None: the activations'.
        # engine/quantize.py's bf16 sets bfloat16 (its cross_kv layer's products are bfloat16).
        self.audio_cache_dtype: torch.dtype | None = None

    @property
    def activation_dtype(self) -> torch.dtype:
        """The precision of activations and caches: the model's, unless reduced-precision layers
        (engine/quantize.py) keep their weights in another."""
        return self.decoder.positions.dtype
