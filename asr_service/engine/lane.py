"""A lane of the embedded engine: one kind of work, its queue, and the rows it decodes in.

The engine has two lanes: live work (a realtime session: a person waits for its words as they
speak) and bulk work (file requests). Each lane has caches of its own, so the engine can step
one lane without the other: a live decode's few rows step alone in milliseconds instead of
inside a full batch of file windows, whose step costs many times more. Which lane steps when
is the engine's choice (batch_engine.BatchEngine._next_turn); a lane only keeps its rows.

Active rows occupy 0..n-1 of the lane's caches and its audio windows 0..a-1: a finished
one's place is filled by the last, so each step works on plain views.
"""

from __future__ import annotations

import heapq

import torch

from ..heap import return_freed_memory
from .logits import GrammarMask
from .model import SharedAudio, WhisperDims
from .sequence import DecodingSequence
from .slot_cache import SlotCache


class Lane:
    def __init__(self, dims: WhisperDims, max_rows: int, max_audios: int, device: torch.device,
                 dtype: torch.dtype, audio_dtype: torch.dtype):
        self.max_rows, self.max_audios = max_rows, max_audios
        self.slots = SlotCache(dims, max_rows, max_audios, device, dtype, audio_dtype)
        self.grammar_mask = GrammarMask(max_rows, dims.n_vocab)
        # Waiting sequences, a heap by (planned_at, submission): the oldest work first, so a
        # window's continuations and retries go ahead of windows planned after it.
        self.pending: list[tuple[float, int, DecodingSequence]] = []
        self.active: list[DecodingSequence] = []  # row i of the caches is active[i]
        self.audio_readers: list[int] = []  # audio slot i of the caches is read by this many rows

    @property
    def busy(self) -> bool:
        return bool(self.active or self.pending)

    def push(self, planned_at: float, order: int, seq: DecodingSequence) -> None:
        heapq.heappush(self.pending, (planned_at, order, seq))

    def head(self) -> DecodingSequence | None:
        return self.pending[0][2] if self.pending else None

    def pop(self) -> DecodingSequence:
        return heapq.heappop(self.pending)[2]

    def has_room(self, seq: DecodingSequence, rows_taken: int, windows_taken: int) -> bool:
        """Whether ``seq`` fits beside the active rows and ``rows_taken`` rows and
        ``windows_taken`` audio windows admitted with it."""
        return (len(self.audio_readers) + windows_taken < self.max_audios
                and len(self.active) + rows_taken + seq.slots_needed <= self.max_rows)

    def place(self, seqs: list[DecodingSequence]) -> tuple[int, list[DecodingSequence]]:
        """Room in the caches for new sequences (a search's beams share one audio slot). Returns
        the first new audio slot and one sequence per new audio slot: the caller writes those
        windows' cross-attention K/V there, then appends each sequence to ``active`` as its
        row's prompt is written."""
        first = len(self.active)
        self.slots.ensure(first + len(seqs), max(len(s.tokens) + len(s.params.draft_ids) for s in seqs), in_use=first)
        self.slots.clear_rows(first, len(seqs))
        first_audio = len(self.audio_readers)
        audio_of: dict[int, int] = {}  # id of a search (its beam group, or the sequence) -> its audio slot
        readers: list[DecodingSequence] = []
        for seq in seqs:
            search = id(seq.group if seq.group is not None else seq)
            if search not in audio_of:
                audio_of[search] = first_audio + len(readers)
                readers.append(seq)
                self.audio_readers.append(0)
            seq.audio_slot = audio_of[search]
            self.audio_readers[seq.audio_slot] += 1
        self.slots.ensure_audios(len(self.audio_readers), in_use=first_audio)
        return first_audio, readers

    def shared_audio(self, device: torch.device) -> SharedAudio | None:
        """How the active rows map onto audio slots; None when row i reads audio i (no beams)."""
        audio = [s.audio_slot for s in self.active]
        if len(self.audio_readers) == len(audio) and audio == list(range(len(audio))):
            return None
        return SharedAudio.from_slots(audio, device)

    def remove(self, index: int) -> DecodingSequence:
        """Take the sequence in row ``index`` out; the last active row moves into its place."""
        seq = self.active[index]
        last = len(self.active) - 1
        if index != last:
            self.slots.move_row(last, index, len(self.active[last].tokens))
            self.active[index] = self.active[last]
        self.active.pop()
        self._stop_reading(seq.audio_slot)
        return seq

    def _stop_reading(self, audio: int) -> None:
        """A row no longer reads audio slot ``audio``; the slot is freed (the last audio slot moves
        into it) when no row does."""
        self.audio_readers[audio] -= 1
        if self.audio_readers[audio]:
            return
        last = len(self.audio_readers) - 1
        if audio != last:
            self.slots.move_audio(last, audio)
            self.audio_readers[audio] = self.audio_readers[last]
            for seq in self.active:
                if seq.audio_slot == last:
                    seq.audio_slot = audio
        self.audio_readers.pop()
        # A window's end is a natural point to hand the heap's free pages back: the steps since the
        # last one freed their logits and activations in between live blocks, pages glibc keeps
        # resident until asked. A few milliseconds a window (docs/performance.md, "Memory").
        return_freed_memory()

    def clear(self) -> list[DecodingSequence]:
        """Empty the rows (after a failed step); returns the sequences that held them."""
        held = list(self.active)
        self.active.clear()
        self.audio_readers.clear()
        return held
