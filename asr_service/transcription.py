"""The request pipeline: audio -> chunks -> adapter prompts -> engine -> adapter parsing -> result.

One decode for every caller. ``Transcriber.run`` yields, in window order, each window's
ChunkDone once the window is final, then the assembled result. ``transcribe`` drains it for the
result; the streaming renderer (streaming.py) releases each ChunkDone's text as a delta. The
decode does not know whether anyone reads the events early: a stream is the full response,
released sooner, and the concatenated ChunkDone texts are the result's text by construction
(_TextJoin). Each window of a request is submitted as soon as it is planned (a long file's while
the rest of it is still scanned for speech), so they decode concurrently in the engine's batch
(one after another when each is conditioned on the text before it); results keep their true
time offsets.

A window is final once its decode has been judged by the fallback policy (decoded again hotter
when it fails the thresholds), continued where its text stopped before the speech in it ended
(the seek), cut and decoded again in parts where it could not be kept whole across the long
pauses it leaves out (_cuts), and its language settled: a window whose detection is an outlier
of the vote of the windows up to it is decoded again in the vote's language. That rule looks
only backwards, so a window's text never changes once it is released.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from contextlib import aclosing
from typing import AsyncIterator, Callable

import numpy as np

from adapters.base import ParsedOutput, TranscriptionAdapter

from . import two_stage
from .chunking import AudioChunk, SpeechWindowPacker, split_audio
from .engine.features import HOP_LENGTH
from .engine.interface import Engine
from .engine.params import DecodeParams, SequenceResult, UnsupportedDecode, raise_if_failed
from .fallback import DecodeFigures, QualityThresholds, compression_ratio, is_silent, needs_fallback, pick_best
from .language_vote import is_outlier, vote
from .speech_gate import SpeechGate, SpeechScan, VadSettings
from .word_timing import FRAMES_PER_SECOND, Word, snap_to_speech_onsets, word_times


@dataclass(frozen=True)
class TranscriptionOptions:
    task: str = "transcribe"
    language: str | None = None  # None: fused detection in the same decode
    timestamps: bool = False
    previous_text: str | None = None  # the request's prompt: conditions every chunk
    candidate_languages: tuple[str, ...] | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = 0.0
    seed: int | None = None
    max_new_tokens: int | None = None
    # vLLM's penalties (engine/params.py DecodeParams), neutral by default; fallback retries keep them.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # "fused" (one decode per chunk) or "two-stage" (the baseline of two_stage.py).
    detection: str = "fused"
    # At temperature 0, a chunk that fails the thresholds is decoded again at these.
    fallback_temperatures: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    thresholds: QualityThresholds = QualityThresholds()
    # Each chunk keeps the language it detected (code-switching audio) instead of the vote.
    detect_language_per_chunk: bool = False
    # Condition each chunk on the text of the one before (chunks then decode one by one).
    condition_on_previous_text: bool = False
    hotwords: str | None = None  # words to favour, given to the model as context
    # Windows in which the speech gate (Silero VAD) hears no speech are not decoded at all.
    vad_filter: bool = True
    vad: VadSettings = VadSettings()  # where long audio is cut (the request's chunking_strategy)
    word_timestamps: bool = False  # words with times, from the alignment heads' attention
    beam_size: int = 1  # above 1: beam search for the temperature-0 decode (fallback retries sample)
    length_penalty: float | None = None
    # The kept decodes' text tokens with their log-probabilities in the result (include[]=logprobs).
    token_logprobs: bool = False
    # Audio with no speech gets its most probable language (one encoder pass, one decoder step)
    # rather than none; realtime partial decodes, which only compare texts, skip it.
    name_language_of_silence: bool = True


# faster-whisper's rule: context decoded this hot is too unreliable to condition the next chunk.
PROMPT_RESET_TEMPERATURE = 0.5

# Fallback retries sample with this seed (plus their index) when the request gives none: the
# same request gets the same answer.
FALLBACK_SEED = 0

# The seek: a window whose decode stopped before its speech ended is decoded again from there.
MAX_CONTINUATIONS = 3  # per window; each must make progress, so a loop cannot run on
SEEK_MIN_PROGRESS_S = 1.0  # a continuation starts at least this far into the audio before it
SEEK_MIN_REST_S = 0.5  # and has at least this much audio to decode
SEGMENT_END_SLACK_S = 0.5  # Whisper often times a segment's end a little before the speech ends
UNCOVERED_SPEECH_S = 0.4  # this much speech heard after the last segment: the decode missed some
SEEK_LEAD_S = 0.4  # a continuation starts this far before the speech it is for


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    language: str | None
    speaker: str | None = None  # with diarization (diarization/attribution.py): who said it


@dataclass(frozen=True)
class TokenLogprob:
    """A generated text token, in OpenAI's logprobs shape: its text, its UTF-8 bytes (a
    character may span tokens: then ``token`` holds U+FFFD for the part it lacks) and its
    log-probability under the decode that was kept."""

    token: str
    logprob: float
    bytes: list[int]


@dataclass
class TranscriptionResult:
    task: str
    text: str
    language: str | None
    language_probability: float | None
    duration: float
    segments: list[Segment] = field(default_factory=list)
    words: list[Word] | None = None  # with word_timestamps: every word, times from the audio start
    # Why language detection failed on some chunk (None when it did not).
    detection_failure: str | None = None
    prompt_tokens: int = 0  # over the kept decodes of all chunks
    output_tokens: int = 0
    # "length" when the token cap (max_completion_tokens, or the model's) cut a kept decode's
    # text, else "stop": what vLLM and SGLang report as finish_reason.
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None  # with token_logprobs: every text token, in order


@dataclass
class ChunkOutcome:
    """One chunk's kept decode, parsed, with the figures the fallback policy judged it by."""

    chunk: AudioChunk
    params: DecodeParams | None  # None: the speech gate heard no speech, nothing was decoded
    result: SequenceResult
    language_probs: dict[str, float]
    parsed: ParsedOutput
    figures: DecodeFigures
    words: list[Word] = field(default_factory=list)  # with word_timestamps: timed within the chunk


@dataclass(frozen=True)
class WindowPlan:
    """Where a request's audio is decoded: ``windows`` in order, as they are found (a long
    file's VAD scan hands them out block by block, so its first windows decode while the rest is
    scanned), and where the VAD heard speech start and end (sample ranges, no padding; None
    when the gate is off), which the planning extends as it goes: complete once ``windows`` is
    exhausted. For audio of one window only the first speech is known: its scan stops there."""

    windows: AsyncIterator[AudioChunk]
    speech: list[tuple[int, int]] | None

    async def all_windows(self) -> list[AudioChunk]:
        """Every window, once all are planned."""
        return [window async for window in self.windows]


async def _listed(windows: list[AudioChunk]) -> AsyncIterator[AudioChunk]:
    for window in windows:
        yield window


@dataclass
class WindowOutcome:
    """A window's decode, then its continuations (seek) when the decode stopped before the
    speech in the window ended: pieces in time order, each over the audio from its start on."""

    window: AudioChunk
    pieces: list[ChunkOutcome]

    @property
    def head(self) -> ChunkOutcome:
        """The decode of the whole window: its language detection is the window's."""
        return self.pieces[0]

    def released(self) -> WindowOutcome:
        """The decoded window as kept until the response is assembled: the maps of the window
        and its pieces, without their samples (AudioChunk.released)."""
        return WindowOutcome(self.window.released(), [replace(p, chunk=p.chunk.released()) for p in self.pieces])


# ---- what a run yields ----

@dataclass(frozen=True)
class ChunkDone:
    """Window ``index`` is final: ``text`` is exactly what it adds to the result's text (with
    the joiner before it when text came before), and the tokens its kept decodes used."""

    index: int
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Finished:
    result: TranscriptionResult


PipelineEvent = ChunkDone | Finished


class _TextJoin:
    """The result's text, built piece by piece in time order, the one way the response and the
    stream both give it: a piece's text follows the one before it with its language's joiner
    (none in languages written without spaces), or a space when the two languages differ."""

    def __init__(self, adapter: TranscriptionAdapter):
        self.adapter = adapter
        self.text = ""
        self._language: str | None = None

    def add(self, pieces: list[tuple[str | None, str]]) -> str:
        """Append the (language, text) pieces; returns what they added."""
        added = ""
        for language, text in pieces:
            if self.text or added:
                added += self.adapter.joiner(language if language == self._language else None)
            added += text
            self._language = language
        self.text += added
        return added


@dataclass(frozen=True)
class _PlannedWindow:
    window: AudioChunk
    job: asyncio.Future | None  # -> WindowOutcome; None: started when the text before it is known


class Transcriber:
    def __init__(self, engine: Engine, adapter: TranscriptionAdapter, gate: SpeechGate | None = None):
        self.engine = engine
        self.adapter = adapter
        self.gate = gate

    async def _gate_work(self, scan, *args):
        """A speech gate scan (CPU work), off the event loop on the gate's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self.gate.worker, scan, *args)

    # ---- the two ways in ----
    async def transcribe(self, audio: np.ndarray, options: TranscriptionOptions = TranscriptionOptions(),
                         on_chunk_done: Callable[[AudioChunk], None] | None = None) -> TranscriptionResult:
        async with aclosing(self.run(audio, options, on_chunk_done=on_chunk_done)) as events:
            async for event in events:
                if isinstance(event, Finished):
                    return event.result
        raise RuntimeError("the pipeline ended without a result")

    async def run(self, audio: np.ndarray, options: TranscriptionOptions,
                  on_chunk_done: Callable[[AudioChunk], None] | None = None) -> AsyncIterator[PipelineEvent]:
        """The events of one request, in window order (see the module docstring). Closing the
        generator early cancels every decode still running."""
        options = self._for_model(options)
        plan = await self.plan(audio, options)
        conditioned = options.condition_on_previous_text
        jobs: list[asyncio.Future] = []
        # The windows in order as they are planned, then None. Each window's decode starts as soon
        # as it is planned, unless it needs the text before it (conditioned); at most
        # max_request_windows decode at once, and planning waits for room (engine.interface).
        planned: asyncio.Queue[_PlannedWindow | None] = asyncio.Queue()
        room = asyncio.Semaphore(self.engine.max_request_windows)

        async def start_windows() -> None:
            try:
                async for window in plan.windows:
                    job = None
                    if not conditioned:
                        await room.acquire()
                        job = self._start(window, options, None, on_chunk_done)
                        job.add_done_callback(lambda _: room.release())
                        jobs.append(job)
                    planned.put_nowait(_PlannedWindow(window, job))
            finally:
                planned.put_nowait(None)

        planning = asyncio.ensure_future(start_windows())
        outcomes: list[WindowOutcome] = []
        joined = _TextJoin(self.adapter)
        previous: str | None = None
        try:
            while (item := await planned.get()) is not None:
                job = item.job
                if job is None:  # each window needs the text before it: one at a time
                    job = self._start(item.window, options, previous, on_chunk_done)
                    jobs.append(job)
                outcome = await self._settled(outcomes, await job, options, audio, previous)
                outcomes.append(outcome)
                kept = [p for p in outcome.pieces if p.params is not None]
                yield ChunkDone(len(outcomes) - 1, joined.add(self._kept_texts(outcome, options)),
                                sum(len(p.params.prompt_ids) for p in kept), sum(len(p.result.token_ids) for p in kept))
                previous = self._context_after(outcome, previous, options)
            await planning  # a planning failure is the request's
            result = self._assemble(outcomes, options, audio.shape[0] / self.adapter.config.sample_rate, plan.speech)
            if result.language is None and result.detection_failure is None and options.name_language_of_silence:
                result.language, result.language_probability = await self._language_of_silence(audio, options)
            yield Finished(result)
        finally:  # finished, failed or abandoned: no planning or decode of this request runs on
            planning.cancel()
            planning.add_done_callback(_retrieve)
            for job in jobs:
                job.cancel()
                job.add_done_callback(_retrieve)

    def refusal(self, options: TranscriptionOptions) -> UnsupportedDecode | None:
        """Why the engine cannot decode what ``options`` ask for. Checked before any work, so
        the caller gets a 400 instead of a failure mid-request."""
        # Conditioning on the previous chunk puts its text in the next chunk's prompt.
        previous = "." if options.condition_on_previous_text else None
        return self.engine.refusal(self.params_for(self._for_model(options), previous_text=previous))

    def _for_model(self, options: TranscriptionOptions) -> TranscriptionOptions:
        """A model that detects no language (English-only Whisper) transcribes its one language:
        a request that names none is decoded, and answered, in it."""
        if options.language is None and not self.adapter.supports_language_detection:
            return replace(options, language=self.adapter.supported_languages[0])
        return options

    # ---- prompts ----
    async def plan(self, audio: np.ndarray, options: TranscriptionOptions) -> WindowPlan:
        """The windows to decode. With the speech gate on, the silence before the first speech
        is skipped (nothing to invent there), and audio longer than one window is cut where the
        VAD hears speech pause, long pauses left out (chunking.speech_windows). With the gate
        off: fixed windows cut at quiet points."""
        cfg = self.adapter.config
        rate = cfg.sample_rate
        if not cfg.chunking:
            return WindowPlan(_listed([AudioChunk(0, audio[: int(cfg.max_clip_seconds * rate)], rate)]), None)
        if self.gate is None or not options.vad_filter:
            return WindowPlan(_listed(split_audio(audio, rate, cfg.max_clip_seconds)), None)
        vad, pad = options.vad, round(options.vad.pad_s * rate)
        if audio.shape[0] <= cfg.max_clip_seconds * rate:
            # One window from the first speech on: a scan that stops there (cheap), not a full one.
            onset = await self._gate_work(self.gate.speech_start, audio, vad.threshold)
            if onset is None:
                return WindowPlan(_listed([AudioChunk(0, audio, rate)]), [])
            start = max(0, onset - pad)
            return WindowPlan(_listed([AudioChunk(start, audio[start:], rate)]), [(onset, audio.shape[0])])
        # Windows join speech across long pauses only where the seek decodes again what a
        # window's decode leaves out (it needs timestamps; a window can then be decoded again in
        # parts: _cuts), and not for code-switching audio (each window detects its own
        # language: the one it opens with).
        joins = options.timestamps and not options.detect_language_per_chunk
        packer = SpeechWindowPacker(audio, rate, cfg.max_clip_seconds, vad.pad_s, vad.long_pause_s, vad.kept_pause_s,
                                    join_long_pauses=joins)
        speech: list[tuple[int, int]] = []
        return WindowPlan(self._scanned_windows(SpeechScan(self.gate, audio, vad.min_silence_s, vad.threshold),
                                                packer, speech), speech)

    async def _scanned_windows(self, scan: SpeechScan, packer: SpeechWindowPacker,
                               speech: list[tuple[int, int]]) -> AsyncIterator[AudioChunk]:
        """A long file's windows (chunking.speech_windows), each handed out as soon as the scan
        has heard enough to know it will not change; ``speech`` grows with the regions found."""
        while await self._gate_work(scan.scan_block):
            speech += (await self._gate_work(scan.regions))[len(speech):]
            for window in packer.finish(speech) if scan.done else packer.windows_final(speech):
                yield window

    def params_for(self, options: TranscriptionOptions, language: str | None = None,
                   previous_text: str | None = None) -> DecodeParams:
        language = language or options.language
        context = " ".join(t.strip() for t in (options.hotwords, previous_text or options.previous_text) if t and t.strip())
        if language is not None:
            params = self.adapter.build_prompt(language, options.task, options.timestamps, context or None)
        else:
            params = self.adapter.build_fused_autodetect_params(
                options.task, options.timestamps, options.candidate_languages, context or None
            )
        changes = {"temperature": options.temperature, "seed": options.seed, "top_k": options.top_k, "top_p": options.top_p,
                   "min_p": options.min_p, "repetition_penalty": options.repetition_penalty,
                   "frequency_penalty": options.frequency_penalty, "presence_penalty": options.presence_penalty}
        if options.max_new_tokens is not None:
            # The budget is for text: the prefix a fused decode generates first, and a timed
            # decode's opening timestamp, are not counted.
            budget = options.max_new_tokens + self.adapter.tokens_before_text(params)
            changes["max_new_tokens"] = min(params.max_new_tokens, budget)
        if options.word_timestamps:
            changes["alignment_heads"] = self.adapter.alignment_heads
        if options.beam_size > 1 and options.temperature == 0:
            changes.update(beam_size=options.beam_size, length_penalty=options.length_penalty)
        return replace(params, **changes)

    # ---- one chunk ----
    def _start(self, chunk: AudioChunk, options: TranscriptionOptions, previous_text: str | None,
               on_chunk_done: Callable[[AudioChunk], None] | None) -> asyncio.Future:
        """The window's decode, started: a future of its WindowOutcome."""
        async def work() -> WindowOutcome:
            outcome = await self._decode_window(chunk, options, previous_text)
            if on_chunk_done:
                on_chunk_done(chunk)
            return outcome.released()

        return asyncio.ensure_future(work())

    async def _decode_window(self, window: AudioChunk, options: TranscriptionOptions,
                             previous_text: str | None) -> WindowOutcome:
        """The window's decode, continued (seek) while a piece stopped before the speech in it
        ended: the rest is decoded again from where the text stopped, in the window's language.
        Continuations decode after the piece before them."""
        head = await self._decode_chunk(window, options, previous_text, splits=True)
        cuts = self._cuts(head, options)
        if cuts:
            return await self._decode_parts(window, cuts, head, options, previous_text)
        outcome = WindowOutcome(window, [head])
        while len(outcome.pieces) <= MAX_CONTINUATIONS:
            last = outcome.pieces[-1].chunk
            resume = await self._resume_point(outcome.pieces[-1], options)
            if resume is None:
                break
            rest = last.tail(resume)
            language = options.language or outcome.head.parsed.language
            shown = self._window_text(outcome, options)
            # The window's text so far conditions the continuation (as the sequential algorithm
            # conditions each window on the last): a short rest of audio decoded without it is
            # often misheard.
            context = " ".join(t for t in (previous_text or options.previous_text, shown) if t) or None
            if context and self.engine.refusal(self.params_for(options, language, context)) is not None:
                context = None  # an engine that carries no prompt (SGLang without the plugin): the rest alone
            outcome.pieces.append(await self._decode_chunk(rest, replace(options, language=language), context))
        return outcome

    @staticmethod
    def _cuts(piece: ChunkOutcome, options: TranscriptionOptions) -> list[int]:
        """Where (joins, as offsets into the window) a window that joins stretches of the audio
        is cut and decoded again as parts, when its first decode cannot be kept whole:
        - all of them when its text compresses like a repetition loop: several stretches of
          speech may well say the same thing (a phrase said again after a pause, a drill, a
          chorus), which no temperature fallback can tell from a loop, and the sampled retries
          drop repeats;
        - else those a segment runs across, from the speech before a left-out pause to the
          speech after it: Whisper writes a sentence said again after a short pause as one
          sentence as often as not (copies of one recording above all), and a segment over a
          join is how that shows; speech of one turn on both sides of a long pause is rare.
        Each part then decodes on its own (and is cut again if it must be); a stretch that
        still repeats itself goes to the temperature fallback."""
        chunk, parsed, ratio = piece.chunk, piece.parsed, options.thresholds.compression_ratio
        if (not chunk.joins or piece.params is None or piece.figures.temperature != 0 or parsed.failure is not None
                or is_silent(piece.figures, options.thresholds)):
            return []
        joins = chunk.join_offsets
        if ratio is not None and piece.figures.compression_ratio > ratio:
            return joins
        rate, margin = chunk.sample_rate, chunk.join_margin
        return [j for j in joins if any(s.end is not None and s.start * rate < j - margin and j + margin < s.end * rate
                                        for s in parsed.segments)]

    async def _decode_parts(self, window: AudioChunk, cuts: list[int], first: ChunkOutcome,
                            options: TranscriptionOptions, previous_text: str | None) -> WindowOutcome:
        """The window decoded as the parts ``cuts`` make, each a window of its own (with its
        seek, its cuts and its fallback), their pieces in time order. The window's language
        detection stays its whole decode's."""
        parts = await asyncio.gather(*(self._decode_window(part, options, previous_text)
                                       for part in window.split(cuts)))
        pieces = [piece for part in parts for piece in part.pieces]
        pieces[0].language_probs = first.language_probs
        return WindowOutcome(window, pieces)

    async def _resume_point(self, piece: ChunkOutcome, options: TranscriptionOptions) -> int | None:
        """Where speech in the piece's audio goes on past its text (samples into the piece),
        or None. Two signs: the decode ended on an opening timestamp (the
        model's own sign), or the VAD hears speech after the last segment's end. Both need
        timestamps: without them nothing says where the text stopped."""
        parsed, chunk = piece.parsed, piece.chunk
        if (not options.timestamps or piece.params is None or parsed.failure is not None
                or is_silent(piece.figures, options.thresholds)):
            return None
        if parsed.segments and parsed.segments[-1].end is None:
            return None  # the text runs to the end of the audio (cut by the token budget)
        if parsed.continues_at is not None:
            resume = parsed.continues_at
        else:
            resume = await self._uncovered_speech(chunk, parsed.segments[-1].end if parsed.segments else 0.0, options)
        if resume is None or resume < SEEK_MIN_PROGRESS_S or chunk.duration - resume < SEEK_MIN_REST_S:
            return None
        return round(resume * chunk.sample_rate)

    async def _uncovered_speech(self, chunk: AudioChunk, covered: float, options: TranscriptionOptions) -> float | None:
        """Where (seconds into ``chunk``) a continuation should start, when the VAD hears at
        least UNCOVERED_SPEECH_S of speech after ``covered``; None otherwise."""
        if self.gate is None or not options.vad_filter:
            return None
        rate = chunk.sample_rate
        offset = round((covered + SEGMENT_END_SLACK_S) * rate)
        if chunk.samples.shape[0] - offset < UNCOVERED_SPEECH_S * rate:
            return None
        # The regions are unpadded: the speech itself is counted.
        regions = await self._gate_work(self.gate.speech_regions, chunk.samples[offset:], options.vad.min_silence_s,
                                        options.vad.threshold)
        if sum(end - start for start, end in regions) < UNCOVERED_SPEECH_S * rate:
            return None
        return max(covered, (offset + regions[0][0]) / rate - SEEK_LEAD_S)

    async def _decode_chunk(self, chunk: AudioChunk, options: TranscriptionOptions, previous_text: str | None,
                            splits: bool = False) -> ChunkOutcome:
        """The chunk's kept decode: the first, or the best of the fallback's when the first
        fails the thresholds. With ``splits``, a decode that the chunk must be cut for (_cuts)
        is returned as it is: the caller decodes the parts."""
        if not await self._hears_speech(chunk, options):
            return self._no_speech_outcome(chunk)
        language = options.language
        if language is None and options.detection == "two-stage":
            language = await two_stage.detect_language(self.engine, self.adapter, chunk, self.params_for(options),
                                                       options.candidate_languages)
        first = await self._decode(chunk, self.params_for(options, language, previous_text), options)
        if (options.temperature > 0 or not options.fallback_temperatures
                or not needs_fallback(first.figures, options.thresholds)
                or (splits and self._cuts(first, options))):
            return first
        return await self._fallback(chunk, first, options, language or first.parsed.language, previous_text)

    async def _fallback(self, chunk: AudioChunk, first: ChunkOutcome, options: TranscriptionOptions,
                        language: str | None, previous_text: str | None) -> ChunkOutcome:
        """Decode again at each fallback temperature and keep the best. Retries keep the first
        decode's prefix: its language goes into the prompt, and the (fixed-language) grammar
        still holds the text to the model's token rules. They run together, as one batch in the
        engine (the encoder output is reused): the kept decode is the same as trying one
        temperature after another, in a fraction of the time."""
        base_seed = FALLBACK_SEED if options.seed is None else options.seed
        retries = [replace(self.params_for(options, language, previous_text), temperature=temperature,
                           seed=base_seed + i + 1, top_k=None, top_p=None, min_p=0.0, beam_size=1)
                   for i, temperature in enumerate(options.fallback_temperatures)]
        attempts = [first] + list(await asyncio.gather(*(self._decode(chunk, p, options) for p in retries)))
        kept = attempts[pick_best([a.figures for a in attempts], options.thresholds)]
        kept.language_probs = first.language_probs  # the detection is the first decode's
        return kept

    async def _decode(self, chunk: AudioChunk, params: DecodeParams, options: TranscriptionOptions) -> ChunkOutcome:
        """One engine decode of the chunk, parsed."""
        stream = self.engine.submit(chunk.samples, params)
        try:
            await stream.collect()
        finally:
            stream.cancel()  # no-op when finished; frees the slot if the caller was cancelled
        return self._outcome(chunk, params, stream.result, options)

    async def _hears_speech(self, chunk: AudioChunk, options: TranscriptionOptions) -> bool:
        if self.gate is None or not options.vad_filter:
            return True
        return await self._gate_work(self.gate.has_speech, chunk.samples, options.vad.threshold)

    @staticmethod
    def _no_speech_outcome(chunk: AudioChunk) -> ChunkOutcome:
        figures = DecodeFigures(temperature=0.0, avg_logprob=0.0, compression_ratio=0.0, no_speech_prob=None,
                                parsed=True, speech_found=False)
        return ChunkOutcome(chunk, None, SequenceResult(finish_reason="no_speech"), {}, ParsedOutput(None, ""), figures)

    def _outcome(self, chunk: AudioChunk, params: DecodeParams, result: SequenceResult,
                options: TranscriptionOptions) -> ChunkOutcome:
        raise_if_failed(result)
        adapter = self.adapter
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
        return ChunkOutcome(chunk, params, result, probs, parsed, figures, words)

    @staticmethod
    def _kept_text(piece: ChunkOutcome, options: TranscriptionOptions) -> str:
        """The piece's text in the result: none for silence or output that did not parse."""
        if piece.parsed.failure is not None or is_silent(piece.figures, options.thresholds):
            return ""
        return piece.parsed.text or ""

    def _kept_texts(self, outcome: WindowOutcome, options: TranscriptionOptions) -> list[tuple[str | None, str]]:
        """(language, text) of each of the window's pieces that holds text in the result."""
        return [(p.parsed.language, text) for p in outcome.pieces if (text := self._kept_text(p, options))]

    def _window_text(self, outcome: WindowOutcome, options: TranscriptionOptions) -> str:
        joined = _TextJoin(self.adapter)
        joined.add(self._kept_texts(outcome, options))
        return joined.text

    def _context_after(self, outcome: WindowOutcome, previous: str | None, options: TranscriptionOptions) -> str | None:
        """The text the next window is conditioned on (condition_on_previous_text)."""
        text = self._window_text(outcome, options)
        if not text:
            return previous
        hot = any(p.figures.temperature > PROMPT_RESET_TEMPERATURE for p in outcome.pieces)
        return None if hot else text

    # ---- the whole request ----
    def _vote(self, outcomes: list[WindowOutcome], options: TranscriptionOptions) -> tuple[str | None, float | None]:
        """The request's language: windows that hold speech vote (all of them when none does)."""
        parsed = [o.head for o in outcomes if o.head.figures.parsed]
        speech = [o for o in parsed if not is_silent(o.figures, options.thresholds)] or parsed
        return vote([(o.language_probs, o.chunk.duration) for o in speech], options.language)

    async def _settled(self, earlier: list[WindowOutcome], outcome: WindowOutcome, options: TranscriptionOptions,
                       audio: np.ndarray, previous_text: str | None) -> WindowOutcome:
        """The window with its language settled from what is known when it is final: the vote
        of this window and the windows before it, never a later one (so its text is final once
        released). A window whose detection is an outlier of that vote is decoded again in the
        vote's language (rebuilt from the request's ``audio``: decoded windows keep no samples)."""
        if options.language is not None or options.detect_language_per_chunk or not earlier:
            return outcome
        language, _ = self._vote(earlier + [outcome], options)
        head = outcome.head
        if is_silent(head.figures, options.thresholds) or not is_outlier(head.parsed.language, head.language_probs,
                                                                         language):
            return outcome
        fixed = replace(options, language=language, detection="fused")
        again = await self._decode_window(outcome.window.rebuilt(audio), fixed, previous_text)
        again.head.language_probs = head.language_probs  # what the window itself heard
        return again.released()

    async def _language_of_silence(self, audio: np.ndarray, options: TranscriptionOptions) -> tuple[str | None, float | None]:
        """The most probable language of audio in which nothing was decoded (the speech gate
        heard no speech): silence is not a failed detection, and clients type the language as a
        string. The model's language probabilities at <|startoftranscript|> over the first
        window: one encoder pass and one decoder step."""
        window = audio[: int(self.adapter.config.max_clip_seconds * self.adapter.config.sample_rate)]
        if not window.size:
            return None, None
        fused = self.params_for(replace(options, language=None, word_timestamps=False, beam_size=1, temperature=0.0))
        return await two_stage.most_probable_language(self.engine, self.adapter, window, fused,
                                                      options.candidate_languages)

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
        pieces = [w for s in parsed.segments for w in self.adapter.split_words(s.token_ids, parsed.language)]
        text_logprobs = [result.logprobs[j] for j in text_rows]
        timed = word_times(pieces, text_logprobs, np.concatenate([rows, end_row], axis=1), chunk.duration)
        return [replace(w, word=w.word.strip()) for w in timed if w.word.strip()]

    def _token_logprobs(self, outcome: ChunkOutcome) -> list[TokenLogprob]:
        """The kept decode's text tokens (not its prefix, timestamps or end) with their logprobs."""
        result, eot = outcome.result, outcome.params.eot_id
        spelled = []
        for j in range(outcome.parsed.prefix_length, len(result.token_ids)):
            token = result.token_ids[j]
            if token < eot:
                raw = self.adapter.token_bytes(token)
                spelled.append(TokenLogprob(raw.decode("utf-8", errors="replace"), result.logprobs[j], list(raw)))
        return spelled

    def _assemble(self, windows: list[WindowOutcome], options: TranscriptionOptions, duration: float,
                  speech: list[tuple[int, int]] | None) -> TranscriptionResult:
        adapter = self.adapter
        segments: list[Segment] = []
        words: list[Word] = []
        logprobs: list[TokenLogprob] = []
        joined = _TextJoin(adapter)
        failures: list[str] = []
        outcomes = [piece for window in windows for piece in window.pieces]
        for outcome in outcomes:
            chunk, parsed, figures = outcome.chunk, outcome.parsed, outcome.figures
            if parsed.failure is not None:
                failures.append(f"chunk at {chunk.start:.2f}s: {parsed.failure}")
                continue
            if is_silent(figures, options.thresholds):
                continue  # no speech: no invented text
            for s in parsed.segments:
                # Whisper may time an end inside the window's zero padding: the audio ends earlier.
                end = chunk.source_seconds(min(s.end, chunk.duration), closing=True) if s.end is not None else chunk.end
                start = min(chunk.source_seconds(s.start or 0.0), end)
                segments.append(Segment(
                    id=len(segments), seek=chunk.start_sample // HOP_LENGTH, start=round(start, 3),
                    end=round(max(end, start), 3), text=s.text, tokens=s.token_ids,
                    temperature=figures.temperature, avg_logprob=figures.avg_logprob,
                    compression_ratio=compression_ratio(s.text), no_speech_prob=figures.no_speech_prob,
                    language=parsed.language,
                ))
            joined.add([(parsed.language, parsed.text)] if parsed.text else [])
            if options.token_logprobs:
                logprobs += self._token_logprobs(outcome)
            if options.word_timestamps:
                for w in outcome.words:
                    start, end = chunk.source_span(w.start, w.end)
                    words.append(replace(w, start=round(start, 2), end=round(end, 2)))

        if words and speech:
            rate = self.adapter.config.sample_rate
            words = snap_to_speech_onsets(words, [(start / rate, end / rate) for start, end in speech])
        language, probability = self._vote(windows, options)
        return TranscriptionResult(
            task=options.task, text=joined.text, language=language, language_probability=probability,
            duration=round(duration, 3), segments=segments, words=words if options.word_timestamps else None,
            detection_failure="; ".join(failures) if failures else None,
            prompt_tokens=sum(len(o.params.prompt_ids) for o in outcomes if o.params is not None),
            output_tokens=sum(len(o.result.token_ids) for o in outcomes if o.params is not None),
            finish_reason="length" if any(o.result.finish_reason == "length" for o in outcomes) else "stop",
            logprobs=logprobs if options.token_logprobs else None,
        )


def _retrieve(task: asyncio.Future) -> None:
    """Mark an abandoned decode's failure as seen (it was cancelled, or its request failed)."""
    if not task.cancelled():
        task.exception()
