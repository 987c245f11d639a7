"""The decode loop: many sequences, one model, one thread.

Continuous batching on torch: new sequences are admitted between steps (up to
``max_encode_batch`` encoder windows at a time, their cross-attention K/V computed once into a
slot), and every step advances all active sequences by one token. KV caches live in per-slot
tensors that grow with the load; active sequences always occupy slots 0..n-1 (a finished
sequence's slot is filled by the last one), so each step works on plain views.

Callers live on an asyncio loop; the model runs on a worker thread (torch releases the GIL
inside kernels) and hands events back with ``call_soon_threadsafe``.

Device: the engine runs where the model's weights are (CPU, or CUDA in float16: see
runtime.build_runtime). Caches and step inputs are made there; logits are taken to float32 for
the grammar mask, the rules and sampling, so every path behaves alike on both devices. Grammar
bitmasks are filled on the CPU (xgrammar's matcher) and copied over once per step.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import xgrammar as xgr

from .features import log_mel_spectrogram
from .beam_search import BeamGroup, Hypothesis
from .logit_rules import apply_text_rules
from .model import Whisper
from .params import DecodeParams, SequenceResult, StepEvent

log = logging.getLogger(__name__)


class SequenceStream:
    """Async iterator of StepEvents for one sequence; ``result`` is complete when it ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.result = SequenceResult()
        self.cancelled = threading.Event()
        self.on_cancel = None  # set by engines that must act at once (a remote decode is aborted)

    def cancel(self) -> None:
        """Free the sequence's slot at the next step (safe from any thread)."""
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()

    # Called on the engine thread.
    def _emit(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is gone: nobody is listening any more
            self.cancelled.set()

    def __aiter__(self):
        return self

    async def __anext__(self) -> StepEvent:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def collect(self) -> SequenceResult:
        async for _ in self:
            pass
        return self.result


@dataclass
class _Sequence:
    params: DecodeParams
    audio: np.ndarray
    stream: SequenceStream
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    text_start: int | None = None
    matcher: object = None
    generator: torch.Generator | None = None
    group: BeamGroup | None = None  # set: this is one beam of a beam-search sequence
    beam_logprobs: list[float] = field(default_factory=list)  # a beam's generated log-probabilities

    def __post_init__(self):
        self.tokens = list(self.params.prompt_ids)
        for i, t in enumerate(self.tokens):
            if self.text_start is None and t in self.params.text_start_after_ids:
                self.text_start = i + 1
        if self.params.grammar is not None:
            self.matcher = xgr.GrammarMatcher(self.params.grammar)
        if self.params.temperature > 0:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.params.seed if self.params.seed is not None else int(time.time_ns()))

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - len(self.params.prompt_ids)

    def append(self, token: int) -> None:
        self.tokens.append(token)
        if self.text_start is None and token in self.params.text_start_after_ids:
            self.text_start = len(self.tokens)

    @property
    def slots_needed(self) -> int:
        return max(1, self.params.beam_size)

    def as_hypothesis(self) -> Hypothesis:
        return Hypothesis(self.tokens[len(self.params.prompt_ids) :], list(self.beam_logprobs))


# Encoder outputs kept for retries of the same window: 1500 x 512 floats (3 MB) each.
ENCODER_CACHE_WINDOWS = 8


class BatchEngine:
    # One encoder window per admission by default: on the CPU the encoder is compute-bound, so
    # stacking windows gains nothing and multiplies activation memory (27 clips at once on 2
    # cores: 0.868 s/clip and 1.52 GB RSS with 1, against 0.935 s/clip and 1.80 GB with 4).
    # encoder_dtype=torch.bfloat16 runs the encoder's matrix products in bfloat16 (autocast):
    # measured 1.4-1.8x faster per window on an AVX512-BF16 CPU, relative output error ~1%. The
    # decoder stays fp32: its attention over the cross cache measured ~2x slower in bf16.
    def __init__(self, model: Whisper, max_batch_size: int = 16, max_encode_batch: int = 1, threads: int | None = None,
                 encoder_dtype: torch.dtype | None = None):
        self.model = model
        weight = model.decoder.token_embedding.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.encoder_dtype = encoder_dtype
        self.dims = model.dims
        self.max_batch_size = max_batch_size
        self.max_encode_batch = max_encode_batch
        if threads:
            torch.set_num_threads(threads)
        self._pending: collections.deque[_Sequence] = collections.deque()
        self._active: list[_Sequence] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._self_kv: list | None = None  # per-slot caches, grown on demand (_ensure_capacity)
        self._cross_kv: list | None = None
        self._encoded: collections.OrderedDict = collections.OrderedDict()  # id(audio) -> (audio, features)
        self._bitmask = xgr.allocate_token_bitmask(max_batch_size, self.dims.n_vocab)
        self.steps = 0  # decode steps run, for tests and metrics
        self.tokens_total = 0  # tokens decoded (one per active sequence per step)
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # steps run at each batch size
        self.encoder_windows = 0  # encoder passes run (windows, after the cache)
        self.submitted_total = 0  # sequences submitted
        self.cancelled_total = 0  # sequences ended by cancel() before they finished
        self._thread = threading.Thread(target=self._run, name="asr-engine", daemon=True)
        self._thread.start()

    # ---- public API (any thread with an asyncio loop) ----
    def submit(self, audio: np.ndarray, params: DecodeParams) -> SequenceStream:
        if len(params.prompt_ids) >= self.dims.n_text_ctx:
            raise ValueError(f"prompt of {len(params.prompt_ids)} tokens exceeds the {self.dims.n_text_ctx}-token context")
        if params.beam_size > self.max_batch_size:
            raise ValueError(f"{params.beam_size} beams exceed the engine's {self.max_batch_size} slots")
        stream = SequenceStream(asyncio.get_running_loop())
        self.submitted_total += 1
        with self._wake:
            self._pending.append(_Sequence(params, audio, stream))
            self._wake.notify()
        return stream

    @property
    def active_count(self) -> int:
        """Sequences holding a slot (being decoded)."""
        return len(self._active)

    @property
    def queued_count(self) -> int:
        """Sequences submitted but not yet admitted."""
        return len(self._pending)

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # ---- engine thread ----
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._pending and not self._active:
                    self._wake.wait()
                if self._stopping:
                    break
                admitted: list[_Sequence] = []
                windows = 0
                while (self._pending and windows < self.max_encode_batch
                       and len(self._active) + len(admitted) + self._pending[0].slots_needed <= self.max_batch_size):
                    seq = self._pending.popleft()
                    if seq.stream.cancelled.is_set():
                        self._finish_unslotted(seq, "cancelled")
                    else:
                        admitted += _with_beams(seq)
                        windows += 1
            try:
                with torch.inference_mode():
                    if admitted:
                        self._admit(admitted)
                    self._drop_cancelled()
                    if self._active:
                        self._step()
            except Exception as e:  # never leave a caller waiting on a dead loop
                log.exception("engine step failed")
                for seq in admitted + self._active:
                    if not seq.stream.result.finish_reason:
                        self._finish_unslotted(seq, "error", str(e))
                self._active.clear()
        for seq in list(self._pending) + self._active:
            self._finish_unslotted(seq, "cancelled")

    def _ensure_capacity(self, slots: int, length: int = 1) -> None:
        """Grow the per-slot caches to hold ``slots`` sequences and ``length`` self-attention
        positions (powers of two up to the limits), keeping the active slots' contents: memory
        follows the load and the sequence lengths actually seen. Layers are replaced one at a
        time so a growth never holds two full copies of the caches."""
        d = self.dims
        have_slots = 0 if self._self_kv is None else self._self_kv[0][0].shape[0]
        have_length = 0 if self._self_kv is None else self._self_kv[0][0].shape[2]
        if slots <= have_slots and length <= have_length:
            return
        capacity = max(have_slots, min(self.max_batch_size, _next_power_of_two(slots)))
        self_length = max(have_length, min(d.n_text_ctx, _next_power_of_two(max(length, 64))))
        hd = d.n_text_state // d.n_text_head
        n = len(self._active)

        def grow(old, positions: int):
            new = torch.zeros(capacity, d.n_text_head, positions, hd, device=self.device, dtype=self.dtype)
            if old is not None and n:
                keep = min(positions, old.shape[2])
                new[:n, :, :keep] = old[:n, :, :keep]
            return new

        if self._self_kv is None:
            self._self_kv = [(None, None)] * d.n_text_layer
            self._cross_kv = [(None, None)] * d.n_text_layer
        for i in range(d.n_text_layer):
            k, v = self._self_kv[i]
            self._self_kv[i] = None  # drop our reference first: the old layer is freed as soon as copied
            self._self_kv[i] = (grow(k, self_length), grow(v, self_length))
            if capacity != have_slots:
                k, v = self._cross_kv[i]
                self._cross_kv[i] = None
                self._cross_kv[i] = (grow(k, d.n_audio_ctx), grow(v, d.n_audio_ctx))
            del k, v
        log.info("decode caches grown to %d slots x %d positions", capacity, self_length)

    def _encode(self, seqs: list[_Sequence]) -> torch.Tensor:
        """Encoder output for each sequence's audio. The last few windows' outputs are kept,
        keyed by the audio array itself: a retry of the same window (temperature fallback, an
        outlier re-decode, a detection pass) skips the encoder, the costliest part of a decode."""
        todo = list({id(s.audio): s for s in seqs if _cached(self._encoded, s.audio) is None}.values())
        if todo:
            mel = torch.stack([log_mel_spectrogram(s.audio, self.dims.n_mels) for s in todo])
            mel = mel.to(self.device, self.dtype)
            with torch.autocast(self.device.type, dtype=self.encoder_dtype or torch.bfloat16,
                                enabled=self.encoder_dtype is not None):
                features = self.model.encoder(mel).to(self.dtype)
            self.encoder_windows += len(todo)
            for s, f in zip(todo, features):
                # A weak reference: the cache must not keep a request's audio alive, and a dead
                # reference tells a reused id from the array it was cached for.
                self._encoded[id(s.audio)] = (weakref.ref(s.audio), f)
                while len(self._encoded) > ENCODER_CACHE_WINDOWS:
                    self._encoded.popitem(last=False)
        return torch.stack([_cached(self._encoded, s.audio) for s in seqs])

    def _admit(self, seqs: list[_Sequence]) -> None:
        self._ensure_capacity(len(self._active) + len(seqs), max(len(s.tokens) for s in seqs))
        audio_features = self._encode(seqs)
        first = len(self._active)
        for layer, (ck, cv) in zip(self.model.decoder.layers, self._cross_kv):
            k, v = layer.cross_kv_for(audio_features)
            ck[first : first + len(seqs)] = k
            cv[first : first + len(seqs)] = v
        for i, seq in enumerate(seqs):
            self._active.append(seq)
            self._prefill(first + i, seq)

    def _prefill(self, slot: int, seq: _Sequence) -> None:
        """Write the KV cache of all prompt tokens but the last (which the next step feeds)."""
        n = len(seq.tokens) - 1
        if n == 0:
            return
        tokens = torch.tensor([seq.tokens[:n]], device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        caches = [(k[slot : slot + 1, :, :n], v[slot : slot + 1, :, :n]) for k, v in self._self_kv]
        cross = [(k[slot : slot + 1], v[slot : slot + 1]) for k, v in self._cross_kv]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]
        hidden = self.model.decoder(tokens, positions, caches, cross, causal)
        p = seq.params
        if p.probe_ids and p.probe_index < n:
            probs = torch.softmax(self.model.decoder.logits(hidden[0, p.probe_index]).float(), dim=-1)
            seq.stream.result.probe_probs = {t: float(probs[t]) for t in p.probe_ids}

    def _drop_cancelled(self) -> None:
        for i in reversed(range(len(self._active))):
            if self._active[i].stream.cancelled.is_set():
                self._release(i, "cancelled")

    def _step(self) -> None:
        n = len(self._active)
        seqs = self._active
        positions = torch.tensor([[len(s.tokens) - 1] for s in seqs], device=self.device)
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], device=self.device)
        ctx = max(len(s.tokens) for s in seqs)
        self._ensure_capacity(n, ctx)
        caches = [(k[:n, :, :ctx], v[:n, :, :ctx]) for k, v in self._self_kv]
        cross = [(k[:n], v[:n]) for k, v in self._cross_kv]
        mask = (torch.arange(ctx, device=self.device)[None, :] <= positions)[:, None, None, :]
        hidden = self.model.decoder(tokens, positions, caches, cross, mask)
        logits = self.model.decoder.logits(hidden[:, 0]).float()
        self.steps += 1
        self.tokens_total += n
        self.batch_sizes[n] += 1

        for i, s in enumerate(seqs):
            p = s.params
            if p.probe_ids and s.n_generated == 0 and p.probe_index == len(p.prompt_ids) - 1:
                probs = torch.softmax(logits[i], dim=-1)
                s.stream.result.probe_probs = {t: float(probs[t]) for t in p.probe_ids}
        self._mask(seqs, logits)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = self._sample(seqs, logits)

        finished: list[tuple[int, str]] = []
        groups: dict[int, BeamGroup] = {}
        for i, s in enumerate(seqs):
            if s.group is not None:  # beams advance together, below
                groups[id(s.group)] = s.group
                continue
            token = chosen[i]
            lp = float(logprobs[i, token])
            if lp == float("-inf"):  # every token was masked: the constraint has no way on
                finished.append((i, "grammar"))
                continue
            s.append(token)
            s.stream.result.token_ids.append(token)
            s.stream.result.logprobs.append(lp)
            if s.matcher is not None and not s.matcher.accept_token(token):
                finished.append((i, "grammar"))
                continue
            s.stream._emit(StepEvent(token, lp))
            if token == s.params.eot_id:
                finished.append((i, "stop"))
            elif s.n_generated >= s.params.max_new_tokens or len(s.tokens) >= self.dims.n_text_ctx:
                finished.append((i, "length"))
        for group in groups.values():
            finished += self._advance_beams(group, logprobs)
        for i, reason in sorted(finished, reverse=True):
            self._release(i, reason)

    def _advance_beams(self, group: BeamGroup, logprobs: torch.Tensor) -> list[tuple[int, str]]:
        """One beam-search step for ``group``: its slots take the best continuations (KV rows,
        tokens and grammar state copied from their parent beams); returns slots to release."""
        slots = [i for i, s in enumerate(self._active) if s.group is group]
        beams = [self._active[i] for i in slots]
        chosen = group.select([b.as_hypothesis() for b in beams], logprobs[slots].cpu())
        if chosen:
            parents = [slots[p] for p, _, _ in chosen]
            targets = slots[: len(chosen)]
            for k, v in self._self_kv:  # the right side is gathered (copied) before writing
                k[targets] = k[parents]
                v[targets] = v[parents]
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
        live = beams[: len(chosen)]
        release = [(i, "pruned") for i in slots[len(chosen) :]]
        head = live[0] if live else beams[0]
        at_limit = any(b.n_generated >= b.params.max_new_tokens or len(b.tokens) >= self.dims.n_text_ctx for b in live)
        if not group.done(len(live), at_limit):
            return release
        best = group.best([b.as_hypothesis() for b in live])
        if best is None:  # every continuation was masked: end this group only, like a greedy dead end
            group.finish_reason = "grammar"
            return [(i, "grammar") for i in slots]
        result = head.stream.result
        result.token_ids, result.logprobs = list(best.tokens), list(best.logprobs)
        reason = "stop" if best.tokens and best.tokens[-1] == group.eot_id else "length"
        if head.params.alignment_heads:
            self._record_cross_attention(slots[0], head, list(head.params.prompt_ids) + best.tokens)
        for token, lp in zip(best.tokens, best.logprobs):
            head.stream._emit(StepEvent(token, lp))
        group.finish_reason = reason
        return [(i, reason) for i in slots]

    def _mask(self, seqs: list[_Sequence], logits: torch.Tensor) -> None:
        n = len(seqs)
        bitmask = self._bitmask[:n]
        constrained = False
        for i, s in enumerate(seqs):
            if s.matcher is not None:
                s.matcher.fill_next_token_bitmask(bitmask, i)
                constrained = True
            else:
                bitmask[i] = -1
        if constrained:
            if self.device.type == "cpu":
                xgr.apply_token_bitmask_inplace(logits, bitmask)
            else:
                apply_bitmask(logits, bitmask.to(self.device, non_blocking=True))
        for i, s in enumerate(seqs):
            if s.text_start is not None:
                apply_text_rules(logits[i], s.params, s.tokens[s.text_start :])

    @staticmethod
    def _sample(seqs: list[_Sequence], logits: torch.Tensor) -> list[int]:
        chosen = logits.argmax(dim=-1).tolist()
        for i, s in enumerate(seqs):
            if s.generator is not None:  # on the CPU: its generator is, and a seed gives one result anywhere
                chosen[i] = _sample_one(logits[i].cpu(), s.params, s.generator)
        return chosen

    def _release(self, index: int, reason: str) -> None:
        """Finish the sequence in ``index`` and move the last active sequence into its slot."""
        seq = self._active[index]
        if seq.params.alignment_heads and reason in ("stop", "length") and seq.group is None:
            self._record_cross_attention(index, seq, seq.tokens)
        last = len(self._active) - 1
        if index != last:
            moved = self._active[last]
            length = len(moved.tokens)
            for (k, v) in self._self_kv:
                k[index, :, :length] = k[last, :, :length]
                v[index, :, :length] = v[last, :, :length]
            for (k, v) in self._cross_kv:
                k[index] = k[last]
                v[index] = v[last]
            self._active[index] = moved
        self._active.pop()
        if seq.group is not None:
            seq.group.live -= 1
            if seq.group.live > 0:
                return  # the other beams of its group still decode
            reason = seq.group.finish_reason or reason
        self._finish_unslotted(seq, reason)

    def _record_cross_attention(self, slot: int, seq: _Sequence, all_tokens: list[int]) -> None:
        """While the slot still holds the audio's K/V: the alignment heads' attention for every
        generated token of ``all_tokens`` (prompt + generated), from one teacher-forced pass
        (word timing needs it, decoding does not)."""
        tokens = torch.tensor([all_tokens[:-1]], device=self.device)  # inputs: each position predicts the next token
        cross = [(k[slot : slot + 1], v[slot : slot + 1]) for k, v in self._cross_kv]
        weights = self.model.decoder.cross_attention(tokens, cross, list(seq.params.alignment_heads))
        first = len(seq.params.prompt_ids) - 1
        seq.stream.result.cross_attention = weights[:, first:].float().cpu().numpy()

    def _finish_unslotted(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        if reason == "cancelled":
            self.cancelled_total += 1
        seq.stream.result.finish_reason = reason
        seq.stream.result.error = error
        seq.stream._emit(None)


def _with_beams(seq: _Sequence) -> list[_Sequence]:
    """A beam-search sequence becomes ``beam_size`` beams sharing its stream and audio."""
    if seq.params.beam_size <= 1:
        return [seq]
    group = BeamGroup(seq.params.beam_size, seq.params.eot_id, seq.params.length_penalty, live=seq.params.beam_size)
    beams = [seq] + [_Sequence(seq.params, seq.audio, seq.stream) for _ in range(seq.params.beam_size - 1)]
    for beam in beams:
        beam.group = group
    return beams


_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """xgrammar's token bitmask (int32 words, token i = bit i % 32 of word i // 32) applied with
    plain torch ops, on any device: xgrammar's own GPU kernels need triton or a compiler at run
    time; this needs neither. Disallowed tokens get -inf in place."""
    shifts = _BIT_SHIFTS.get(bitmask.device)
    if shifts is None:
        shifts = _BIT_SHIFTS[bitmask.device] = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)[:, : logits.shape[-1]]
    logits.masked_fill_(~allowed, float("-inf"))


def _cached(cache: collections.OrderedDict, audio: np.ndarray) -> torch.Tensor | None:
    entry = cache.get(id(audio))
    if entry is None or entry[0]() is not audio:
        return None
    cache.move_to_end(id(audio))
    return entry[1]


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _sample_one(logits: torch.Tensor, params: DecodeParams, generator: torch.Generator) -> int:
    """Temperature sampling over the tokens that survive top_k, then top_p (nucleus).

    When the grammar leaves no token (all -inf), the argmax is returned: its log-probability is
    -inf, which ends the sequence as "grammar" exactly as in the greedy path (softmax of all -inf
    is NaN, which multinomial refuses)."""
    scaled = torch.nan_to_num(logits / params.temperature, nan=float("-inf"))
    if not torch.isfinite(scaled).any():
        return int(torch.argmax(logits))
    if params.top_k:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1])).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        drop[0] = False
        scaled = scaled.scatter(0, order[drop], float("-inf"))
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))
