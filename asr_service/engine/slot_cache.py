"""The decoder's caches: self-attention K/V per row, cross-attention K/V per audio window.

A row is one sequence being decoded (one beam of a beam search); an audio slot holds the
cross-attention K/V of one encoded window. Beams of one search share their window's audio slot:
cross-attention reads that K/V once for all of them (it is the largest thing a step reads), and
the admission computes it once.

Tensors grow with the load (powers of two, up to the limits), so memory follows the batch sizes
and sequence lengths actually seen. Active rows always occupy 0..n-1 and active audios
0..a-1: a finished one's place is filled by the last, so each step works on plain views.
"""

from __future__ import annotations

import logging

import torch

from .model import WhisperDims

log = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]


class SlotCache:
    def __init__(self, dims: WhisperDims, max_rows: int, max_audios: int, device: torch.device, dtype: torch.dtype,
                 audio_dtype: torch.dtype):
        """``dtype``: the self-attention caches'; ``audio_dtype``: the cross-attention caches'."""
        self.dims = dims
        self.max_rows = max_rows
        self.max_audios = max_audios
        self.device, self.dtype, self.audio_dtype = device, dtype, audio_dtype
        self.self_kv: list[KV] = []  # per decoder layer: [rows, heads, positions, head dim]
        self.cross_kv: list[KV] = []  # per decoder layer: [audios, heads, audio frames, head dim]

    @property
    def rows(self) -> int:
        return self.self_kv[0][0].shape[0] if self.self_kv else 0

    @property
    def positions(self) -> int:
        return self.self_kv[0][0].shape[2] if self.self_kv else 0

    @property
    def audios(self) -> int:
        return self.cross_kv[0][0].shape[0] if self.cross_kv else 0

    def ensure(self, rows: int, length: int, in_use: int) -> None:
        """Room for ``rows`` rows of ``length`` positions, keeping the first ``in_use`` rows'
        contents."""
        have_rows, have_length = self.rows, self.positions
        if rows <= have_rows and length <= have_length:
            return
        d = self.dims
        capacity = max(have_rows, min(self.max_rows, _next_power_of_two(rows)))
        self_length = max(have_length, min(d.n_text_ctx, _next_power_of_two(max(length, 64))))
        self._grow(self.self_kv, capacity, self_length, in_use, self.dtype)
        log.info("self-attention caches grown to %d rows x %d positions", capacity, self_length)

    def ensure_audios(self, audios: int, in_use: int) -> None:
        """Room for ``audios`` audio windows, keeping the first ``in_use``."""
        if audios <= self.audios:
            return
        capacity = max(self.audios, min(self.max_audios, _next_power_of_two(audios)))
        self._grow(self.cross_kv, capacity, self.dims.n_audio_ctx, in_use, self.audio_dtype)
        log.info("cross-attention caches grown to %d audio windows", capacity)

    def _grow(self, layers: list[KV], capacity: int, positions: int, in_use: int, dtype: torch.dtype) -> None:
        """Reallocate ``layers`` (in place) to [capacity, heads, positions, head dim], one layer at
        a time, so a growth never holds two full copies of the caches."""
        d = self.dims
        head_dim = d.n_text_state // d.n_text_head

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = torch.zeros(capacity, d.n_text_head, positions, head_dim, device=self.device, dtype=dtype)
            if old is not None and in_use:
                keep = min(positions, old.shape[2])
                new[:in_use, :, :keep] = old[:in_use, :, :keep]
            return new

        if not layers:
            layers.extend([(None, None)] * d.n_text_layer)
        for i in range(d.n_text_layer):
            k, v = layers[i]
            layers[i] = None  # drop the list's reference first: the old layer is freed as soon as copied
            layers[i] = (grown(k), grown(v))
            del k, v

    def clear_rows(self, first: int, count: int) -> None:
        """Zero rows' self-attention K/V before new sequences take them. A step reads a span
        rounded up past a row's length with those keys masked: softmax weights them 0, but 0
        times a NaN left by an earlier occupant is NaN, which would poison the new sequence."""
        for k, v in self.self_kv:
            k[first : first + count].zero_()
            v[first : first + count].zero_()

    def batch_views(self, rows: int, length: int, audios: int) -> tuple[list[KV], list[KV]]:
        """(self K/V of rows 0..rows-1 over ``length`` positions, cross K/V of audios 0..audios-1)."""
        return ([(k[:rows, :, :length], v[:rows, :, :length]) for k, v in self.self_kv],
                [(k[:audios], v[:audios]) for k, v in self.cross_kv])

    def row_views(self, row: int, length: int, audio: int) -> tuple[list[KV], list[KV]]:
        """(self K/V of one row over ``length`` positions, cross K/V of its audio), batch
        dimension kept."""
        return ([(k[row : row + 1, :, :length], v[row : row + 1, :, :length]) for k, v in self.self_kv],
                self.audio_views(audio))

    def audio_views(self, audio: int) -> list[KV]:
        """The cross K/V of one audio slot, batch dimension kept."""
        return [(k[audio : audio + 1], v[audio : audio + 1]) for k, v in self.cross_kv]

    def write_cross(self, first: int, per_layer: list[KV]) -> None:
        """Store audio windows' cross-attention K/V (one entry per layer) from audio slot ``first`` on."""
        for (ck, cv), (k, v) in zip(self.cross_kv, per_layer):
            ck[first : first + k.shape[0]] = k
            cv[first : first + v.shape[0]] = v

    def move_row(self, source: int, target: int, length: int) -> None:
        """Row ``source`` (``length`` positions used) takes over row ``target``."""
        for k, v in self.self_kv:
            k[target, :, :length] = k[source, :, :length]
            v[target, :, :length] = v[source, :, :length]

    def move_audio(self, source: int, target: int) -> None:
        """Audio slot ``source`` takes over audio slot ``target``."""
        for k, v in self.cross_kv:
            k[target] = k[source]
            v[target] = v[source]

    def copy_self_rows(self, targets: list[int], parents: list[int], length: int) -> None:
        """Beam search: each target row's self-attention K/V (its first ``length`` positions,
        the ones in use) becomes its parent beam's. A beam that continues itself is not copied
        (most steps move few rows). The right side is gathered (copied) before writing, so a
        row may be both."""
        moves = [(t, p) for t, p in zip(targets, parents) if t != p]
        if not moves:
            return
        to, source = [t for t, _ in moves], [p for _, p in moves]
        for k, v in self.self_kv:
            k[to, :, :length] = k[source, :, :length]
            v[to, :, :length] = v[source, :, :length]


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()
