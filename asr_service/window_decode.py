"""One window's decode: which pieces of the window are decoded (the seek, the cuts) and how
their outcomes make the window's.

A WindowDecode is made for one window of a request (transcription.Transcriber plans the
windows and assembles the result). Its ``run`` gives the window's final WindowOutcome:
- the decode of the window under the request's prompt, judged by the fallback policy and
  decoded again hotter when it fails the thresholds (piece_decode.PieceDecode: one piece's
  decode, its parse and its words);
- continued where its text stopped before the speech in it ended (the seek);
- cut and decoded again in parts where it could not be kept whole across the long pauses the
  window leaves out, or repeats itself (cuts);
- cut at a pause and decoded again in parts where its text cannot account for the speech under
  it (a thin segment, speech_coverage) or no temperature of the fallback passed the thresholds.
Every engine decode of the window carries the window's ``priority`` (engine.params.Priority): its
continuations and retries are admitted ahead of later windows, so a request's windows end
in order and a stream's first text comes early.

Whether a piece is silent, and so what text it keeps, is decided once, when its decode is
parsed (ChunkOutcome.silent / kept_text). Each time part of the window is decoded again, the
outcome names the rule that asked for it (WindowOutcome.redecodes; the rules are named in
window_outcome.py and fallback.py), and the debug log says so with the figures that decided it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from .chunking import AudioChunk
from .engine.params import Priority
from .fallback import rejection
from .piece_decode import DecodeParts, PieceDecode
from .speech_coverage import DecodedSpan, may_be_thin, pause_near, paces, thin_spans
from .transcription_types import TranscriptionOptions
from .window_outcome import (EVERY_TEMPERATURE_FAILS, OPEN_TIMESTAMP, REPEATS_ACROSS_PAUSES, REPEATS_AT_PAUSES,
                             SEGMENT_ACROSS_PAUSE, SPEECH_AFTER_TEXT, THIN_SEGMENT, ChunkOutcome, TextJoin,
                             WindowOutcome)

log = logging.getLogger(__name__)

# The seek: a window whose decode stopped before its speech ended is decoded again from there.
MAX_CONTINUATIONS = 3  # per window; each must make progress, so a loop cannot run on
SEEK_MIN_PROGRESS_S = 1.0  # a continuation starts at least this far into the audio before it
SEEK_MIN_REST_S = 0.5  # and has at least this much audio to decode
SEGMENT_END_SLACK_S = 0.5  # Whisper often times a segment's end a little before the speech ends
UNCOVERED_SPEECH_S = 0.4  # this much speech heard after the last segment: the decode missed some
# Whisper's timestamps drift over a window, so a segment's end may come a second before its last
# word does: speech already going on at that end (within SPEECH_ONGOING_S) that stops within
# SEGMENT_TAIL_S of it is taken for the segment's own tail, not speech the decode missed.
SPEECH_ONGOING_S = 0.1
SEGMENT_TAIL_S = 1.5
SEEK_LEAD_S = 0.4  # a continuation starts this far before the speech it is for
# Cuts at a window's own pauses (_cuts): a pause this long, parts at least this long.
PAUSE_CUT_MIN_SILENCE_S = 0.3
MIN_PART_S = 2.0


class WindowDecode:
    """The decode of one window under ``options``, conditioned on ``previous_text`` (the text
    before the window, when the request conditions on it); ``priority``: see the module."""

    def __init__(self, parts: DecodeParts, options: TranscriptionOptions, previous_text: str | None, priority: Priority,
                 parts_when_all_fail: bool = True, pace_reference: tuple[float, ...] = ()):
        self.parts = parts
        self.engine, self.adapter, self.gate = parts.engine, parts.adapter, parts.gate
        self.options = options
        self.previous_text = previous_text
        self.priority = priority
        # EVERY_TEMPERATURE_FAILS cuts once: on audio no decode is sure of (noise, a language
        # the model barely knows) halves of halves would multiply the fallback's work.
        self.parts_when_all_fail = parts_when_all_fail
        # The voice's pace (speech_coverage.paces) in the decodes of the windows this one was
        # cut from: a part of a few segments is judged thin against them too.
        self.pace_reference = pace_reference
        self._speech: dict[tuple[int, int], list[tuple[int, int]]] = {}  # _regions, by chunk
        self.pieces = PieceDecode(parts, options, priority)

    async def run(self, window: AudioChunk) -> WindowOutcome:
        """The window's final outcome: decoded and judged by the fallback, continued (seek) while
        a piece stopped before the speech in it ended, or cut and decoded in parts: where its
        first decode cannot be kept whole across its pauses (_cuts), where no temperature passed
        the thresholds (_cut_when_all_fail), or where a segment is thin for the speech under it
        (_thin_cut)."""
        first, language = await self.pieces.first_decode(window, self.options, self.previous_text)
        options = replace(self.options, draft=None)  # a draft says what the window's start holds
        cuts, rule = await self._cuts(first)
        if cuts:
            log.debug("window at %.2f s cut at %d pauses (%s): %s", window.start, len(cuts), rule, first.figures)
            # Parts cut at the window's own pauses repeat what it says: decoded without the text
            # before them, which would let Whisper skip a sentence it has just written.
            context = None if rule == REPEATS_AT_PAUSES else self.previous_text
            return await self._parts(window, cuts, first, rule, context)
        head = await self.pieces.judged(first, language, self.options, self.previous_text)
        cut = await self._cut_when_all_fail(head)
        if cut is not None:
            log.debug("window at %.2f s cut at %.2f s (%s): %s", window.start, cut / window.sample_rate,
                      EVERY_TEMPERATURE_FAILS, head.figures)
            return await self._parts(window, [cut], first, EVERY_TEMPERATURE_FAILS, None, _rejections(head))
        outcome = await self._continued(WindowOutcome(window, [head], _rejections(head)), options)
        cut = await self._thin_cut(outcome)
        if cut is not None:
            # Decoded without the text before: what the kept decode skipped is often what that
            # text already says.
            return await self._parts(window, [cut], first, THIN_SEGMENT, None, outcome.redecodes)
        return outcome

    # ---- cuts: a window that joins stretches of speech, decoded again in parts ----
    async def _cuts(self, piece: ChunkOutcome) -> tuple[list[int], str | None]:
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
        - in a window that leaves no pause out, whose text compresses like a loop although the
          model is sure of it (its average log-probability passes): at the pause the VAD hears
          nearest its middle (_pause_near). A sure decode that repeats itself is
          most often speech that repeats (the sampled retries would write something else, and
          drop the repeats); a part that still repeats is cut again, down to MIN_PART_S. It
          takes the fallback's place, so not where the fallback is off.
        Each part then decodes on its own (and is cut again if it must be); a stretch that
        still repeats itself goes to the temperature fallback. Returns the cuts and the rule
        that made them."""
        chunk, parsed, ratio = piece.chunk, piece.parsed, self.options.thresholds.compression_ratio
        if piece.params is None or piece.figures.temperature != 0 or parsed.failure is not None or piece.silent:
            return [], None
        joins = chunk.join_offsets
        repeats = ratio is not None and piece.figures.compression_ratio > ratio
        if repeats and joins:
            return joins, REPEATS_ACROSS_PAUSES
        if repeats:
            thresholds = self.options.thresholds
            sure = thresholds.log_prob is None or piece.figures.avg_logprob >= thresholds.log_prob
            # In place of the fallback: not for a decode asked to be taken as it is.
            cut = await self._pause_near(chunk) if sure and self.options.fallback_temperatures else None
            return ([cut], REPEATS_AT_PAUSES) if cut is not None else ([], None)
        rate, margin = chunk.sample_rate, chunk.join_margin
        across = [j for j in joins if any(s.end is not None and s.start * rate < j - margin and j + margin < s.end * rate
                                          for s in parsed.segments)]
        return across, SEGMENT_ACROSS_PAUSE if across else None

    async def _parts(self, window: AudioChunk, cuts: list[int], first: ChunkOutcome, rule: str,
                     previous_text: str | None, redecoded: tuple[str, ...] | list[str] = ()) -> WindowOutcome:
        """The window decoded as the parts ``cuts`` make, each a window of its own (with its
        seek, its cuts and its fallback), their pieces in time order. The window's language
        detection stays its whole decode's. ``redecoded``: the window's redecodes before the cut."""
        again = self.parts_when_all_fail and rule != EVERY_TEMPERATURE_FAILS
        regions = await self._regions(window)
        pace = self.pace_reference + tuple(paces([DecodedSpan(0, first.parsed, window.length)], regions or [],
                                                 window.sample_rate))
        parts = await asyncio.gather(*(WindowDecode(self.parts, replace(self.options, draft=None), previous_text,
                                                     self.priority, again, pace).run(part) for part in window.split(cuts)))
        pieces = [piece for part in parts for piece in part.pieces]
        pieces[0].language_probs = first.language_probs
        return WindowOutcome(window, pieces, [*redecoded, rule, *(r for part in parts for r in part.redecodes)])

    async def _cut_when_all_fail(self, head: ChunkOutcome) -> int | None:
        """Where (samples into the window) a window whose decode failed the thresholds at every
        temperature of the fallback is cut: rather than keep the best sampled guess (often words
        placed over speech they do not say), the halves at the pause nearest the middle are
        decoded again on their own. None where no pause leaves MIN_PART_S on each side, and
        where the request asked for the decode as it is (no fallback)."""
        if head.rejected_by is None or head.kept_text == "" or not self.parts_when_all_fail:
            return None
        if rejection(head.figures, self.options.thresholds) is None:
            return None
        return await self._pause_near(head.chunk)

    async def _thin_cut(self, outcome: WindowOutcome) -> int | None:
        """Where (samples into the window) a window with a thin segment (speech_coverage) is cut:
        the pause under the segment nearest its middle. None where no segment is thin, where no
        pause under one leaves MIN_PART_S on each side, and where the request asked for the
        decode as it is (no fallback)."""
        window = outcome.window
        if not self.options.fallback_temperatures or not outcome.kept_texts():
            return None
        decodes = [DecodedSpan(window.length - p.chunk.length, p.parsed, p.chunk.length) for p in outcome.pieces]
        if not may_be_thin(decodes, window.sample_rate):
            return None
        regions = await self._regions(window)
        for thin in thin_spans(decodes, regions or [], window.sample_rate, self.pace_reference):
            cut = await self._pause_near(window, thin)
            if cut is not None:
                log.debug("window at %.2f s cut at %.2f s (%s): segment at %.2f-%.2f s thin for its speech", window.start,
                          cut / window.sample_rate, THIN_SEGMENT, *(t / window.sample_rate for t in thin))
                return cut
        return None

    async def _regions(self, chunk: AudioChunk) -> list[tuple[int, int]] | None:
        """The chunk's speech as the VAD hears it, with pauses of PAUSE_CUT_MIN_SILENCE_S and
        more between regions (unpadded samples), or None without the speech gate. Scanned once
        per chunk of this decode."""
        if self.gate is None or not self.options.vad_filter:
            return None
        key = (chunk.start_sample, chunk.length)
        if key not in self._speech:
            self._speech[key] = await self.parts.gate_work(self.gate.speech_regions, chunk.samples,
                                                           PAUSE_CUT_MIN_SILENCE_S, self.options.vad.threshold)
        return self._speech[key]

    async def _pause_near(self, chunk: AudioChunk, span: tuple[int, int] | None = None) -> int | None:
        """The middle of the pause (by the VAD) nearest the middle of ``span`` (samples into the
        chunk; default the whole chunk) that lies inside it and leaves at least MIN_PART_S on
        each side of the cut, or None."""
        rate, length = chunk.sample_rate, chunk.length
        if length < 2 * MIN_PART_S * rate:
            return None
        regions = await self._regions(chunk)
        if regions is None:
            return None
        start, end = span or (0, length)
        low, high = max(start, round(MIN_PART_S * rate)), min(end, length - round(MIN_PART_S * rate))
        return pause_near(regions, (start + end) // 2, low, high)

    # ---- the seek ----
    async def _continued(self, outcome: WindowOutcome, options: TranscriptionOptions) -> WindowOutcome:
        """The outcome with its continuations: while a piece stopped before the speech in it
        ended, the rest is decoded again from where its text stopped, in the window's language,
        after the piece before it (at most MAX_CONTINUATIONS)."""
        window = outcome.window
        while len(outcome.pieces) <= MAX_CONTINUATIONS:
            last = outcome.pieces[-1].chunk
            resume, rule = await self._resume_point(outcome.pieces[-1])
            if resume is None:
                break
            log.debug("window at %.2f s continued at %.2f s (%s)", window.start, last.start + resume / last.sample_rate,
                      rule)
            rest = last.tail(resume)
            language = options.language or outcome.head.parsed.language
            shown = TextJoin(self.adapter)
            shown.add(outcome.kept_texts())
            # The window's text so far conditions the continuation (as the sequential algorithm
            # conditions each window on the last): a short rest of audio decoded without it is
            # often misheard.
            context = " ".join(t for t in (self.previous_text or options.previous_text, shown.text) if t) or None
            if not self.engine.carries_prompt_text:
                context = None  # an engine that carries no prompt (SGLang without the plugin): the rest alone
            piece = await self.pieces.piece(rest, replace(options, language=language), context)
            outcome.pieces.append(piece)
            outcome.redecodes += [rule, *_rejections(piece)]
        return outcome

    async def _resume_point(self, piece: ChunkOutcome) -> tuple[int | None, str | None]:
        """Where speech in the piece's audio goes on past its text (samples into the piece),
        or None, and the sign that says so: the decode ended on an opening timestamp (the
        model's own sign), or the VAD hears speech after the last segment's end. Both need
        timestamps: without them nothing says where the text stopped."""
        parsed, chunk = piece.parsed, piece.chunk
        if not self.options.timestamps or piece.params is None or parsed.failure is not None or piece.silent:
            return None, None
        if parsed.segments and parsed.segments[-1].end is None:
            return None, None  # the text runs to the end of the audio (cut by the token budget)
        if parsed.continues_at is not None:
            resume, rule = parsed.continues_at, OPEN_TIMESTAMP
        else:
            resume = await self._uncovered_speech(chunk, parsed.segments[-1].end if parsed.segments else None)
            rule = SPEECH_AFTER_TEXT
        if resume is None or resume < SEEK_MIN_PROGRESS_S or chunk.duration - resume < SEEK_MIN_REST_S:
            return None, None
        return round(resume * chunk.sample_rate), rule

    async def _uncovered_speech(self, chunk: AudioChunk, last_end: float | None) -> float | None:
        """Where (seconds into ``chunk``) a continuation should start, when the VAD hears at
        least UNCOVERED_SPEECH_S of speech after the last segment's end ``last_end`` and its
        slack that is not that segment's own tail (in a chunk with no segment, None: after the
        slack from its start); None otherwise."""
        options = self.options
        if self.gate is None or not options.vad_filter:
            return None
        covered = last_end or 0.0
        rate = chunk.sample_rate
        start, slack = round(covered * rate), round(SEGMENT_END_SLACK_S * rate)
        if chunk.samples.shape[0] - start - slack < UNCOVERED_SPEECH_S * rate:
            return None
        # The regions are unpadded: the speech itself is counted.
        regions = await self.parts.gate_work(self.gate.speech_regions, chunk.samples[start:], options.vad.min_silence_s,
                                             options.vad.threshold)
        if (last_end is not None and regions and regions[0][0] <= SPEECH_ONGOING_S * rate
                and regions[0][1] <= SEGMENT_TAIL_S * rate):
            regions = regions[1:]  # speech going on at the segment's end that soon stops: its own last words
        after = [(max(s, slack), e) for s, e in regions if e > slack]
        if sum(e - s for s, e in after) < UNCOVERED_SPEECH_S * rate:
            return None
        return max(covered, (start + after[0][0]) / rate - SEEK_LEAD_S)

def _rejections(piece: ChunkOutcome) -> list[str]:
    """The fallback rule the piece's first decode failed, as a list of the window's redecodes."""
    return [piece.rejected_by] if piece.rejected_by is not None else []
