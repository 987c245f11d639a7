"""The request pipeline: audio -> chunks -> adapter prompts -> engine -> adapter parsing -> result.

One decode for every caller. ``Transcriber.run`` yields, in window order, each window's
ChunkDone once the window is final, then the assembled result. ``transcribe`` drains it for the
result; the streaming renderer (streaming.py) releases each ChunkDone's text as a delta. The
decode does not know whether anyone reads the events early: a stream is the full response,
released sooner, and the concatenated ChunkDone texts are the result's text by construction
(TextJoin). Each window of a request is submitted as soon as it is planned (a long file's while
the rest of it is still scanned for speech), so they decode concurrently in the engine's batch
(one after another when each is conditioned on the text before it); results keep their true
time offsets. Each window's decodes carry the time it was planned as their priority in the
engine (engine.params.Priority; a realtime session's are live, ahead of all file work): a
window's continuations and retries go ahead of later windows, so windows end in order; and a long file's first window is short and decodes alone
(FIRST_WINDOW_S), so its first text comes early while the later windows still share the batch.

A window is final once its decode (window_decode.WindowDecode: fallback, seek, cuts) is done
and its language settled: a window whose detection is an outlier of the vote of the windows up
to it is decoded again in the vote's language. That rule looks only backwards, so a window's
text never changes once it is released.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field, replace
from contextlib import aclosing
from typing import AsyncIterator, Callable

import numpy as np

from adapters.base import TranscriptionAdapter

from . import two_stage
from .chunking import AudioChunk, SpeechWindowPacker, split_audio
from .engine.features import HOP_LENGTH
from .engine.interface import Engine
from .engine.params import Priority, UnsupportedDecode
from .fallback import compression_ratio
from .language_vote import is_outlier, vote
from .speech_gate import SpeechGate, SpeechScan
from .transcription_types import (ChunkDone, Draft, Finished, PipelineEvent, Segment, TokenLogprob,
                                  TranscriptionOptions, TranscriptionResult)
from .piece_decode import DecodeParts, decode_params
from .window_decode import WindowDecode
from .window_outcome import ChunkOutcome, TextJoin, WindowOutcome, token_logprobs
from .word_timing import Word, snap_to_speech_onsets

# faster-whisper's rule: context decoded this hot is too unreliable to condition the next chunk.
PROMPT_RESET_TEMPERATURE = 0.5
# The redecode rule of a window decoded again in the language the windows before it voted for.
LANGUAGE_OUTLIER = "language_outlier"

# Audio longer than this many windows opens with a first window of at most FIRST_WINDOW_S
# (cut where the speech pauses), which decodes alone before the rest start: a window's decode
# ends with the batch it is in, so a first window decoded among all the others would end with
# them, near the end of the request. Decoded alone, and short, its text comes within a fraction
# of the request's time; the rest then decode together as before. The cost is one more window
# and the first window's steps unshared.
FIRST_WINDOW_AFTER_WINDOWS = 2
FIRST_WINDOW_S = 10.0


@dataclass(frozen=True)
class WindowPlan:
    """Where a request's audio is decoded: ``windows`` in order, as they are found (a long
    file's VAD scan hands them out block by block, so its first windows decode while the rest is
    scanned), and where the VAD heard speech start and end (sample ranges, no padding; None
    when the gate is off), which the planning extends as it goes: complete once ``windows`` is
    exhausted. For audio of one window only the first speech is known: its scan stops there.
    ``first_alone``: the first window is a short one that decodes before the others start
    (FIRST_WINDOW_S)."""

    windows: AsyncIterator[AudioChunk]
    speech: list[tuple[int, int]] | None
    first_alone: bool = False

    async def all_windows(self) -> list[AudioChunk]:
        """Every window, once all are planned."""
        return [window async for window in self.windows]


async def _listed(windows: list[AudioChunk]) -> AsyncIterator[AudioChunk]:
    for window in windows:
        yield window


@dataclass(frozen=True)
class _PlannedWindow:
    window: AudioChunk
    priority: Priority  # when it was planned, and whether live (engine.params.Priority)
    job: asyncio.Future | None  # -> WindowOutcome; None: started when the text before it is known


@dataclass
class _Schedule:
    """One request's decodes in flight: the windows as planned (then None), the jobs started,
    and the room for more (engine.interface's max_request_windows)."""

    live_since: float | None  # set: a person has watched for this text since then (realtime)
    room: asyncio.Semaphore
    planned: asyncio.Queue[_PlannedWindow | None] = field(default_factory=asyncio.Queue)
    jobs: list[asyncio.Future] = field(default_factory=list)

    def priority(self) -> Priority:
        """A window's place in the engine's queue, as it is planned now."""
        if self.live_since is not None:
            return Priority(self.live_since, live=True)
        return Priority(time.monotonic())

    def cancel(self, planning: asyncio.Future) -> None:
        """No planning or decode of this request runs on."""
        for job in (planning, *self.jobs):
            job.cancel()
            job.add_done_callback(_retrieve)


class Transcriber:
    def __init__(self, engine: Engine, adapter: TranscriptionAdapter, gate: SpeechGate | None = None):
        self.engine = engine
        self.adapter = adapter
        self.gate = gate
        self.parts = DecodeParts(engine, adapter, gate)

    # ---- the two ways in ----
    async def transcribe(self, audio: np.ndarray, options: TranscriptionOptions = TranscriptionOptions(),
                         on_chunk_done: Callable[[AudioChunk], None] | None = None,
                         live_since: float | None = None) -> TranscriptionResult:
        async with aclosing(self.run(audio, options, on_chunk_done=on_chunk_done, live_since=live_since)) as events:
            async for event in events:
                if isinstance(event, Finished):
                    return event.result
        raise RuntimeError("the pipeline ended without a result")

    async def run(self, audio: np.ndarray, options: TranscriptionOptions,
                  on_chunk_done: Callable[[AudioChunk], None] | None = None,
                  live_since: float | None = None) -> AsyncIterator[PipelineEvent]:
        """The events of one request, in window order (see the module docstring). Closing the
        generator early cancels every decode still running. ``live_since``: someone has watched
        for this text since that time.monotonic() (a realtime session): its windows go in the
        engine's live lane, ahead of all file work, and there the longest wait goes first."""
        options = self._for_model(options)
        plan = await self.plan(audio, options)
        schedule = _Schedule(live_since, asyncio.Semaphore(self.engine.max_request_windows))
        planning = asyncio.ensure_future(self._start_windows(plan, options, schedule, on_chunk_done))
        outcomes: list[WindowOutcome] = []
        joined = TextJoin(self.adapter)
        previous: str | None = None
        try:
            while (item := await schedule.planned.get()) is not None:
                job = item.job
                if job is None:  # each window needs the text before it: one at a time
                    job = self._start(item.window, options, previous, item.priority, on_chunk_done)
                    schedule.jobs.append(job)
                outcome = await self._settled(outcomes, await job, options, audio, previous, item.priority)
                outcomes.append(outcome)
                kept = [p for p in outcome.pieces if p.params is not None]
                yield ChunkDone(len(outcomes) - 1, joined.add(outcome.kept_texts()),
                                sum(len(p.params.prompt_ids) for p in kept), sum(len(p.result.token_ids) for p in kept))
                previous = self._context_after(outcome, previous, options)
            await planning  # a planning failure is the request's
            yield Finished(await self._result(outcomes, options, audio, plan))
        finally:  # finished, failed or abandoned: no planning or decode of this request runs on
            schedule.cancel(planning)

    async def _start_windows(self, plan: WindowPlan, options: TranscriptionOptions, schedule: _Schedule,
                             on_chunk_done: Callable[[AudioChunk], None] | None) -> None:
        """Put the windows in ``schedule.planned`` in order as they are planned, then None. Each
        window's decode starts as soon as it is planned (after the first one's end, when that one
        decodes alone), unless it needs the text before it (conditioned); at most
        max_request_windows decode at once, and planning waits for room (engine.interface)."""
        try:
            async for window in plan.windows:
                if options.condition_on_previous_text:  # started by run(), once the text before it is known
                    schedule.planned.put_nowait(_PlannedWindow(window, schedule.priority(), None))
                    continue
                await schedule.room.acquire()
                if schedule.jobs and plan.first_alone:
                    await asyncio.wait({schedule.jobs[0]})
                priority = schedule.priority()
                job = self._start(window, options, None, priority, on_chunk_done)
                job.add_done_callback(lambda _: schedule.room.release())
                schedule.jobs.append(job)
                schedule.planned.put_nowait(_PlannedWindow(window, priority, job))
        finally:
            schedule.planned.put_nowait(None)

    async def _result(self, outcomes: list[WindowOutcome], options: TranscriptionOptions, audio: np.ndarray,
                      plan: WindowPlan) -> TranscriptionResult:
        """The request's result from its windows' outcomes; audio with no speech still gets the
        language it most probably is, where the request wants one."""
        result = self._assemble(outcomes, options, audio.shape[0] / self.adapter.config.sample_rate, plan.speech)
        if result.language is None and result.detection_failure is None and options.name_language_of_silence:
            result.language, result.language_probability = await self._language_of_silence(audio, options)
        return result

    def refusal(self, options: TranscriptionOptions) -> UnsupportedDecode | None:
        """Why the engine cannot decode what ``options`` ask for. Checked before any work, so
        the caller gets a 400 instead of a failure mid-request."""
        if options.condition_on_previous_text and not self.engine.carries_prompt_text:
            return UnsupportedDecode("condition_on_previous_text puts the previous window's text in the next "
                                     "window's prompt, and this server's engine cannot carry text before "
                                     "<|startoftranscript|> (with SGLang: install the asr_whisper_prompt plugin, "
                                     "docs/scaling-out.md)", "condition_on_previous_text")
        return self.engine.refusal(decode_params(self.adapter, self._for_model(options)))

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
            onset = await self.parts.gate_work(self.gate.speech_start, audio, vad.threshold)
            if onset is None:
                return WindowPlan(_listed([AudioChunk(0, audio, rate)]), [])
            start = max(0, onset - pad)
            return WindowPlan(_listed([AudioChunk(start, audio[start:], rate)]), [(onset, audio.shape[0])])
        # Windows join speech across long pauses only where the seek decodes again what a
        # window's decode leaves out (it needs timestamps; a window can then be decoded again in
        # parts: _cuts), and not for code-switching audio (each window detects its own
        # language: the one it opens with).
        joins = options.timestamps and not options.detect_language_per_chunk
        first_alone = audio.shape[0] > FIRST_WINDOW_AFTER_WINDOWS * cfg.max_clip_seconds * rate
        packer = SpeechWindowPacker(audio, rate, cfg.max_clip_seconds, vad.pad_s, vad.long_pause_s, vad.kept_pause_s,
                                    join_long_pauses=joins, first_seconds=FIRST_WINDOW_S if first_alone else None)
        speech: list[tuple[int, int]] = []
        return WindowPlan(self._scanned_windows(SpeechScan(self.gate, audio, vad.min_silence_s, vad.threshold),
                                                packer, speech), speech, first_alone)

    async def _scanned_windows(self, scan: SpeechScan, packer: SpeechWindowPacker,
                               speech: list[tuple[int, int]]) -> AsyncIterator[AudioChunk]:
        """A long file's windows (chunking.speech_windows), each handed out as soon as the scan
        has heard enough to know it will not change; ``speech`` grows with the regions found."""
        while await self.parts.gate_work(scan.scan_block):
            speech += (await self.parts.gate_work(scan.regions))[len(speech):]
            for window in packer.finish(speech) if scan.done else packer.windows_final(speech):
                yield window

    # ---- one chunk ----
    def _start(self, chunk: AudioChunk, options: TranscriptionOptions, previous_text: str | None, priority: Priority,
               on_chunk_done: Callable[[AudioChunk], None] | None) -> asyncio.Future:
        """The window's decode, started: a future of its WindowOutcome."""
        async def work() -> WindowOutcome:
            outcome = await WindowDecode(self.parts, options, previous_text, priority).run(chunk)
            if on_chunk_done:
                on_chunk_done(chunk)
            return outcome.released()

        return asyncio.ensure_future(work())

    def _context_after(self, outcome: WindowOutcome, previous: str | None, options: TranscriptionOptions) -> str | None:
        """The text the next window is conditioned on (condition_on_previous_text): none after a
        window decoded hot, or one where the decode skipped speech (it may skip it again)."""
        text = TextJoin(self.adapter).add(outcome.kept_texts())
        if not text:
            return previous
        hot = any(p.figures.temperature > PROMPT_RESET_TEMPERATURE for p in outcome.pieces)
        return None if hot or outcome.found_skipped_speech else text

    # ---- the whole request ----
    def _vote(self, outcomes: list[WindowOutcome], options: TranscriptionOptions) -> tuple[str | None, float | None]:
        """The request's language: windows that hold speech vote (all of them when none does)."""
        parsed = [o.head for o in outcomes if o.head.figures.parsed]
        speech = [o for o in parsed if not o.silent] or parsed
        return vote([(o.language_probs, o.chunk.duration) for o in speech], options.language)

    async def _settled(self, earlier: list[WindowOutcome], outcome: WindowOutcome, options: TranscriptionOptions,
                       audio: np.ndarray, previous_text: str | None, priority: Priority) -> WindowOutcome:
        """The window with its language settled from what is known when it is final: the vote
        of this window and the windows before it, never a later one (so its text is final once
        released). A window whose detection is an outlier of that vote is decoded again in the
        vote's language (rebuilt from the request's ``audio``: decoded windows keep no samples)."""
        if options.language is not None or options.detect_language_per_chunk or not earlier:
            return outcome
        language, _ = self._vote(earlier + [outcome], options)
        head = outcome.head
        if head.silent or not is_outlier(head.parsed.language, head.language_probs, language):
            return outcome
        fixed = replace(options, language=language, detection="fused")
        again = await WindowDecode(self.parts, fixed, previous_text, priority).run(outcome.window.rebuilt(audio))
        again.head.language_probs = head.language_probs  # what the window itself heard
        again.redecodes = [*outcome.redecodes, LANGUAGE_OUTLIER, *again.redecodes]
        return again.released()

    async def _language_of_silence(self, audio: np.ndarray, options: TranscriptionOptions) -> tuple[str | None, float | None]:
        """The most probable language of audio in which nothing was decoded (the speech gate
        heard no speech): silence is not a failed detection, and clients type the language as a
        string. The model's language probabilities at <|startoftranscript|> over the first
        window: one encoder pass and one decoder step."""
        window = audio[: int(self.adapter.config.max_clip_seconds * self.adapter.config.sample_rate)]
        if not window.size:
            return None, None
        fused = decode_params(self.adapter, replace(options, language=None, word_timestamps=False, beam_size=1,
                                                    temperature=0.0))
        return await two_stage.most_probable_language(self.engine, self.adapter, window, fused,
                                                      options.candidate_languages)

    def _assemble(self, windows: list[WindowOutcome], options: TranscriptionOptions, duration: float,
                  speech: list[tuple[int, int]] | None) -> TranscriptionResult:
        adapter = self.adapter
        segments: list[Segment] = []
        words: list[Word] = []
        logprobs: list[TokenLogprob] = []
        joined = TextJoin(adapter)
        failures: list[str] = []
        outcomes = [piece for window in windows for piece in window.pieces]
        for outcome in outcomes:
            chunk, parsed, figures = outcome.chunk, outcome.parsed, outcome.figures
            if parsed.failure is not None:
                failures.append(f"chunk at {chunk.start:.2f}s: {parsed.failure}")
                continue
            if outcome.silent:
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
                logprobs += token_logprobs(adapter, outcome)
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
            redecodes=dict(collections.Counter(rule for window in windows for rule in window.redecodes)),
            draft=self._draft(outcomes),
        )

    def _draft(self, outcomes: list[ChunkOutcome]) -> Draft | None:
        """What a decode of this audio grown longer may check (TranscriptionOptions.draft): the
        generated tokens of the audio's one piece, where it was a greedy decode that parsed, in a
        language it names."""
        if len(outcomes) != 1:
            return None
        [piece] = outcomes
        params, parsed = piece.params, piece.parsed
        if params is None or piece.silent or parsed.failure is not None or parsed.language is None:
            return None
        if params.beam_size > 1 or params.temperature:
            return None
        return Draft(parsed.language, params.timed, self.adapter.draft_body(params, piece.result.token_ids))


def _retrieve(task: asyncio.Future) -> None:
    """Mark an abandoned decode's failure as seen (it was cancelled, or its request failed)."""
    if not task.cancelled():
        task.exception()
