"""Encoder outputs of the last few audio windows, so a retry of the same window (temperature
fallback, an outlier re-decode, a detection pass) skips the encoder, the costliest part of a
decode. Keyed by the audio array itself, held by a weak reference: the cache never keeps a
request's audio alive, and a dead reference tells a reused id from the array it was cached for.
"""

from __future__ import annotations

import collections
import weakref
from typing import Callable

import numpy as np
import torch

# 1500 x 512 floats (3 MB) each for Whisper base.
ENCODER_CACHE_WINDOWS = 8


class EncoderCache:
    """Keyed by (audio, sized): a window encoded audio-sized (DecodeParams.audio_sized_encoder)
    is not the whole window's encoding, so the two never stand in for each other."""

    def __init__(self, encode: Callable[[list[tuple[np.ndarray, bool]]], torch.Tensor],
                 windows: int = ENCODER_CACHE_WINDOWS):
        self._encode = encode  # (audio window, sized) pairs -> encoder outputs, one per window
        self._windows = windows
        self._entries: collections.OrderedDict[tuple[int, bool], tuple[weakref.ref, torch.Tensor]] = \
            collections.OrderedDict()
        self.encoded_total = 0  # encoder passes run (windows not found here)

    def features(self, windows: list[tuple[np.ndarray, bool]]) -> torch.Tensor:
        """Encoder output for each (audio, sized) window (stacked), encoding only those not kept."""
        found = {(id(a), sized): self._get(a, sized) for a, sized in windows}
        todo = list({(id(a), sized): (a, sized) for a, sized in windows if found[(id(a), sized)] is None}.values())
        if todo:
            for (audio, sized), output in zip(todo, self._encode(todo)):
                found[(id(audio), sized)] = output
                self._entries[(id(audio), sized)] = (weakref.ref(audio), output)
                while len(self._entries) > self._windows:
                    self._entries.popitem(last=False)
            self.encoded_total += len(todo)
        return torch.stack([found[(id(a), sized)] for a, sized in windows])

    def _get(self, audio: np.ndarray, sized: bool) -> torch.Tensor | None:
        entry = self._entries.get((id(audio), sized))
        if entry is None or entry[0]() is not audio:
            return None
        self._entries.move_to_end((id(audio), sized))
        return entry[1]
