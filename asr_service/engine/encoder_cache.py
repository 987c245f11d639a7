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
    def __init__(self, encode: Callable[[list[np.ndarray]], torch.Tensor], windows: int = ENCODER_CACHE_WINDOWS):
        self._encode = encode  # audio windows -> encoder outputs, one per window
        self._windows = windows
        self._entries: collections.OrderedDict[int, tuple[weakref.ref, torch.Tensor]] = collections.OrderedDict()
        self.encoded_total = 0  # encoder passes run (windows not found here)

    def features(self, audios: list[np.ndarray]) -> torch.Tensor:
        """Encoder output for each of ``audios`` (stacked), encoding only the windows not kept."""
        found = {id(a): self._get(a) for a in audios}
        todo = list({id(a): a for a in audios if found[id(a)] is None}.values())
        if todo:
            for audio, output in zip(todo, self._encode(todo)):
                found[id(audio)] = output
                self._entries[id(audio)] = (weakref.ref(audio), output)
                while len(self._entries) > self._windows:
                    self._entries.popitem(last=False)
            self.encoded_total += len(todo)
        return torch.stack([found[id(a)] for a in audios])

    def _get(self, audio: np.ndarray) -> torch.Tensor | None:
        entry = self._entries.get(id(audio))
        if entry is None or entry[0]() is not audio:
            return None
        self._entries.move_to_end(id(audio))
        return entry[1]
