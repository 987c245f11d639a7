"""One piece of audio's decode, judged by the temperature fallback: the request's prompt and
sampling for the engine (decode_params), the first decode, the hotter retries when it fails the
thresholds, and the kept decode parsed into text, figures and timed words (ChunkOutcome).
window_decode.WindowDecode decides which pieces of a window to decode; this module decodes one.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

import numpy as np

from adapters.base import ParsedOutput, TranscriptionAdapter
from adapters.decode_request import DecodeParams

from . import two_stage
from .chunking import AudioChunk
from .engine.interface import Engine
from .engine.params import Priority, SequenceResult, raise_if_failed
from .fallback import DecodeFigures, compression_ratio, is_silent, pick_best, rejection
from .speech_gate import SpeechGate
from .transcription_types import TranscriptionOptions
from .window_outcome import ChunkOutcome
from .word_timing import FRAMES_PER_SECOND, Word, word_times

log = logging.getLogger(__name__)

# Fallback retries sample with this seed (plus their index) when the request gives none: the
# same request gets the same answer.
FALLBACK_SEED = 0


def decode_params(adapter: TranscriptionAdapter, options: TranscriptionOptions, language: str | None = None,
                  previous_text: str | None = None) -> DecodeParams:
    """The engine's parameters for a decode under ``options``: the adapter's prompt (fused
    detection when no language is known) with the request's sampling, budget and beams."""
    language = language or options.language
    context = " ".join(t.strip() for t in (options.hotwords, previous_text or options.previous_text) if t and t.strip())
    if language is not None:
        params = adapter.build_prompt(language, options.task, options.timestamps, context or None)
    else:
        params = adapter.build_fused_autodetect_params(options.task, options.timestamps, options.candidate_languages,
                                                       context or None)
    changes = {"temperature": options.temperature, "seed": options.seed, "top_k": options.top_k, "top_p": options.top_p,
               "min_p": options.min_p, "repetition_penalty": options.repetition_penalty,
               "frequency_penalty": options.frequency_penalty, "presence_penalty": options.presence_penalty,
               "audio_sized_encoder": options.audio_sized_encoder}
    if options.max_new_tokens is not None:
        # The budget is for text: the prefix a fused decode generates first, and a timed
        # decode's opening timestamp, are not counted.
        budget = options.max_new_tokens + adapter.tokens_before_text(params)
        changes["max_new_tokens"] = min(params.max_new_tokens, budget)
    if options.word_timestamps:
        changes["alignment_heads"] = adapter.alignment_heads
    if options.beam_size > 1 and options.temperature == 0:
        changes.update(beam_size=options.beam_size, length_penalty=options.length_penalty)
    elif options.draft is not None and options.temperature == 0 and options.draft.timed == params.timed:
        changes["draft_ids"] = adapter.draft_ids(params, options.task, options.draft.language, list(options.draft.tokens))
    return replace(params, **changes)


@dataclass(frozen=True)
class DecodeParts:
    """What every window's decode runs on: the engine, the model's adapter, the speech gate."""

    engine: Engine
    adapter: TranscriptionAdapter
    gate: SpeechGate | None

    async def gate_work(self, scan, *args):
        """A speech gate scan (CPU work), off the event loop on the gate's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self.gate.worker, scan, *args)


class PieceDecode:
    """Decodes pieces of one window under the request's ``options`` (thresholds, the speech
    gate's settings, the languages detection may choose), each engine decode with the window's
    ``priority``."""

    def __init__(self, parts: DecodeParts, options: TranscriptionOptions, priority: Priority):
        self.parts = parts
        self.options = options
        self.priority = priority

    async def piece(self, chunk: AudioChunk, options: TranscriptionOptions, previous_text: str | None) -> ChunkOutcome:
        """The chunk's kept decode: the first, or the best of the fallback's when the first
        fails the thresholds."""
        first, language = await self.first_decode(chunk, options, previous_text)
        return await self.judged(first, language, options, previous_text)

    async def first_decode(self, chunk: AudioChunk, options: TranscriptionOptions,
                           previous_text: str | None) -> tuple[ChunkOutcome, str | None]:
        """The chunk's first decode (none when the speech gate hears no speech in it), and the
        language it was asked for (None: detected in the same decode)."""
        if not await self.hears_speech(chunk):
            return self._no_speech_outcome(chunk), None
        language = options.language
        if language is None and options.detection == "two-stage":
            language = await two_stage.detect_language(self.parts.engine, self.parts.adapter, chunk,
                                                       decode_params(self.parts.adapter, options),
                                                       options.candidate_languages)
        return await self.decode(chunk, decode_params(self.parts.adapter, options, language, previous_text)), language

    async def judged(self, first: ChunkOutcome, language: str | None, options: TranscriptionOptions,
                     previous_text: str | None) -> ChunkOutcome:
        """The decode to keep: ``first`` (asked for in ``language``), or the best of the
        fallback's when it fails the thresholds."""
        rule = rejection(first.figures, options.thresholds)
        if options.temperature > 0 or not options.fallback_temperatures or rule is None or first.params is None:
            return first
        chunk = first.chunk
        log.debug("chunk at %.2f-%.2f s decoded again hotter (%s): %s", chunk.start, chunk.end, rule, first.figures)
        kept = await self._fallback(chunk, first, options, language or first.parsed.language, previous_text)
        kept.rejected_by = rule
        return kept

    async def _fallback(self, chunk: AudioChunk, first: ChunkOutcome, options: TranscriptionOptions,
                        language: str | None, previous_text: str | None) -> ChunkOutcome:
        """Decode again at each fallback temperature and keep the best. Retries keep the first
        decode's prefix: its language goes into the prompt, and the (fixed-language) grammar
        still holds the text to the model's token rules. They run together, as one batch in the
        engine (the encoder output is reused): the kept decode is the same as trying one
        temperature after another, in a fraction of the time. The first that passes is kept,
        so once it and every cooler one have ended, the hotter ones are cancelled: a sampled
        babble running on to its token limit cannot hold the window up."""
        base_seed = FALLBACK_SEED if options.seed is None else options.seed
        retries = [asyncio.ensure_future(self.decode(chunk, replace(
                       decode_params(self.parts.adapter, options, language, previous_text), temperature=temperature,
                       seed=base_seed + i + 1, top_k=None, top_p=None, min_p=0.0, beam_size=1)))
                   for i, temperature in enumerate(options.fallback_temperatures)]
        attempts = [first]
        try:
            for retry in retries:
                attempts.append(await retry)
                if rejection(attempts[-1].figures, options.thresholds) is None:
                    break
        finally:
            for retry in retries:
                retry.cancel()  # no-op on those that ended; frees the engine slots of the rest
        kept = attempts[pick_best([a.figures for a in attempts], options.thresholds)]
        kept.language_probs = first.language_probs  # the detection is the first decode's
        return kept

    async def decode(self, chunk: AudioChunk, params: DecodeParams) -> ChunkOutcome:
        """One engine decode of the chunk, parsed."""
        stream = self.parts.engine.submit(chunk.samples, params, self.priority)
        try:
            await stream.collect()
        finally:
            stream.cancel()  # no-op when finished; frees the slot if the caller was cancelled
        return self._outcome(chunk, params, stream.result)

    async def hears_speech(self, chunk: AudioChunk) -> bool:
        if self.parts.gate is None or not self.options.vad_filter:
            return True
        return await self.parts.gate_work(self.parts.gate.has_speech, chunk.samples, self.options.vad.threshold)

    @staticmethod
    def _no_speech_outcome(chunk: AudioChunk) -> ChunkOutcome:
        figures = DecodeFigures(temperature=0.0, avg_logprob=0.0, compression_ratio=0.0, no_speech_prob=None,
                                parsed=True, speech_found=False)
        return ChunkOutcome(chunk, None, SequenceResult(finish_reason="no_speech"), {}, ParsedOutput(None, ""), figures,
                            silent=True)

    def _outcome(self, chunk: AudioChunk, params: DecodeParams, result: SequenceResult) -> ChunkOutcome:
        raise_if_failed(result)
        adapter, options = self.parts.adapter, self.options
        parsed = adapter.parse_output(result.token_ids, params)
        text_logprobs = result.logprobs[parsed.prefix_length :]
        figures = DecodeFigures(
            temperature=params.temperature,
            avg_logprob=sum(text_logprobs) / max(1, len(text_logprobs)),
            compression_ratio=compression_ratio(parsed.text or ""),
            no_speech_prob=adapter.no_speech_probability(result.probe_probs),
            parsed=parsed.failure is None,
        )
        probs = adapter.language_probabilities(result.probe_probs, options.candidate_languages)
        words = self._words(chunk, params, result, parsed)
        # The alignment heads' attention (heads x tokens x 1500 frames, megabytes a window) is
        # only there for the word times: dropped now, not held for every window of a long file
        # until the response is assembled.
        result.cross_attention = None
        return ChunkOutcome(chunk, params, result, probs, parsed, figures, is_silent(figures, options.thresholds), words)

    def _words(self, chunk: AudioChunk, params: DecodeParams, result: SequenceResult, parsed: ParsedOutput) -> list[Word]:
        """The decode's words, timed within the chunk by DTW over the alignment heads (none
        unless the decode was asked for their attention, and none for output that did not
        parse, which gives no text)."""
        attention = result.cross_attention
        if attention is None or parsed.failure is not None:
            return []
        generated, eot = result.token_ids, params.eot_id
        text_rows = [j for j in range(parsed.prefix_length, len(generated)) if generated[j] < eot]
        if not text_rows:
            return []
        rows = attention[:, text_rows]
        if eot in generated:
            end_row = attention[:, [generated.index(eot)]]
        else:  # cut off by the token budget: let the last word run to the end of the window
            end_row = np.zeros_like(rows[:, :1])
            end_row[..., min(attention.shape[-1], round(chunk.duration * FRAMES_PER_SECOND)) - 1] = 1.0
        pieces = [w for s in parsed.segments for w in self.parts.adapter.split_words(s.token_ids, parsed.language)]
        text_logprobs = [result.logprobs[j] for j in text_rows]
        timed = word_times(pieces, text_logprobs, np.concatenate([rows, end_row], axis=1), chunk.duration)
        return [replace(w, word=w.word.strip()) for w in timed if w.word.strip()]
