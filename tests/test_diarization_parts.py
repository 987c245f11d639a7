"""Diarization's parts without audio: clustering and its bounds, known-voice matching, speaker
names, and the split of a segment whose words change speaker."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from asr_service.diarization.attribution import attribute, speaker_at
from asr_service.diarization.clustering import cluster, match_known
from asr_service.diarization.diarizer import SpeakerTurn, letter_names
from asr_service.transcription import Segment, TranscriptionResult
from asr_service.word_timing import Word

pytestmark = pytest.mark.unit


def voices(counts: list[int], spread: float = 0.15, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around one random centre per voice, in blocks of ``counts`` rows."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(counts), 256))
    rows = np.concatenate([centres[i] / np.linalg.norm(centres[i]) + spread / 16 * rng.standard_normal((n, 256))
                           for i, n in enumerate(counts)])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32), np.repeat(np.arange(len(counts)), counts)


def test_distinct_voices_are_counted_and_numbered_by_first_appearance():
    embeddings, truth = voices([12, 8, 20])
    order = np.r_[0:4, 12:16, 20:24, 4:12, 16:20, 24:40]  # the voices interleaved in time
    labels = cluster(embeddings[order])
    assert list(labels) == list(truth[order])


def test_bounds_force_the_count_and_a_lone_window_joins_a_voice():
    embeddings, _ = voices([10, 10, 10])
    assert len(set(cluster(embeddings, max_speakers=2))) == 2
    assert len(set(cluster(embeddings, min_speakers=4))) == 4
    stray = np.concatenate([embeddings, voices([1], seed=7)[0]])  # one window unlike any voice
    assert len(set(cluster(stray))) == 3
    assert list(cluster(embeddings[:1])) == [0]


def test_known_voices_match_one_to_one_and_only_when_close():
    embeddings, _ = voices([1, 1, 1])
    found = embeddings[[2, 0]]
    assert match_known(found, embeddings) == {0: 2, 1: 0}
    assert match_known(found, -embeddings) == {}


def test_letters_run_past_z():
    assert list(itertools.islice(letter_names(), 28))[24:] == ["Y", "Z", "AA", "AB"]


def split_on_spaces(tokens: list[int], language: str | None) -> list[tuple[str, int]]:
    """A tokenizer where token t spells the word WORDS[t] with a leading space, and -1 a blank."""
    return [(" " if t < 0 else " " + WORDS[t], 1) for t in tokens]


WORDS = ["one", "two", "three", "four", "five"]


def test_a_segment_is_split_where_its_words_change_speaker():
    segment = Segment(id=0, seek=0, start=0.0, end=5.0, text=" one two three four five", tokens=[0, 1, 2, 3, 4],
                      temperature=0.0, avg_logprob=-0.2, compression_ratio=1.0, no_speech_prob=0.01, language="en")
    words = [Word(w, float(i), i + 0.8) for i, w in enumerate(WORDS)]
    result = TranscriptionResult(task="transcribe", text=segment.text.strip(), language="en",
                                 language_probability=1.0, duration=5.0, segments=[segment], words=words)
    turns = [SpeakerTurn("A", 0.0, 1.9), SpeakerTurn("B", 2.1, 5.0)]
    parts = attribute(result, turns, split_on_spaces).segments
    assert [(p.id, p.speaker, p.text, p.tokens) for p in parts] == [(0, "A", " one two", [0, 1]),
                                                                    (1, "B", " three four five", [2, 3, 4])]
    assert (parts[0].start, parts[0].end, parts[1].start, parts[1].end) == (0.0, 1.8, 2.0, 5.0)
    assert parts[1].avg_logprob == segment.avg_logprob  # the decode's figures stay


def test_words_that_do_not_match_the_segments_are_an_error():
    segment = Segment(id=0, seek=0, start=0.0, end=1.0, text=" one", tokens=[0], temperature=0.0, avg_logprob=0.0,
                      compression_ratio=1.0, no_speech_prob=0.0, language="en")
    result = TranscriptionResult(task="transcribe", text="one", language="en", language_probability=1.0,
                                 duration=1.0, segments=[segment], words=[Word("one", 0, 1), Word("two", 1, 2)])
    with pytest.raises(ValueError, match="do not match"):
        attribute(result, [SpeakerTurn("A", 0, 2)], split_on_spaces)


def test_a_word_between_turns_goes_to_the_nearest():
    turns = [SpeakerTurn("A", 0.0, 1.0), SpeakerTurn("B", 3.0, 4.0)]
    assert speaker_at(1.2, 1.5, turns) == "A" and speaker_at(2.6, 2.9, turns) == "B"
