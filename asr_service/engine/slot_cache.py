"""The decoder's per-slot caches: self-attention K/V and the audio's cross-attention K/V.

One slot per active sequence (per beam). Tensors grow with the load (powers of two, up to the
limits), so memory follows the batch sizes and sequence lengths actually seen. Active
sequences always occupy slots 0..n-1: a finished sequence's slot is filled by the last one, so
each step works on plain views.
"""

from __future__ import annotations

import logging

import torch

from .model import WhisperDims

log = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]


class SlotCache:
    def __init__(self, dims: WhisperDims, max_slots: int, device: torch.device, dtype: torch.dtype):
        self.dims = dims
        self.max_slots = max_slots
        self.device, self.dtype = device, dtype
        self.self_kv: list[KV] = []  # per decoder layer: [slots, heads, positions, head dim]
        self.cross_kv: list[KV] = []  # per decoder layer: [slots, heads, audio frames, head dim]

    @property
    def slots(self) -> int:
        return self.self_kv[0][0].shape[0] if self.self_kv else 0

    @property
    def positions(self) -> int:
        return self.self_kv[0][0].shape[2] if self.self_kv else 0

    def ensure(self, slots: int, length: int, in_use: int) -> None:
        """Room for ``slots`` sequences of ``length`` positions, keeping the first ``in_use``
        slots' contents. Layers are replaced one at a time, so a growth never holds two full
        copies of the caches."""
        have_slots, have_length = self.slots, self.positions
        if slots <= have_slots and length <= have_length:
            return
        d = self.dims
        capacity = max(have_slots, min(self.max_slots, _next_power_of_two(slots)))
        self_length = max(have_length, min(d.n_text_ctx, _next_power_of_two(max(length, 64))))
        head_dim = d.n_text_state // d.n_text_head

        def grow(old: torch.Tensor | None, positions: int) -> torch.Tensor:
            new = torch.zeros(capacity, d.n_text_head, positions, head_dim, device=self.device, dtype=self.dtype)
            if old is not None and in_use:
                keep = min(positions, old.shape[2])
                new[:in_use, :, :keep] = old[:in_use, :, :keep]
            return new

        if not self.self_kv:
            self.self_kv = [(None, None)] * d.n_text_layer
            self.cross_kv = [(None, None)] * d.n_text_layer
        for i in range(d.n_text_layer):
            k, v = self.self_kv[i]
            self.self_kv[i] = None  # drop our reference first: the old layer is freed as soon as copied
            self.self_kv[i] = (grow(k, self_length), grow(v, self_length))
            if capacity != have_slots:
                k, v = self.cross_kv[i]
                self.cross_kv[i] = None
                self.cross_kv[i] = (grow(k, d.n_audio_ctx), grow(v, d.n_audio_ctx))
            del k, v
        log.info("decode caches grown to %d slots x %d positions", capacity, self_length)

    def batch_views(self, n: int, length: int) -> tuple[list[KV], list[KV]]:
        """(self K/V over ``length`` positions, cross K/V) of slots 0..n-1."""
        return ([(k[:n, :, :length], v[:n, :, :length]) for k, v in self.self_kv],
                [(k[:n], v[:n]) for k, v in self.cross_kv])

    def slot_views(self, slot: int, length: int) -> tuple[list[KV], list[KV]]:
        """(self K/V over ``length`` positions, cross K/V) of one slot, batch dimension kept."""
        return ([(k[slot : slot + 1, :, :length], v[slot : slot + 1, :, :length]) for k, v in self.self_kv],
                [(k[slot : slot + 1], v[slot : slot + 1]) for k, v in self.cross_kv])

    def write_cross(self, first: int, per_layer: list[KV]) -> None:
        """Store the audio's cross-attention K/V (one entry per layer) from slot ``first`` on."""
        for (ck, cv), (k, v) in zip(self.cross_kv, per_layer):
            ck[first : first + k.shape[0]] = k
            cv[first : first + v.shape[0]] = v

    def move(self, source: int, target: int, length: int) -> None:
        """Slot ``source`` (``length`` positions used) takes over slot ``target``."""
        for k, v in self.self_kv:
            k[target, :, :length] = k[source, :, :length]
            v[target, :, :length] = v[source, :, :length]
        for k, v in self.cross_kv:
            k[target] = k[source]
            v[target] = v[source]

    def copy_self_rows(self, targets: list[int], parents: list[int], length: int) -> None:
        """Beam search: each target slot's self-attention K/V (its first ``length`` positions,
        the ones in use) becomes its parent beam's. A beam that continues itself is not copied
        (most steps move few rows). The right side is gathered (copied) before writing, so a
        slot may be both."""
        moves = [(t, p) for t, p in zip(targets, parents) if t != p]
        if not moves:
            return
        to, source = [t for t, _ in moves], [p for _, p in moves]
        for k, v in self.self_kv:
            k[to, :, :length] = k[source, :, :length]
            v[to, :, :length] = v[source, :, :length]


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()
