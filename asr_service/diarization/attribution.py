"""Speakers given to the transcript: every word goes to the speaker whose turn it overlaps most,
and a segment whose words change speaker is split there, so no segment mixes speakers and no
word is split between them. The split segments keep their share of the tokens and their exact
text (the pieces' own spacing), and the figures of the decode they came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..transcription_types import Segment, TranscriptionResult
from ..word_timing import Word
from .diarizer import SpeakerTurn

SplitWords = Callable[[list[int], str | None], list[tuple[str, int]]]  # the adapter's split_words


def speaker_at(start: float, end: float, turns: list[SpeakerTurn]) -> str:
    """The speaker of the turn overlapping [start, end] most; the nearest turn when none does."""
    best, best_overlap = None, 0.0
    for turn in turns:
        overlap = min(end, turn.end) - max(start, turn.start)
        if overlap > best_overlap:
            best, best_overlap = turn.speaker, overlap
    if best is not None:
        return best
    middle = (start + end) / 2
    return min(turns, key=lambda t: max(t.start - middle, middle - t.end)).speaker


def attribute(result: TranscriptionResult, turns: list[SpeakerTurn], split_words: SplitWords) -> TranscriptionResult:
    """``result`` (decoded with word timestamps) with speaker-labelled segments; the words are
    those of ``result.words``, matched to the segments' tokens in order (the words are the
    segments' non-blank pieces, as the transcriber timed them)."""
    if not turns:
        turns = [SpeakerTurn("A", 0.0, result.duration)]  # text with no speech found: one voice
    words = iter(result.words or [])
    segments: list[Segment] = []
    for segment in result.segments:
        pieces = split_words(segment.tokens, segment.language)
        timed = [next(words, None) if text.strip() else None for text, _ in pieces]
        if any(w is None for w, (text, _) in zip(timed, pieces) if text.strip()):
            raise ValueError("the transcript's words do not match its segments' tokens")
        for part in _split(segment, pieces, timed, turns):
            segments.append(replace(part, id=len(segments)))
    if next(words, None) is not None:
        raise ValueError("the transcript's words do not match its segments' tokens")
    return replace(result, segments=segments)


def _split(segment: Segment, pieces: list[tuple[str, int]], timed: list[Word | None],
           turns: list[SpeakerTurn]) -> list[Segment]:
    speakers = [None if w is None else speaker_at(w.start, w.end, turns) for w in timed]
    if not any(speakers):
        return [replace(segment, speaker=speaker_at(segment.start, segment.end, turns))]
    # A blank piece (a lone space or newline) joins the word after it, or the last one.
    following = None
    for i in range(len(speakers) - 1, -1, -1):
        following = speakers[i] = speakers[i] or following
    last = next(s for s in reversed(speakers) if s)
    speakers = [s or last for s in speakers]
    parts: list[Segment] = []
    token, first = 0, 0
    for i, (text, n_tokens) in enumerate(pieces):
        token += n_tokens
        if i + 1 < len(pieces) and speakers[i + 1] == speakers[i]:
            continue
        group = range(first, i + 1)
        times = [timed[j] for j in group if timed[j] is not None]
        start = segment.start if not parts else times[0].start
        end = segment.end if i + 1 == len(pieces) else times[-1].end
        tokens_before = sum(n for _, n in pieces[:first])
        parts.append(replace(segment, start=start, end=max(end, start), speaker=speakers[i],
                             text="".join(pieces[j][0] for j in group), tokens=segment.tokens[tokens_before:token]))
        first = i + 1
    return parts
