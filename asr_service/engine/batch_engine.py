"""The embedded engine: many sequences, one model, one thread.

Continuous batching on torch: new sequences are admitted between steps (up to
``max_encode_batch`` encoder windows at a time, their cross-attention K/V computed once into an
audio slot of the SlotCache, which the beams of one search share), and every step advances all
active sequences of a lane by one token through the logits pipeline (probe, grammar mask,
Whisper rules, token choice).

Two lanes (engine/lane.py): live work (realtime) and bulk work (files), each with its own
caches and queue. The live lane steps whenever it has rows, on its own, so a preview's tokens
cost what a few rows cost rather than a full batch of file windows, and its rows step a while
between its admissions (LIVE_ADMISSION_GAP_S), so a decode that has started ends soon; the
bulk lane steps and admits whenever the live lane is idle, and at least every BULK_TURN_S
while it is not, so a busy realtime load slows file requests but never stalls them.

Callers live on an asyncio loop; the model runs on a worker thread (torch releases the GIL
inside kernels) and hands events back through each sequence's SequenceStream.

Device: the engine runs where the model's weights are (CPU, or CUDA in float16: see
runtime.build_runtime). Caches and step inputs are made there; logits are taken to float32 for
the grammar mask, the rules and sampling, so every path behaves alike on both devices.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time

import numpy as np
import torch

from adapters.decode_request import DecodeParams

from .beam_search import BeamGroup
from .beam_step import in_parent_slots, take_parents
from .encoder_cache import EncoderCache
from .interface import EngineFigures
from .lane import Lane
from .logits import apply_penalties, apply_whisper_rules, choose_tokens
from .model import Whisper
from .params import Priority, StepEvent, UnsupportedDecode
from .phase_clock import PhaseClock
from .sequence import DecodingSequence
from .stream import SequenceStream
from .window_encoder import WindowEncoder

log = logging.getLogger(__name__)

SELF_ATTENTION_BLOCK = 64  # positions (see _forward)
# The live lane's audio windows: one decode each for a handful of realtime sessions at once
# (each session has one decode in flight); its rows are max_batch_size, so any search fits.
LIVE_WINDOWS = 4
# While live work decodes, bulk work still gets a turn (an admission and a step) this often.
BULK_TURN_S = 1.0
# While live decodes step, the next live admission waits until they have stepped this long since
# the last one: an admission is an encoder pass (a tenth of a second to half a second), and
# realtime sessions whose short previews arrive one after another would otherwise leave a long
# decode (a session's first, unsure preview) one step per admission.
LIVE_ADMISSION_GAP_S = 0.2


class BatchEngine:
    name = "embedded"
    warm_copies = 1
    beam_search = True
    audio_sized_encoder = True
    carries_prompt_text = True  # the prompt is the decoder's own input

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
        self._submissions = itertools.count()
        audio_dtype = model.audio_cache_dtype or self.dtype
        self._live = Lane(self.dims, max_batch_size, LIVE_WINDOWS, self.device, self.dtype, audio_dtype)
        self._bulk = Lane(self.dims, max_batch_size, self.max_audio_windows, self.device, self.dtype,
                          audio_dtype)
        self._lanes = (self._live, self._bulk)
        self._bulk_turn_at = 0.0  # time.monotonic() of the bulk lane's last turn
        self._live_admitted_at = 0.0  # time.monotonic() of the live lane's last admission
        self._wake = threading.Condition()
        self._stopping = False
        self.clock = PhaseClock()
        self._encoder = EncoderCache(WindowEncoder(model, encoder_dtype, self.clock))
        self.steps = 0  # decode steps run
        self.tokens_total = 0  # tokens decoded (one per active sequence per step, and each taken from a draft)
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # steps run at each batch size
        self.submitted_total = 0
        self.cancelled_total = 0  # sequences ended by cancel() before they finished
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
            lane = self._live if priority.live else self._bulk
            lane.push(priority.planned_at, next(self._submissions), DecodingSequence(params, audio, stream))
            self._wake.notify()
        return stream

    def figures(self) -> EngineFigures:
        return EngineFigures(active_sequences=sum(len(lane.active) for lane in self._lanes),
                             queued_sequences=sum(len(lane.pending) for lane in self._lanes),
                             submitted_sequences=self.submitted_total, cancelled_sequences=self.cancelled_total,
                             tokens=self.tokens_total, steps=self.steps, batch_sizes=dict(self.batch_sizes),
                             phase_seconds=self.clock.seconds(), threads=self._running_threads)

    @property
    def encoder_windows(self) -> int:
        """Encoder passes run (windows the encoder cache did not hold)."""
        return self._encoder.encoded_total

    @property
    def audio_window_capacity(self) -> int:
        """Audio windows the bulk lane's caches have room for now (they grow with the load,
        never past max_audio_windows)."""
        return self._bulk.slots.audios

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
        for lane in self._lanes:
            for seq in [seq for *_, seq in lane.pending] + lane.active:
                self._finish(seq, "cancelled")

    def _serve(self) -> None:
        """Admit and step until the engine stops."""
        while self._serve_turn():
            pass

    def _serve_turn(self) -> bool:
        """Wait for a turn and take it: admit, drop what was cancelled, step (False: the engine is
        stopping). An exception in a step fails the sequences of that step with its reason
        (their requests get it at once) and the engine goes on with the rest: the ones still
        waiting, and every later one. A method of its own so that nothing of a turn (a
        sequence, its audio) stays referenced while the engine waits for the next one."""
        turn = self._next_turn()
        if turn is None:
            return False
        lanes, admitted = turn
        try:
            with torch.inference_mode():
                for lane, seqs in admitted:
                    self._admit(lane, seqs)
                self._drop_cancelled()
                for lane in lanes:
                    if lane.active:
                        self._step(lane)
        except Exception as e:  # never leave a caller waiting on a dead loop
            log.exception("engine step failed")
            self._fail_active(e, [seq for _, seqs in admitted for seq in seqs])
        return True

    def _fail_active(self, error: Exception, admitted: list[DecodingSequence] = ()) -> None:
        """End every sequence in the engine's slots (and ``admitted``, on their way in) with
        ``error``; the slots are empty by the time their callers hear it."""
        failed = [*admitted, *(seq for lane in self._lanes for seq in lane.clear())]
        for seq in failed:
            if not seq.stream.result.finish_reason:
                self._finish(seq, "error", f"the engine's step failed: {type(error).__name__}: {error}")

    def _next_turn(self) -> tuple[list[Lane], list[tuple[Lane, list[DecodingSequence]]]] | None:
        """Wait for work; then the lanes that take this turn, and the sequences admitted into
        them: what fits in their free rows, up to max_encode_batch windows (None: the engine is
        stopping). The live lane takes every turn, and admits when it has no rows or
        LIVE_ADMISSION_GAP_S after its last admission; the bulk lane takes every turn the live
        lane is idle, and one every BULK_TURN_S while it is not, when it is admitted first (with
        one encoder window a turn, a live admission would otherwise take its place)."""
        with self._wake:
            while not self._stopping and not any(lane.busy for lane in self._lanes):
                self._wake.wait()
            if self._stopping:
                return None
            now = time.monotonic()
            lanes = [self._live]
            if not self._live.busy or now - self._bulk_turn_at >= BULK_TURN_S:
                lanes.insert(0, self._bulk)
                self._bulk_turn_at = now
            admitted: list[tuple[Lane, list[DecodingSequence]]] = []
            windows = 0
            for lane in lanes:
                if lane is self._live and lane.active and now - self._live_admitted_at < LIVE_ADMISSION_GAP_S:
                    continue
                seqs: list[DecodingSequence] = []
                lane_windows = 0
                while ((head := lane.head()) is not None and windows < self.max_encode_batch
                       and lane.has_room(head, len(seqs), lane_windows)):
                    seq = lane.pop()
                    if seq.stream.cancelled.is_set():
                        self._finish(seq, "cancelled")
                    else:
                        seqs += seq.with_beams()
                        windows += 1
                        lane_windows += 1
                if seqs:
                    admitted.append((lane, seqs))
                    if lane is self._live:
                        self._live_admitted_at = now
            return lanes, admitted

    def _admit(self, lane: Lane, seqs: list[DecodingSequence]) -> None:
        self._running_threads = torch.get_num_threads()
        first = len(lane.active)
        first_audio, readers = lane.place(seqs)
        audio_features = self._encoder.features([(s.audio, s.params.audio_sized_encoder) for s in readers])
        lane.slots.write_cross(first_audio,
                               [layer.cross_kv_for(audio_features) for layer in self.model.decoder.layers])
        finished: list[tuple[int, str]] = []
        with self.clock.timing("prefill"):
            for i, seq in enumerate(seqs):
                lane.active.append(seq)
                reason = self._prefill(lane, first + i, seq)
                if reason:
                    finished.append((first + i, reason))
        for i, reason in reversed(finished):
            self._release(lane, i, reason)

    def _prefill(self, lane: Lane, slot: int, seq: DecodingSequence) -> str | None:
        """Write the KV cache of all prompt tokens but the last (which the next step feeds).
        With a draft (DecodeParams.draft_ids; greedy decodes only) the prompt's last token and
        the draft's tokens but its last are fed too, in the same pass, and the draft is taken
        (_take_draft). Returns the finish reason when that ends the decode."""
        p = seq.params
        prompt = len(seq.tokens)
        room = min(p.max_new_tokens, self.dims.n_text_ctx - prompt)
        draft = list(p.draft_ids[:room]) if p.temperature == 0 and seq.group is None else []
        fed = seq.tokens[:-1] + (seq.tokens[-1:] + draft[:-1] if draft else [])
        n = len(fed)
        if n == 0:
            return None
        tokens = torch.tensor([fed], device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        caches, cross = lane.slots.row_views(slot, n, seq.audio_slot)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]
        hidden = self.model.decoder(tokens, positions, caches, cross, causal)
        if p.probe_ids and p.probe_index < prompt - 1:
            seq.record_probe(self.model.decoder.logits(hidden[0, p.probe_index]).float())
        if not draft:
            return None
        return self._take_draft(lane, seq, draft, self.model.decoder.logits(hidden[0, prompt - 1:]).float())

    def _take_draft(self, lane: Lane, seq: DecodingSequence, draft: list[int], logits: torch.Tensor) -> str | None:
        """``logits[j]``: what follows the prompt and draft[:j]. Each draft token goes through the
        step's logits pipeline and is taken while it is the token the step would choose; where
        it is not, the token the step chooses is taken instead and the draft ends there (the next
        step feeds that token, overwriting the draft's K/V at its position)."""
        for j, token in enumerate(draft):
            logprobs, (chosen,) = self._choose(lane, [seq], logits[j : j + 1])
            reason = self._advance(seq, chosen, float(logprobs[0, chosen]))
            self.tokens_total += 1
            if reason or chosen != token:
                return reason
        return None

    def _drop_cancelled(self) -> None:
        for lane in self._lanes:
            for i in reversed(range(len(lane.active))):
                if lane.active[i].stream.cancelled.is_set():
                    self._release(lane, i, "cancelled")

    def _forward(self, lane: Lane) -> torch.Tensor:
        """One decoder step over every active sequence of ``lane``: float32 logits [n, vocab]."""
        seqs = lane.active
        n = len(seqs)
        positions = torch.tensor([[len(s.tokens) - 1] for s in seqs], device=self.device)
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.device)
        # The self-attention span, rounded up to whole blocks: BLAS sums the attention weights
        # times the values in another order for a span of another length, except between whole
        # blocks, so a sequence's result would otherwise move with the longest one beside it.
        longest = max(len(s.tokens) for s in seqs)
        length = min(self.dims.n_text_ctx, -(-longest // SELF_ATTENTION_BLOCK) * SELF_ATTENTION_BLOCK)
        lane.slots.ensure(n, length, in_use=n)
        caches, cross = lane.slots.batch_views(n, length, len(lane.audio_readers))
        mask = (torch.arange(length, device=self.device)[None, :] <= positions)[:, None, None, :]
        with self.clock.timing("decoder_layers"):
            hidden = self.model.decoder(tokens, positions, caches, cross, mask, lane.shared_audio(self.device))
        with self.clock.timing("vocabulary_projection"):
            return self.model.decoder.logits(hidden[:, 0]).float()

    def _step(self, lane: Lane) -> None:
        seqs = lane.active
        logits = self._forward(lane)
        self.steps += 1
        self.tokens_total += len(seqs)
        self.batch_sizes[len(seqs)] += 1
        with self.clock.timing("logits_pipeline"):
            logprobs, chosen = self._choose(lane, seqs, logits)
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
                finished += self._advance_beams(lane, group, logprobs)
        for i, reason in sorted(finished, reverse=True):
            self._release(lane, i, reason)

    def _choose(self, lane: Lane, seqs: list[DecodingSequence], logits: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The logits pipeline over rows ``seqs`` of ``logits`` (changed in place): probe, penalties,
        grammar mask, Whisper rules; returns the log-probabilities and each row's chosen token."""
        for i, s in enumerate(seqs):  # the probe reads the raw distribution, before any mask
            if s.probe_due():
                s.record_probe(logits[i])
        apply_penalties(seqs, logits)
        lane.grammar_mask(seqs, logits)
        apply_whisper_rules(seqs, logits)
        return torch.log_softmax(logits, dim=-1), choose_tokens(seqs, logits)

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

    def _advance_beams(self, lane: Lane, group: BeamGroup, logprobs: torch.Tensor) -> list[tuple[int, str]]:
        """One beam-search step for ``group``: its slots take the best continuations; returns
        the slots to release."""
        slots = [i for i, s in enumerate(lane.active) if s.group is group]
        beams = [lane.active[i] for i in slots]
        in_prefix = beams[0].text_tokens() is None
        # The beams of a group usually sit in consecutive rows: then a view, not a copy of their rows.
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        rows = logprobs[slots[0] : slots[0] + len(slots)] if consecutive else logprobs[slots]
        chosen = in_parent_slots(group.select([b.as_hypothesis() for b in beams], rows.cpu(), in_prefix))
        if chosen:
            lane.slots.copy_self_rows(slots[: len(chosen)], [slots[p] for p, _, _ in chosen],
                                       max(len(b.tokens) for b in beams))
            take_parents(beams, chosen)
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
            self._record_cross_attention(lane, head, list(head.params.prompt_ids) + best.tokens)
        for token, lp in zip(best.tokens, best.logprobs):
            head.stream.emit(StepEvent(token, lp))
        group.finish_reason = "stop" if best.tokens and best.tokens[-1] == group.eot_id else "length"
        return [(i, group.finish_reason) for i in slots]

    def _release(self, lane: Lane, index: int, reason: str) -> None:
        """Finish the sequence in row ``index`` of ``lane`` (the lane's last row moves into it)."""
        seq = lane.active[index]
        if seq.params.alignment_heads and reason in ("stop", "length") and seq.group is None:
            self._record_cross_attention(lane, seq, seq.tokens)
        lane.remove(index)
        if seq.group is not None:
            seq.group.live -= 1
            if seq.group.live > 0:
                return  # the other beams of its group still decode
            reason = seq.group.finish_reason or reason
        self._finish(seq, reason)

    def _record_cross_attention(self, lane: Lane, seq: DecodingSequence, all_tokens: list[int]) -> None:
        """While the sequence's audio slot still holds the audio's K/V: the alignment heads'
        attention for every generated token of ``all_tokens`` (prompt + generated), from one
        teacher-forced pass (word timing needs it, decoding does not)."""
        with self.clock.timing("word_alignment"):
            tokens = torch.tensor([all_tokens[:-1]], device=self.device)  # inputs: each position predicts the next token
            cross = lane.slots.audio_views(seq.audio_slot)
            weights = self.model.decoder.cross_attention(tokens, cross, list(seq.params.alignment_heads))
            first = len(seq.params.prompt_ids) - 1
            seq.stream.result.cross_attention = weights[:, first:].float().cpu().numpy()

    def _finish(self, seq: DecodingSequence, reason: str, error: str | None = None) -> None:
        if reason == "cancelled":
            self.cancelled_total += 1
        seq.stream.finish(reason, error)
