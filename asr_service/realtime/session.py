"""A realtime transcription session, free of any wire protocol: 16 kHz audio in, events out.

Audio is cut into utterances: by the client's commits, or by server VAD when the session has
turn detection, or at 30 s (Whisper's window) when speech runs on without a pause. While an
utterance grows, a worker re-decodes all of it every ``partial_interval_s`` of new audio and
sends the text that two consecutive decodes agree on (see stable_text): a preview. Once the
utterance is closed, the decode a file of its audio gets gives the final text, never held to
the preview; its words after the preview's go out as the last delta. So the deltas concatenate
to the final text unless that decode disagrees with words already sent; then the completed
event carries the true text (the page puts it in the preview's place).

Every decode goes through the Transcriber, so the fused language prefix is parsed before any
text is used, windows the speech gate hears nothing in give no text, and cancelling the
worker (a client that went away) frees the engine slots. Every decode is live: the engine
admits it ahead of file work waiting for a slot, and among live work the text a person has
waited longest for first (Utterance.shown_at).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..chunking import split_audio
from ..transcription import Transcriber
from ..transcription_types import Draft, TranscriptionOptions
from .events import (SpeechStarted, SpeechStopped, Committed, Cleared, TextDelta, Completed, Failed, SessionError, SessionEvent)
from .input_audio import InputFormat
from .stable_text import agreed, before_loop, continuation, extension
from ..pcm import SAMPLE_RATE
from .turn_detection import TurnDetectionSettings, TurnDetector

log = logging.getLogger(__name__)

MIN_COMMIT_SECONDS = 0.1  # OpenAI's rule: a commit needs at least 100 ms of audio
MIN_PARTIAL_SECONDS = 0.8  # shorter audio gives too little for a partial decode to agree on
MAX_UTTERANCE_SECONDS = 30.0  # Whisper's window
SPECULATE_AFTER_MS = 100  # a pause this long (or half the VAD's silence, if less) starts the final decode


def partial_token_budget(seconds: float) -> int:
    """Tokens a partial decode may spend: speech runs at most ~12 tokens a second (CJK), so a
    decode that needs more is looping on cut-off audio ("8, 8, 8, ..."): it stops early and is
    not used, instead of holding the worker for seconds."""
    return int(10 + 15 * seconds)


@dataclass(frozen=True)
class SessionConfig:
    language: str | None = None  # None: detected per utterance, in the same decode
    prompt: str | None = None
    input_format: InputFormat = InputFormat()
    turn_detection: TurnDetectionSettings | None = None  # None: the client commits
    # With language None: detection chooses only among these codes (None: among all).
    allowed_languages: tuple[str, ...] | None = None
    # The served model the client's session.update named, if any: the connection's model is
    # chosen when it opens (?model=), so the connection refuses another one.
    model: str | None = None


@dataclass(frozen=True)
class RealtimeLimits:
    max_sessions: int = 8
    idle_timeout_s: float = 60.0  # no audio from the client for this long (nothing left to decode) closes the session
    max_buffer_seconds: float = 300.0  # audio received but not yet transcribed
    max_session_seconds: float = 3600.0  # a session's whole life (OpenAI's sessions end after 60 min too)
    # Re-decode a growing utterance after this much new audio, or when the last decode ends if
    # that takes longer (one worker per session: a preview's text is agreed with the one before).
    # Short, because a word goes out only once two previews agree on it: the sooner the second
    # one, the sooner the word; a preview that checks the last one's tokens (draft) is cheap.
    partial_interval_s: float = 0.3


@dataclass
class Utterance:
    item_id: str
    pieces: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    decoded_samples: int = 0  # audio length at the last partial decode
    previous: tuple[str | None, str] | None = None  # (language, text) of the last partial decode
    draft: Draft | None = None  # the last partial decode's tokens: the next one checks them in one pass
    sent: list[str] = field(default_factory=list)  # units already sent as deltas
    language: str | None = None  # fixed once text has been sent, so later decodes agree with it
    # The final decode started early, during a pause: (where the pause began, the decode).
    speculation: tuple[int, asyncio.Future] | None = None
    # time.monotonic() when the person last saw this utterance's text grow (or when it began):
    # its previews wait in the engine's live queue by this, so the staler text goes first.
    shown_at: float = field(default_factory=time.monotonic)

    def drop_speculation(self) -> None:
        if self.speculation is not None:
            self.speculation[1].cancel()
            self.speculation = None

    def add(self, samples: np.ndarray) -> None:
        if samples.size:
            self.pieces.append(samples)
            self.samples += samples.shape[0]

    def audio(self) -> np.ndarray:
        if len(self.pieces) > 1:
            self.pieces = [np.concatenate(self.pieces)]
        return self.pieces[0] if self.pieces else np.zeros(0, dtype=np.float32)


class RealtimeSession:
    def __init__(self, transcriber: Transcriber, emit: Callable[[SessionEvent], None], file_decode: TranscriptionOptions,
                 limits: RealtimeLimits = RealtimeLimits(), config: SessionConfig = SessionConfig()):
        """``file_decode``: the options a file sent with no options of its own is decoded with
        (request_options.build_options): an utterance's final decode is that decode of its
        audio, with the session's language, allowed languages and prompt."""
        self.transcriber = transcriber
        self.file_decode = file_decode
        self.emit = emit
        self.limits = limits
        self.config = config
        self.input_finished = False  # a final commit came: no more audio
        self._position = 0  # samples received so far: the stream clock
        self._current: Utterance | None = None
        self._closed: deque[Utterance] = deque()  # committed, awaiting their final decode
        self._last_item: str | None = None
        self._recent = np.zeros(0, dtype=np.float32)  # VAD mode: audio kept as prefix padding
        self._detector: TurnDetector | None = None
        self._wake = asyncio.Event()
        self._partial: tuple[Utterance, asyncio.Future] | None = None
        self._ids = (f"item_{uuid.uuid4().hex[:12]}_{i}" for i in itertools.count())
        self.configure(config)

    # ---- client actions ----

    def configure(self, config: SessionConfig) -> None:
        vad_changed = config.turn_detection != self.config.turn_detection or self._detector is None
        self.config = config
        if vad_changed:
            gate = self.transcriber.gate
            if config.turn_detection is not None and gate is None:
                raise ValueError("server VAD needs the speech gate's Silero model, and this server has none")
            self._detector = (TurnDetector(gate.model_copy(), config.turn_detection, self._position)
                              if config.turn_detection is not None else None)

    async def append(self, samples: np.ndarray) -> None:
        if self.input_finished:
            self.emit(SessionError("The input was already finished by a final commit; open a new session",
                                   "input_finished"))
            return
        if self.buffered_seconds + samples.shape[0] / SAMPLE_RATE > self.limits.max_buffer_seconds:
            self.emit(SessionError(f"Audio buffer full: more than {self.limits.max_buffer_seconds:g} s received and "
                                   "not yet transcribed; this frame was dropped. Send audio no faster than real "
                                   "time, or commit", "buffer_full"))
            return
        start = self._position
        self._position += samples.shape[0]
        if self._detector is None:
            self._route(samples, speaking=True)
        else:
            detector = self._detector
            speaking = detector.in_speech  # before these samples; it flips at each boundary
            boundaries = await asyncio.to_thread(detector.feed, samples)
            cursor = start
            for boundary in boundaries:
                cut = min(max(boundary.sample, cursor), self._position)
                self._route(samples[cursor - start : cut - start], speaking)
                cursor = cut
                speaking = boundary.kind == "start"
                if speaking:
                    self._speech_started(boundary.sample)
                else:
                    self._speech_stopped(boundary.sample)
            self._route(samples[cursor - start :], speaking)
            self._speculate()
        self._split_long_utterance()
        self._wake.set()

    def commit(self, final: bool = False) -> None:
        utterance = self._current
        if utterance is None or utterance.samples < MIN_COMMIT_SECONDS * SAMPLE_RATE:
            have = 0 if utterance is None else utterance.samples / SAMPLE_RATE * 1000
            if not (final and (self._closed or self._partial)):  # a final commit after the last turn is fine
                self.emit(SessionError(f"Error committing input audio buffer: at least {MIN_COMMIT_SECONDS * 1000:.0f} "
                                       f"ms of audio is needed, the buffer has {have:.0f} ms",
                                       "input_audio_buffer_commit_empty"))
        else:
            self._close(utterance)
        if final:
            self.input_finished = True

    def reopen(self) -> None:
        """Take audio again after a final commit (vLLM clients reuse one connection for several
        cycles); what the final commit closed is still decoded, in order."""
        self.input_finished = False

    def clear(self) -> None:
        if self._current is not None:
            self._stop_partial(self._current)
            self._current.drop_speculation()
        self._current = None
        self._recent = np.zeros(0, dtype=np.float32)
        self.emit(Cleared())

    @property
    def buffered_seconds(self) -> float:
        pending = sum(u.samples for u in self._closed) + (self._current.samples if self._current else 0)
        return pending / SAMPLE_RATE

    @property
    def idle(self) -> bool:
        """Nothing left to transcribe."""
        return self._current is None and not self._closed and self._partial is None

    # ---- audio routing ----

    def _route(self, samples: np.ndarray, speaking: bool) -> None:
        if not samples.size:
            return
        if self._current is None and speaking:  # no VAD, or speech goes on after a manual commit
            self._current = Utterance(next(self._ids))
        if self._current is not None:
            self._current.add(samples)
        else:  # VAD mode, no speech: keep only what the next turn's prefix padding needs
            keep = int(self.config.turn_detection.prefix_padding_ms * SAMPLE_RATE / 1000)
            self._recent = np.concatenate([self._recent, samples])[-keep:] if keep else self._recent[:0]

    def _speech_started(self, sample: int) -> None:
        if self._current is None:
            self._current = Utterance(next(self._ids))
            self._current.add(self._recent)
            self._recent = np.zeros(0, dtype=np.float32)
        self.emit(SpeechStarted(self._current.item_id, sample * 1000 // SAMPLE_RATE))

    def _speech_stopped(self, sample: int) -> None:
        if self._current is None:
            return
        self.emit(SpeechStopped(self._current.item_id, sample * 1000 // SAMPLE_RATE))
        self._close(self._current)

    def _speculate(self) -> None:
        """Speech paused: start the utterance's final decode now. If the pause turns out to end
        the turn, the text is ready up to silence_duration_ms sooner; if speech resumes first,
        the decode is cancelled. Only silence follows the audio it decodes, so its text is the
        final text."""
        utterance, detector = self._current, self._detector
        if utterance is None or detector is None:
            return
        pause = detector.pause_start
        if utterance.speculation is not None and utterance.speculation[0] != pause:
            utterance.drop_speculation()  # speech resumed after the audio it decodes
        wait = min(SPECULATE_AFTER_MS, self.config.turn_detection.silence_duration_ms // 2) * SAMPLE_RATE // 1000
        if pause is not None and utterance.speculation is None and self._position - pause >= wait:
            # A preview still running goes on: if speech resumes, its text is what the next
            # preview agrees with; if not, it costs a few live rows beside the final decode.
            decode = asyncio.ensure_future(self.transcriber.transcribe(utterance.audio(), self._final_options(),
                                                                       live_since=time.monotonic()))
            utterance.speculation = (pause, decode)

    def _split_long_utterance(self) -> None:
        """Speech with no pause for 30 s: close the first window at its quietest point."""
        utterance = self._current
        if utterance is None or utterance.samples < MAX_UTTERANCE_SECONDS * SAMPLE_RATE:
            return
        utterance.drop_speculation()  # it decoded more than the window that is kept
        audio = utterance.audio()
        first = split_audio(audio, SAMPLE_RATE, MAX_UTTERANCE_SECONDS)[0]
        utterance.pieces, utterance.samples = [first.samples], first.samples.shape[0]
        self._close(utterance)
        self._current = Utterance(next(self._ids))
        self._current.add(audio[first.samples.shape[0]:])

    def _close(self, utterance: Utterance) -> None:
        self._stop_partial(utterance)  # its final decode supersedes it: the final text comes sooner
        self._current = None if self._current is utterance else self._current
        self.emit(Committed(utterance.item_id, self._last_item))
        self._last_item = utterance.item_id
        self._closed.append(utterance)
        self._wake.set()

    def _stop_partial(self, utterance: Utterance) -> None:
        if self._partial is not None and self._partial[0] is utterance:
            self._partial[1].cancel()

    # ---- decoding (one worker per session; cancel it to free the engine) ----

    async def run(self) -> None:
        try:
            await self._work()
        finally:  # the session is over: early final decodes still running are not needed
            for utterance in [self._current, *self._closed]:
                if utterance is not None:
                    utterance.drop_speculation()

    async def _work(self) -> None:
        while True:
            if self._closed:
                await self._finish(self._closed[0])
                self._closed.popleft()
                continue
            utterance = self._current
            if utterance is not None and self._partial_due(utterance):
                task = asyncio.ensure_future(self._decode_partial(utterance))
                self._partial = (utterance, task)
                try:
                    await asyncio.wait({task})  # returns when it ends or is cancelled by a commit
                finally:
                    task.cancel()  # no-op when done; the worker itself was cancelled otherwise
                    self._partial = None
                if not task.cancelled() and task.exception() is not None:  # no deltas this time
                    log.warning("partial decode of %s failed", utterance.item_id, exc_info=task.exception())
                continue
            self._wake.clear()
            await self._wake.wait()

    def _partial_due(self, utterance: Utterance) -> bool:
        if utterance.speculation is not None:  # paused: the final decode is already running
            return False
        if self._detector is not None and self._detector.pause_start is not None:
            # Speech paused: the final decode starts within SPECULATE_AFTER_MS unless speech
            # resumes, and a preview begun now would only hold the engine up ahead of it.
            return False
        new = utterance.samples - utterance.decoded_samples
        return (utterance.samples >= MIN_PARTIAL_SECONDS * SAMPLE_RATE
                and new >= self.limits.partial_interval_s * SAMPLE_RATE)

    def _final_options(self) -> TranscriptionOptions:
        """The final decode's: a file's (beams, timestamps and seek, fallback, thresholds, its
        own language detection), so a loop inside an utterance is caught before its text is
        sent, and the final text never depends on what the previews said."""
        return replace(self.file_decode, language=self.config.language,
                       candidate_languages=self.config.allowed_languages, previous_text=self.config.prompt)

    async def _decode_partial(self, utterance: Utterance) -> None:
        audio = utterance.audio()
        utterance.decoded_samples = audio.shape[0]
        budget = partial_token_budget(audio.shape[0] / SAMPLE_RATE)
        # A preview, greedy and without temperature fallback: a partial that fails is simply not
        # agreed with, and the final decode is the file's. Its encoder reads only the audio there
        # is (where the engine can), a fraction of a whole window's work on the first seconds, and
        # it checks the last preview's tokens in one pass rather than stepping through them.
        options = replace(self._final_options(), language=utterance.language or self.config.language, beam_size=1,
                          fallback_temperatures=(), max_new_tokens=budget, name_language_of_silence=False,
                          audio_sized_encoder=self.transcriber.engine.audio_sized_encoder, draft=utterance.draft)
        result = await self.transcriber.transcribe(audio, options, live_since=utterance.shown_at)
        utterance.draft = result.draft
        if result.detection_failure is not None:
            text = ""
        elif result.finish_reason == "length":  # cut by the budget: looping
            text = before_loop(result.text, self.transcriber.adapter.joiner(result.language))
        else:
            text = result.text
        latest = (result.language, text)
        log.debug("partial decode of %s at %.1f s: %r (used: %r)", utterance.item_id, audio.shape[0] / SAMPLE_RATE,
                  result.text, text)
        if utterance.previous is not None and utterance.previous[0] == latest[0] and latest[1]:
            joiner = self.transcriber.adapter.joiner(latest[0])
            stable = agreed(utterance.previous[1], latest[1], joiner, latest[0])
            delta = extension(utterance.sent, stable, joiner, latest[0])
            if delta:
                utterance.language = latest[0]
                utterance.sent = stable
                utterance.shown_at = time.monotonic()
                self.emit(TextDelta(utterance.item_id, delta))
        utterance.previous = latest

    async def _final_decode(self, utterance: Utterance, audio: np.ndarray):
        if utterance.speculation is not None:
            early = utterance.speculation[1]
            await asyncio.wait({early})  # a cancelled worker raises here; run() cancels the decode
            utterance.speculation = None
            if not early.cancelled() and early.exception() is None:
                return early.result()
        return await self.transcriber.transcribe(audio, self._final_options(), live_since=time.monotonic())

    async def _finish(self, utterance: Utterance) -> None:
        audio = utterance.audio()
        try:
            result = await self._final_decode(utterance, audio)
        except Exception as e:  # the session goes on with the next utterance (cancellation passes through)
            self.emit(Failed(utterance.item_id, f"Transcription failed: {type(e).__name__}: {e}",
                             "transcription_failed"))
            return
        if result.detection_failure is not None and not result.text and not utterance.sent:
            self.emit(Failed(utterance.item_id, f"Language auto-detect failed: {result.detection_failure}",
                             "language_detection_failed"))
            return
        # The final text is the decode's, never held to the previews: where it disagrees with
        # words already sent, the last delta only completes the preview, and the completed
        # event (which the page shows in its place) carries the true text.
        rest = continuation(utterance.sent, result.text, self.transcriber.adapter.joiner(result.language),
                            result.language)
        if rest:
            self.emit(TextDelta(utterance.item_id, rest))
        self.emit(Completed(utterance.item_id, result.text, result.language,
                            seconds=round(audio.shape[0] / SAMPLE_RATE, 3), prompt_tokens=result.prompt_tokens,
                            output_tokens=result.output_tokens, redecodes=result.redecodes))
