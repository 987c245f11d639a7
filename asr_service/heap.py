"""How this process's C heap gives memory back: glibc's malloc, where torch's CPU tensors live.

glibc serves an allocation above its mmap threshold with a mapping of its own, unmapped on free;
below it, from heaps that only shrink from the top, so freed blocks between live ones stay in the
process. Its threshold is dynamic: each large block freed raises it (up to 32 MB), after which the
encoder's activations and the decoder's caches, all megabytes each, come from the heap, and the
holes they leave add up. Both calls are no-ops where glibc is not the C library.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
# Blocks of this size or more are mapped on their own. Every cache tensor and most encoder
# activations are larger; a decode step's logits (200 KB a row) are not, so the steps do not pay
# for fresh pages each time (a much lower threshold does: docs/performance.md, "Memory").
LARGE_BLOCK_BYTES = 8 << 20


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def map_large_blocks() -> None:
    """Fix the mmap threshold (which also stops glibc from raising it)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (malloc_trim). Loading converts every weight
    through temporary arrays, and glibc keeps ~120 MB of them (measured) unless asked; decoding
    leaves freed blocks between live ones too (the engine asks whenever a window ends)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
