"""Who spoke when, on real synthesized voices (support/speakers.py, the short set: four voices,
eleven turns of 0.3-10 s, pauses of 0.2-1.5 s), with the packaged speech gate and Resemblyzer's
voice encoder, and the packaged Whisper model for the words."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from asr_service.diarization.attribution import attribute
from asr_service.diarization.diarizer import Diarizer, SpeakerTurn
from asr_service.diarization.voice_encoder import VoiceEncoder
from asr_service.transcription_types import TranscriptionOptions
from support.dialogue import synthesize
from support.speakers import VOICES, Turn, with_noise

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def conversation(four_voices) -> tuple[np.ndarray, list[Turn]]:
    return four_voices


@pytest.fixture(scope="module")
def diarizer(runtime) -> Diarizer:
    return Diarizer(runtime.transcriber.gate, VoiceEncoder.pretrained())


def overlap(a_start: float, a_end: float, b_start: float, b_end: float) -> float:
    return max(0.0, min(a_end, b_end) - max(a_start, b_start))


def attribution(truth: list[Turn], turns: list[SpeakerTurn]) -> list[tuple[str, str, float]]:
    """For each true turn: its speaker, the found speaker covering most of it, and the share of
    the turn that found speaker covers."""
    out = []
    for t in truth:
        cover = Counter()
        for h in turns:
            cover[h.speaker] += overlap(t.start, t.end, h.start, h.end)
        speaker, seconds = cover.most_common(1)[0]
        out.append((t.speaker, speaker, seconds / (t.end - t.start)))
    return out


def assert_every_turn_attributed(truth: list[Turn], turns: list[SpeakerTurn], names: dict[str, str] | None = None):
    found = attribution(truth, turns)
    mapping = {}
    for true, hyp, share in found:
        assert share >= 0.8, (true, hyp, share, found)
        assert mapping.setdefault(true, hyp) == hyp, found  # one found speaker per voice...
    assert len(set(mapping.values())) == len(mapping), found  # ...and one voice per found speaker
    if names is not None:
        assert {t: mapping[t] for t in names} == names, mapping


def test_the_voices_are_counted_and_every_turn_attributed(conversation, diarizer):
    audio, truth = conversation
    turns = diarizer.diarize(audio)
    assert len({t.speaker for t in turns}) == len(VOICES) == 4
    assert list(dict.fromkeys(t.speaker for t in turns)) == ["A", "B", "C", "D"]  # lettered by first appearance
    assert_every_turn_attributed(truth, turns)
    assert all(a.end <= b.start for a, b in zip(turns, turns[1:])), turns  # in order, never overlapping


def test_background_noise_changes_nothing(conversation, diarizer):
    audio, truth = conversation
    turns = diarizer.diarize(with_noise(audio))
    assert len({t.speaker for t in turns}) == 4
    assert_every_turn_attributed(truth, turns)


def test_speaker_bounds_are_honoured(conversation, diarizer):
    audio, _ = conversation
    assert len({t.speaker for t in diarizer.diarize(audio, max_speakers=2)}) == 2
    assert len({t.speaker for t in diarizer.diarize(audio, min_speakers=5)}) == 5


def test_known_speakers_name_their_voices_and_the_rest_keep_letters(conversation, diarizer):
    audio, truth = conversation
    # other sentences than the conversation's
    references = {name: synthesize(VOICES[voice], text) for name, voice, text in (
        ("Alice", "A", "My name is on the list at the front desk, please ask there first."),
        ("Carl", "C", "Every evening the river rises a little, and by morning it falls again."))}
    known = {name: diarizer.enrol(clip) for name, clip in references.items()}
    turns = diarizer.diarize(audio, known=known)
    assert {t.speaker for t in turns} == {"Alice", "Carl", "A", "B"}
    assert_every_turn_attributed(truth, turns, names={"A": "Alice", "C": "Carl"})


async def test_every_word_goes_to_its_speaker_and_no_segment_mixes_two(conversation, diarizer, runtime):
    audio, truth = conversation
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(timestamps=True, word_timestamps=True))
    turns = diarizer.diarize(audio)
    labelled = attribute(result, turns, runtime.adapter.split_words)
    assert "".join(s.text for s in labelled.segments) == "".join(s.text for s in result.segments)  # nothing lost
    assert sum(len(s.tokens) for s in labelled.segments) == sum(len(s.tokens) for s in result.segments)
    assert [s.id for s in labelled.segments] == list(range(len(labelled.segments)))
    mapping = {true: hyp for true, hyp, _ in attribution(truth, turns)}
    for segment in labelled.segments:  # each segment lies within its speaker's true turns
        inside = Counter()
        for t in truth:
            inside[t.speaker] += overlap(segment.start, segment.end, t.start, t.end)
        assert mapping[inside.most_common(1)[0][0]] == segment.speaker, (segment, inside)
    assert len({s.speaker for s in labelled.segments}) == 4
