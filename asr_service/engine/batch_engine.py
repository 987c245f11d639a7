"""The embedded engine: many sequences, one model, one thread.

Continuous batching on torch: new sequences are admitted between steps (up to
``max_encode_batch`` encoder windows at a time, their cross-attention K/V computed once into an
audio slot of the SlotCache, which the beams of one search share), and every step advances all
active sequences by one token through the logits pipeline (probe, grammar mask, Whisper rules,
token choice).

Callers live on an asyncio loop; the model runs on a worker thread (torch releases the GIL
inside kernels) and hands events back through each sequence's SequenceStream.

Device: the engine runs where the model's weights are (CPU, or CUDA in float16: see
runtime.build_runtime). Caches and step inputs are made there; logits are taken to float32 for
the grammar mask, the rules and sampling, so every path behaves alike on both devices.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import math
import threading
import time

import numpy as np
import torch

from ..heap import return_freed_memory
from ..pcm import SAMPLE_RATE
from .beam_search import BeamGroup
from .encoder_cache import EncoderCache
from .features import CHUNK_SECONDS, N_FRAMES, log_mel_spectrogram
from .interface import EngineFigures
from .logits import GrammarMask, apply_penalties, apply_whisper_rules, choose_tokens
from .model import SharedAudio, Whisper
from .params import DecodeParams, Priority, StepEvent, UnsupportedDecode
from .phase_clock import PhaseClock
from .sequence import DecodingSequence
from .slot_cache import SlotCache
from .stream import SequenceStream

log = logging.getLogger(__name__)

SELF_ATTENTION_BLOCK = 64  # positions (see _forward)
# An audio-sized encoding (DecodeParams.audio_sized_encoder) reads this much silence after the
# audio too, so the speech's last frames see the silence that follows them in a whole window.
AUDIO_SIZED_MARGIN_S = 1.0
# Slots only live work (params.Priority) may take beyond max_batch_size and max_audio_windows, so
# a realtime decode starts at the next step however full the engine is: two windows, each with
# a final decode's five beams.
LIVE_RESERVE_WINDOWS = 2
LIVE_RESERVE_ROWS = 10


class BatchEngine:
    name = "embedded"
    warm_copies = 1
    beam_search = True
    audio_sized_encoder = True

    # One encoder window per admission by default: on the CPU the encoder is compute-bound, so
    # stacking windows gains nothing and multiplies activation memory.
    # max_audio_windows bounds the windows decoded at once (each holds its cross-attention K/V,
    # 37 MB for Whisper base in float32, half in bf16: the largest part of the engine's memory); a sequence that
    # needs a new one waits for a window to end. The encoder, one window at a time, is what bounds
    # throughput on the CPU, so a handful of windows in flight keep the decode steps batched.
    # encoder_dtype=torch.bfloat16 runs the encoder's matrix products in bfloat16 (autocast);
    # the decoder runs its layers as they are (engine/quantize.py may have made them bfloat16).
    def __init__(self, model: Whisper, max_batch_size: int = 16, max_encode_batch: int = 1, threads: int | None = None,
                 encoder_dtype: torch.dtype | None = None, max_audio_windows: int | None = None):
        self.model = model
        self.device, self.dtype = model.decoder.positions.device, model.activation_dtype
        self.encoder_dtype = encoder_dtype
        self.dims = model.dims
        self.max_batch_size = max_batch_size
        self.max_encode_batch = max_encode_batch
        self.max_audio_windows = min(max_audio_windows or max_batch_size, max_batch_size)
        # The windows it decodes at once, and two more that wait (engine.interface.Engine).
        self.max_request_windows = self.max_audio_windows + 2
        # Set here for the threads that start after the engine, and again on the engine's own
        # thread as it starts (_run): see there.
        self.threads = threads or torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self._running_threads: int | None = None  # the engine thread's count, read at each admission
        # Waiting sequences, a heap by (Priority.rank, submission): live work first, then the oldest.
        self._pending: list[tuple[tuple[int, float], int, Priority, DecodingSequence]] = []
        self._submissions = itertools.count()
        self._active: list[DecodingSequence] = []  # row i of the caches is _active[i]
        self._audio_readers: list[int] = []  # audio slot i of the caches is read by this many rows
        self._wake = threading.Condition()
        self._stopping = False
        self._slots = SlotCache(self.dims, max_batch_size + LIVE_RESERVE_ROWS, self.max_audio_windows + LIVE_RESERVE_WINDOWS,
                                self.device, self.dtype, model.audio_cache_dtype or self.dtype)
        self._encoder = EncoderCache(self._encode_windows)
        self._silent_window: torch.Tensor | None = None  # encoder output of a silent window, once needed
        self._grammar_mask = GrammarMask(max_batch_size + LIVE_RESERVE_ROWS, self.dims.n_vocab)
        self.steps = 0  # decode steps run
        self.tokens_total = 0  # tokens decoded (one per active sequence per step)
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # steps run at each batch size
        self.submitted_total = 0
        self.cancelled_total = 0  # sequences ended by cancel() before they finished
        self.clock = PhaseClock()
        self._thread = threading.Thread(target=self._run, name="asr-engine", daemon=True)
        self._thread.start()

    # ---- the Engine interface (from the event loop) ----
    def refusal(self, params: DecodeParams) -> UnsupportedDecode | None:
        if len(params.prompt_ids) >= self.dims.n_text_ctx:
            return UnsupportedDecode(f"a prompt of {len(params.prompt_ids)} tokens exceeds the model's "
                                     f"{self.dims.n_text_ctx}-token context", "prompt")
        if params.beam_size > self.max_batch_size:
            return UnsupportedDecode(f"{params.beam_size} beams exceed the engine's {self.max_batch_size} slots", "n")
        return None

    def submit(self, audio: np.ndarray, params: DecodeParams, priority: Priority | None = None) -> SequenceStream:
        problem = self.refusal(params)
        if problem is not None:
            raise problem
        stream = SequenceStream(asyncio.get_running_loop())
        self.submitted_total += 1
        with self._wake:
            priority = priority or Priority(time.monotonic())
            entry = (priority.rank, next(self._submissions), priority, DecodingSequence(params, audio, stream))
            heapq.heappush(self._pending, entry)
            self._wake.notify()
        return stream

    def figures(self) -> EngineFigures:
        return EngineFigures(active_sequences=len(self._active), queued_sequences=len(self._pending),
                             submitted_sequences=self.submitted_total, cancelled_sequences=self.cancelled_total,
                             tokens=self.tokens_total, steps=self.steps, batch_sizes=dict(self.batch_sizes),
                             phase_seconds=self.clock.seconds(), threads=self._running_threads)

    @property
    def encoder_windows(self) -> int:
        """Encoder passes run (windows the encoder cache did not hold)."""
        return self._encoder.encoded_total

    @property
    def audio_window_capacity(self) -> int:
        """Audio windows the caches have room for now (they grow with the load, never past
        max_audio_windows but for live work's reserve)."""
        return self._slots.audios

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # ---- the engine thread ----
    def _run(self) -> None:
        # torch keeps a thread count per OS thread, which a thread takes from the process-wide
        # count the first time it asks for it (its first parallel kernel, or get_num_threads),
        # overwriting what set_num_threads set on it before; and set_num_threads on any thread
        # changes the process-wide count. The speech gate scans with one thread on its own
        # (speech_gate.py), so an engine whose first kernel ran during a scan (a long file as
        # the first request) would keep one thread for good. So: first torch's own
        # initialisation, then the engine's count, on the engine's thread.
        torch.get_num_threads()
        torch.set_num_threads(self.threads)
        while True:  # the loop's supervisor: a failure outside a step restarts the loop, logged
            try:
                self._serve()
                break
            except Exception as e:
                log.exception("engine loop failed; restarting it")
                self._fail_active(e)
        for seq in [seq for *_, seq in self._pending] + self._active:
            self._finish(seq, "cancelled")

    def _serve(self) -> None:
        """Admit and step until the engine stops. An exception in a step fails the sequences of
        that step with its reason (their requests get it at once) and the engine goes on with
        the rest: the ones still waiting, and every later one."""
        while (admitted := self._next_admissions()) is not None:
            try:
                with torch.inference_mode():
                    if admitted:
                        self._admit(admitted)
                    self._drop_cancelled()
                    if self._active:
                        self._step()
            except Exception as e:  # never leave a caller waiting on a dead loop
                log.exception("engine step failed")
                self._fail_active(e, admitted)

    def _fail_active(self, error: Exception, admitted: list[DecodingSequence] = ()) -> None:
        """End every sequence in the engine's slots (and ``admitted``, on their way in) with
        ``error``; the slots are empty by the time their callers hear it."""
        failed = [*admitted, *self._active]
        self._active.clear()
        self._audio_readers.clear()
        for seq in failed:
            if not seq.stream.result.finish_reason:
                self._finish(seq, "error", f"the engine's step failed: {type(error).__name__}: {error}")

    def _next_admissions(self) -> list[DecodingSequence] | None:
        """Wait for work; take what fits in the free slots (None: the engine is stopping)."""
        with self._wake:
            while not self._stopping and not self._pending and not self._active:
                self._wake.wait()
            if self._stopping:
                return None
            admitted: list[DecodingSequence] = []
            windows = 0
            while self._pending and windows < self.max_encode_batch:
                _, _, priority, head = self._pending[0]
                reserve_windows, reserve_rows = (LIVE_RESERVE_WINDOWS, LIVE_RESERVE_ROWS) if priority.live else (0, 0)
                if (len(self._audio_readers) + windows >= self.max_audio_windows + reserve_windows
                        or len(self._active) + len(admitted) + head.slots_needed > self.max_batch_size + reserve_rows):
                    break
                seq = heapq.heappop(self._pending)[3]
                if seq.stream.cancelled.is_set():
                    self._finish(seq, "cancelled")
                else:
                    admitted += seq.with_beams()
                    windows += 1
            return admitted

    def _encode_windows(self, windows: list[tuple[np.ndarray, bool]]) -> torch.Tensor:
        """Encoder output per (audio, sized) window. Whole windows are encoded together; a sized
        one (DecodeParams.audio_sized_encoder) alone, over its own seconds only."""
        with self.clock.timing("encoder"):
            outputs: list[torch.Tensor | None] = [None] * len(windows)
            whole = [i for i, (_, sized) in enumerate(windows) if not sized]
            if whole:
                for i, output in zip(whole, self._encode([windows[i][0] for i in whole])):
                    outputs[i] = output
            for i, (audio, sized) in enumerate(windows):
                if sized:
                    outputs[i] = self._encode_audio_sized(audio)
            return torch.stack(outputs)

    def _encode(self, audios: list[np.ndarray], frames: int = N_FRAMES) -> torch.Tensor:
        mel = torch.stack([log_mel_spectrogram(a, self.dims.n_mels)[:, :frames] for a in audios])
        with torch.autocast(self.device.type, dtype=self.encoder_dtype or torch.bfloat16,
                            enabled=self.encoder_dtype is not None):
            return self.model.encoder(mel.to(self.device, self.dtype)).to(self.dtype)

    def _encode_audio_sized(self, audio: np.ndarray) -> torch.Tensor:
        """The encoder over the audio's whole seconds plus AUDIO_SIZED_MARGIN_S; the window's
        later positions are a silent window's output, so the decoder sees the window it knows
        (speech, then silence to 30 s) at a fraction of the encoder's work."""
        if self._silent_window is None:
            self._silent_window = self._encode([np.zeros(0, dtype=np.float32)])[0]
        seconds = min(CHUNK_SECONDS, math.ceil(audio.shape[0] / SAMPLE_RATE + AUDIO_SIZED_MARGIN_S))
        head = self._encode([audio], seconds * N_FRAMES // CHUNK_SECONDS)[0]
        return torch.cat([head, self._silent_window[head.shape[0]:]])

    def _admit(self, seqs: list[DecodingSequence]) -> None:
        self._running_threads = torch.get_num_threads()
        first = len(self._active)
        self._slots.ensure(first + len(seqs), max(len(s.tokens) for s in seqs), in_use=first)
        self._slots.clear_rows(first, len(seqs))
        first_audio = len(self._audio_readers)
        audio_of: dict[int, int] = {}  # id of a search (its beam group, or the sequence) -> its audio slot
        readers: list[DecodingSequence] = []  # one sequence per new audio slot
        for seq in seqs:
            search = id(seq.group if seq.group is not None else seq)
            if search not in audio_of:
                audio_of[search] = first_audio + len(readers)
                readers.append(seq)
                self._audio_readers.append(0)
            seq.audio_slot = audio_of[search]
            self._audio_readers[seq.audio_slot] += 1
        self._slots.ensure_audios(len(self._audio_readers), in_use=first_audio)
        audio_features = self._encoder.features([(s.audio, s.params.audio_sized_encoder) for s in readers])
        self._slots.write_cross(first_audio,
                                [layer.cross_kv_for(audio_features) for layer in self.model.decoder.layers])
        with self.clock.timing("prefill"):
            for i, seq in enumerate(seqs):
                self._active.append(seq)
                self._prefill(first + i, seq)

    def _prefill(self, slot: int, seq: DecodingSequence) -> None:
        """Write the KV cache of all prompt tokens but the last (which the next step feeds)."""
        n = len(seq.tokens) - 1
        if n == 0:
            return
        tokens = torch.tensor([seq.tokens[:n]], device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        caches, cross = self._slots.row_views(slot, n, seq.audio_slot)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]
        hidden = self.model.decoder(tokens, positions, caches, cross, causal)
        p = seq.params
        if p.probe_ids and p.probe_index < n:
            _record_probe(seq, self.model.decoder.logits(hidden[0, p.probe_index]).float())

    def _drop_cancelled(self) -> None:
        for i in reversed(range(len(self._active))):
            if self._active[i].stream.cancelled.is_set():
                self._release(i, "cancelled")

    def _forward(self, seqs: list[DecodingSequence]) -> torch.Tensor:
        """One decoder step over every active sequence: float32 logits [n, vocab]."""
        n = len(seqs)
        positions = torch.tensor([[len(s.tokens) - 1] for s in seqs], device=self.device)
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.device)
        # The self-attention span, rounded up to whole blocks: BLAS sums the attention weights
        # times the values in another order for a span of another length, except between whole
        # blocks, so a sequence's result would otherwise move with the longest one beside it.
        longest = max(len(s.tokens) for s in seqs)
        length = min(self.dims.n_text_ctx, -(-longest // SELF_ATTENTION_BLOCK) * SELF_ATTENTION_BLOCK)
        self._slots.ensure(n, length, in_use=n)
        caches, cross = self._slots.batch_views(n, length, len(self._audio_readers))
        mask = (torch.arange(length, device=self.device)[None, :] <= positions)[:, None, None, :]
        with self.clock.timing("decoder_layers"):
            hidden = self.model.decoder(tokens, positions, caches, cross, mask, self._shared_audio(seqs))
        with self.clock.timing("vocabulary_projection"):
            return self.model.decoder.logits(hidden[:, 0]).float()

    def _shared_audio(self, seqs: list[DecodingSequence]) -> SharedAudio | None:
        """How the rows map onto audio slots; None when row i reads audio i (no beams)."""
        audio = [s.audio_slot for s in seqs]
        if len(self._audio_readers) == len(seqs) and audio == list(range(len(seqs))):
            return None
        return SharedAudio.from_slots(audio, self.device)

    def _step(self) -> None:
        seqs = self._active
        logits = self._forward(seqs)
        self.steps += 1
        self.tokens_total += len(seqs)
        self.batch_sizes[len(seqs)] += 1
        with self.clock.timing("logits_pipeline"):
            for i, s in enumerate(seqs):  # the probe reads the raw distribution, before any mask
                if s.params.probe_ids and s.n_generated == 0 and s.params.probe_index == len(s.params.prompt_ids) - 1:
                    _record_probe(s, logits[i])
            apply_penalties(seqs, logits)
            self._grammar_mask(seqs, logits)
            apply_whisper_rules(seqs, logits)
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen = choose_tokens(seqs, logits)
        finished: list[tuple[int, str]] = []
        groups: dict[int, BeamGroup] = {}
        for i, s in enumerate(seqs):
            if s.group is not None:  # beams advance together, below
                groups[id(s.group)] = s.group
            else:
                reason = self._advance(s, chosen[i], float(logprobs[i, chosen[i]]))
                if reason:
                    finished.append((i, reason))
        with self.clock.timing("beam_search"):
            for group in groups.values():
                finished += self._advance_beams(group, logprobs)
        for i, reason in sorted(finished, reverse=True):
            self._release(i, reason)

    def _advance(self, seq: DecodingSequence, token: int, logprob: float) -> str | None:
        """Append the chosen token to a (non-beam) sequence; the finish reason when it ends."""
        if logprob == float("-inf"):  # every token was masked: the constraint has no way on
            return "grammar"
        seq.append(token)
        seq.stream.result.token_ids.append(token)
        seq.stream.result.logprobs.append(logprob)
        if seq.matcher is not None and not seq.matcher.accept_token(token):
            return "grammar"
        seq.stream.emit(StepEvent(token, logprob))
        if token == seq.params.eot_id:
            return "stop"
        return "length" if seq.at_limit(self.dims.n_text_ctx) else None

    def _advance_beams(self, group: BeamGroup, logprobs: torch.Tensor) -> list[tuple[int, str]]:
        """One beam-search step for ``group``: its slots take the best continuations; returns
        the slots to release."""
        slots = [i for i, s in enumerate(self._active) if s.group is group]
        beams = [self._active[i] for i in slots]
        in_prefix = beams[0].text_tokens() is None
        # The beams of a group usually sit in consecutive rows: then a view, not a copy of their rows.
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        rows = logprobs[slots[0] : slots[0] + len(slots)] if consecutive else logprobs[slots]
        chosen = _in_parent_slots(group.select([b.as_hypothesis() for b in beams], rows.cpu(), in_prefix))
        if chosen:
            self._slots.copy_self_rows(slots[: len(chosen)], [slots[p] for p, _, _ in chosen],
                                       max(len(b.tokens) for b in beams))
            _take_parents(beams, chosen)
        live = beams[: len(chosen)]
        release = [(i, "pruned") for i in slots[len(chosen) :]]
        if not group.done(len(live), any(b.at_limit(self.dims.n_text_ctx) for b in live)):
            return release
        best = group.best([b.as_hypothesis() for b in live])
        if best is None:  # every continuation was masked: end this group only, like a greedy dead end
            group.finish_reason = "grammar"
            return [(i, "grammar") for i in slots]
        head = live[0] if live else beams[0]
        result = head.stream.result
        result.token_ids, result.logprobs = list(best.tokens), list(best.logprobs)
        if head.params.alignment_heads:
            self._record_cross_attention(head, list(head.params.prompt_ids) + best.tokens)
        for token, lp in zip(best.tokens, best.logprobs):
            head.stream.emit(StepEvent(token, lp))
        group.finish_reason = "stop" if best.tokens and best.tokens[-1] == group.eot_id else "length"
        return [(i, group.finish_reason) for i in slots]

    def _release(self, index: int, reason: str) -> None:
        """Finish the sequence in ``index`` and move the last active sequence into its slot."""
        seq = self._active[index]
        if seq.params.alignment_heads and reason in ("stop", "length") and seq.group is None:
            self._record_cross_attention(seq, seq.tokens)
        last = len(self._active) - 1
        if index != last:
            self._slots.move_row(last, index, len(self._active[last].tokens))
            self._active[index] = self._active[last]
        self._active.pop()
        self._stop_reading(seq.audio_slot)
        if seq.group is not None:
            seq.group.live -= 1
            if seq.group.live > 0:
                return  # the other beams of its group still decode
            reason = seq.group.finish_reason or reason
        self._finish(seq, reason)

    def _stop_reading(self, audio: int) -> None:
        """A row no longer reads audio slot ``audio``; the slot is freed (the last audio slot moves
        into it) when no row does."""
        self._audio_readers[audio] -= 1
        if self._audio_readers[audio]:
            return
        last = len(self._audio_readers) - 1
        if audio != last:
            self._slots.move_audio(last, audio)
            self._audio_readers[audio] = self._audio_readers[last]
            for seq in self._active:
                if seq.audio_slot == last:
                    seq.audio_slot = audio
        self._audio_readers.pop()
        # A window's end is a natural point to hand the heap's free pages back: the steps since the
        # last one freed their logits and activations in between live blocks, pages glibc keeps
        # resident until asked. A few milliseconds a window (docs/performance.md, "Memory").
        return_freed_memory()

    def _record_cross_attention(self, seq: DecodingSequence, all_tokens: list[int]) -> None:
        """While the sequence's audio slot still holds the audio's K/V: the alignment heads'
        attention for every generated token of ``all_tokens`` (prompt + generated), from one
        teacher-forced pass (word timing needs it, decoding does not)."""
        with self.clock.timing("word_alignment"):
            tokens = torch.tensor([all_tokens[:-1]], device=self.device)  # inputs: each position predicts the next token
            cross = self._slots.audio_views(seq.audio_slot)
            weights = self.model.decoder.cross_attention(tokens, cross, list(seq.params.alignment_heads))
            first = len(seq.params.prompt_ids) - 1
            seq.stream.result.cross_attention = weights[:, first:].float().cpu().numpy()

    def _finish(self, seq: DecodingSequence, reason: str, error: str | None = None) -> None:
        if reason == "cancelled":
            self.cancelled_total += 1
        seq.stream.finish(reason, error)


def _record_probe(seq: DecodingSequence, logits: torch.Tensor) -> None:
    """The raw next-token probabilities of the params' probe ids (language, no-speech)."""
    probs = torch.softmax(logits, dim=-1)
    seq.stream.result.probe_probs = {t: float(probs[t]) for t in seq.params.probe_ids}


def _in_parent_slots(chosen: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The continuations ordered so that as many as can stay in their parent's slot (beam i
    continues beam i), whose K/V then needs no copy; the beams of a group share their stream,
    so their order means nothing else."""
    placed: list[tuple[int, int, float] | None] = [None] * len(chosen)
    moved = []
    for continuation in chosen:
        parent = continuation[0]
        if parent < len(placed) and placed[parent] is None:
            placed[parent] = continuation
        else:
            moved.append(continuation)
    free = [i for i, c in enumerate(placed) if c is None]
    for continuation, i in zip(moved, free):
        placed[i] = continuation
    return placed


def _take_parents(beams: list[DecodingSequence], chosen: list[tuple[int, int, float]]) -> None:
    """Beam i continues chosen[i]'s parent with its token: tokens, grammar state and logprobs
    copied from the parent (a parent chosen twice has its matcher forked)."""
    states, claimed = [], set()
    for p, token, lp in chosen:
        parent = beams[p]
        matcher = parent.matcher if p not in claimed or parent.matcher is None else parent.matcher.fork()
        claimed.add(p)
        states.append((list(parent.tokens), parent.text_start, matcher, parent.beam_logprobs + [lp], token))
    for beam, (tokens, text_start, matcher, beam_logprobs, token) in zip(beams, states):
        beam.tokens, beam.text_start, beam.matcher, beam.beam_logprobs = tokens, text_start, matcher, beam_logprobs
        beam.append(token)
        if beam.matcher is not None:
            beam.matcher.accept_token(token)
