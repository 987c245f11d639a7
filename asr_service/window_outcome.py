"""What one window's decode ends as: its pieces (ChunkOutcome) and the window's outcome
(WindowOutcome), with the names of the rules that decoded parts of it again; how kept pieces
join into text (TextJoin); a kept decode's token log-probabilities.

window_decode.WindowDecode makes them; transcription.Transcriber assembles the response and the
stream from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from adapters.base import ParsedOutput, TranscriptionAdapter
from adapters.decode_request import DecodeParams

from .chunking import AudioChunk
from .engine.params import SequenceResult
from .fallback import DecodeFigures
from .transcription_types import TokenLogprob
from .word_timing import Word

# The window-level rules that decode part of a window again (window_decode.WindowDecode).
REPEATS_ACROSS_PAUSES = "repeats_across_pauses"  # cut at every left-out pause: the text compresses like a loop
SEGMENT_ACROSS_PAUSE = "segment_across_pause"  # cut where a segment runs over a left-out pause
REPEATS_AT_PAUSES = "repeats_at_pauses"  # cut at a pause the VAD hears: a sure decode that repeats itself
OPEN_TIMESTAMP = "open_timestamp"  # continued: the decode ended on a segment's opening timestamp
SPEECH_AFTER_TEXT = "speech_after_text"  # continued: the VAD hears speech after the last segment
EVERY_TEMPERATURE_FAILS = "every_temperature_fails"  # cut at a pause: no decode passed the thresholds
THIN_SEGMENT = "thin_segment"  # cut at a pause under a segment too thin for its speech (speech_coverage)
# The rules that find a decode skipped speech it heard, most often speech that says again what
# the text before it says: the window after one is not conditioned on its text either.
COVERAGE_RULES = frozenset({REPEATS_ACROSS_PAUSES, REPEATS_AT_PAUSES, EVERY_TEMPERATURE_FAILS, THIN_SEGMENT})


@dataclass
class ChunkOutcome:
    """One chunk's kept decode, parsed, with the figures the fallback policy judged it by and
    whether it holds no speech (``silent``: then it keeps no text)."""

    chunk: AudioChunk
    params: DecodeParams | None  # None: the speech gate heard no speech, nothing was decoded
    result: SequenceResult
    language_probs: dict[str, float]
    parsed: ParsedOutput
    figures: DecodeFigures
    silent: bool
    words: list[Word] = field(default_factory=list)  # with word_timestamps: timed within the chunk
    # The fallback rule (fallback.rejection) the chunk's first decode failed: this is the best
    # of the decodes tried after it (possibly the first again). None: the first decode passed.
    rejected_by: str | None = None

    @property
    def kept_text(self) -> str:
        """The piece's text in the result: none for silence or output that did not parse."""
        if self.parsed.failure is not None or self.silent:
            return ""
        return self.parsed.text or ""


@dataclass
class WindowOutcome:
    """A window's decode, then its continuations (seek) when the decode stopped before the
    speech in the window ended: pieces in time order, each over the audio from its start on."""

    window: AudioChunk
    pieces: list[ChunkOutcome]
    # Why parts of the window were decoded again, one rule name each time (a piece's fallback,
    # a cut, a continuation, a language outlier): what the metrics count.
    redecodes: list[str] = field(default_factory=list)

    @property
    def head(self) -> ChunkOutcome:
        """The decode of the whole window: its language detection is the window's."""
        return self.pieces[0]

    def kept_texts(self) -> list[tuple[str | None, str]]:
        """(language, text) of each piece that holds text in the result."""
        return [(p.parsed.language, p.kept_text) for p in self.pieces if p.kept_text]

    @property
    def found_skipped_speech(self) -> bool:
        """A coverage rule (COVERAGE_RULES) decoded part of the window again."""
        return any(rule in COVERAGE_RULES for rule in self.redecodes)

    def released(self) -> WindowOutcome:
        """The decoded window as kept until the response is assembled: the maps of the window
        and its pieces, without their samples (AudioChunk.released)."""
        return WindowOutcome(self.window.released(), [replace(p, chunk=p.chunk.released()) for p in self.pieces],
                             self.redecodes)


class TextJoin:
    """Text built piece by piece in time order, the one way the response and the stream both
    give it: a piece's text follows the one before it with its language's joiner (none in
    languages written without spaces), or a space when the two languages differ."""

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


def token_logprobs(adapter: TranscriptionAdapter, outcome: ChunkOutcome) -> list[TokenLogprob]:
    """The kept decode's text tokens (not its prefix, timestamps or end) with their logprobs."""
    result, eot = outcome.result, outcome.params.eot_id
    spelled = []
    for j in range(outcome.parsed.prefix_length, len(result.token_ids)):
        token = result.token_ids[j]
        if token < eot:
            raw = adapter.token_bytes(token)
            spelled.append(TokenLogprob(raw.decode("utf-8", errors="replace"), result.logprobs[j], list(raw)))
    return spelled
