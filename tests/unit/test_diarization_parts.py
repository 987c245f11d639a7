"""Diarization's parts without audio: clustering and its bounds, known-voice matching, speaker
names, and the split of a segment whose words change speaker."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from asr_service.audio import AudioLimits, AudioTooLongError
from asr_service.diarization.attribution import attribute, speaker_at
from asr_service.diarization.clustering import cluster, match_known
from asr_service.diarization.diarizer import SpeakerTurn, letter_names
from asr_service.diarization.pipeline import reference_clips
from asr_service.formats import to_diarized_json, to_rttm, to_srt, to_verbose_json, to_vtt
from asr_service.request_options import DiarizationOptions, OptionError, build_diarization
from asr_service.transcription_types import Segment, TranscriptionResult
from asr_service.server.admission import Admission, AdmissionLimits, Overloaded
from asr_service.word_timing import Word
from support.clips import clip_path
from tests.helpers import wav_bytes as wav_of

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
    words = [Word(w, float(i), i + 0.8, 0.9) for i, w in enumerate(WORDS)]
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
                                 duration=1.0, segments=[segment], words=[Word("one", 0, 1, 0.9), Word("two", 1, 2, 0.9)])
    with pytest.raises(ValueError, match="do not match"):
        attribute(result, [SpeakerTurn("A", 0, 2)], split_on_spaces)


def test_a_word_between_turns_goes_to_the_nearest():
    turns = [SpeakerTurn("A", 0.0, 1.0), SpeakerTurn("B", 3.0, 4.0)]
    assert speaker_at(1.2, 1.5, turns) == "A" and speaker_at(2.6, 2.9, turns) == "B"


def labelled_result() -> TranscriptionResult:
    segments = [Segment(id=i, seek=0, start=float(i), end=i + 0.9, text=f" Line {i}.", tokens=[i], temperature=0.0,
                        avg_logprob=-0.1, compression_ratio=1.0, no_speech_prob=0.0, language="en", speaker=who)
                for i, who in enumerate(["A", "Alice"])]
    return TranscriptionResult(task="transcribe", text="Line 0. Line 1.", language="en", language_probability=1.0,
                               duration=2.0, segments=segments)


def test_diarized_json_is_openais_shape():
    from openai.types.audio import TranscriptionDiarized

    body = to_diarized_json(labelled_result())
    parsed = TranscriptionDiarized.model_validate(body)  # the SDK's own type
    assert [(s.id, s.speaker, s.text, s.start, s.end) for s in parsed.segments] == [
        ("seg_0", "A", "Line 0.", 0.0, 0.9), ("seg_1", "Alice", "Line 1.", 1.0, 1.9)]
    assert parsed.usage.seconds == 2


def test_rttm_keeps_ten_fields_when_a_name_has_spaces():
    named = replace(labelled_result(), segments=[replace(s, speaker="Dr. Ann O'Neil") for s in labelled_result().segments])
    lines = [line.split() for line in to_rttm(named, "team meeting").splitlines()]
    assert len(lines) == 2 and all(len(f) == 10 and f[1] == "team_meeting" and f[7] == "Dr._Ann_O'Neil" for f in lines)


def test_subtitles_name_the_speaker_of_each_cue():
    assert "00:00:00,000 --> 00:00:00,900\nA: Line 0.\n" in to_srt(labelled_result())
    assert "00:00:01.000 --> 00:00:01.900\n<v Alice>Line 1.\n" in to_vtt(labelled_result())
    plain = replace(labelled_result(), segments=[replace(s, speaker=None) for s in labelled_result().segments])
    assert "\nLine 0.\n" in to_srt(plain) and "<v" not in to_vtt(plain)
    assert all("speaker" not in s for s in to_verbose_json(plain)["segments"])
    assert [s["speaker"] for s in to_verbose_json(labelled_result())["segments"]] == ["A", "Alice"]


@pytest.mark.parametrize("values, response_format, task, param", [
    ({"prompt": "hi"}, "diarized_json", "transcribe", "prompt"),
    ({"include": ["logprobs"]}, "diarized_json", "transcribe", "include"),
    ({"min_speakers": 3, "max_speakers": 2}, "diarized_json", "transcribe", "min_speakers"),
    ({"known_speaker_names": ["a", "b"], "known_speaker_references": ["x"]}, "diarized_json", "transcribe",
     "known_speaker_names"),
    ({"known_speaker_names": ["a", "a"], "known_speaker_references": ["x", "y"]}, "diarized_json", "transcribe",
     "known_speaker_names"),
    ({"known_speaker_names": ["a", "b"], "known_speaker_references": ["x", "y"], "max_speakers": 1},
     "diarized_json", "transcribe", "known_speaker_names"),
    ({"diarize": True}, "json", "transcribe", "diarize"),
    ({"min_speakers": 2}, "verbose_json", "transcribe", "min_speakers"),
    ({}, "diarized_json", "translate", "response_format"),
])
def test_diarization_requests_that_cannot_apply_are_refused(values, response_format, task, param):
    with pytest.raises(OptionError) as refused:
        build_diarization(values, task, response_format, str.encode)
    assert refused.value.param == param


def test_diarization_is_asked_for_by_format_or_flag():
    assert build_diarization({}, "transcribe", "json", str.encode) is None
    asked = build_diarization({"diarize": True, "timestamp_granularities": ["word"], "known_speaker_names": ["a"],
                               "known_speaker_references": ["x"]}, "transcribe", "vtt", str.encode)
    assert asked == DiarizationOptions(known_speakers=(("a", b"x"),), keep_words=True)
    assert build_diarization({}, "transcribe", "diarized_json", str.encode) == DiarizationOptions()


def test_too_few_words_for_the_segments_are_an_error_too():
    segment = Segment(id=0, seek=0, start=0.0, end=1.0, text=" one two", tokens=[0, 1], temperature=0.0,
                      avg_logprob=0.0, compression_ratio=1.0, no_speech_prob=0.0, language="en")
    result = TranscriptionResult(task="transcribe", text="one two", language="en", language_probability=1.0,
                                 duration=1.0, segments=[segment], words=[Word("one", 0, 0.5, 0.9)])
    with pytest.raises(ValueError, match="do not match"):
        attribute(result, [SpeakerTurn("A", 0, 2)], split_on_spaces)


def test_more_windows_than_the_tree_takes_are_clustered_all_the_same():
    from asr_service.diarization.clustering import MAX_TREE_WINDOWS

    embeddings, truth = voices([MAX_TREE_WINDOWS // 2, MAX_TREE_WINDOWS, MAX_TREE_WINDOWS // 2], seed=3)
    assert list(cluster(embeddings)) == list(truth)
    assert len(set(cluster(embeddings, max_speakers=2))) == 2


async def test_reference_audio_is_admitted_as_work_and_held_to_the_request_limit():
    """Each reference's seconds are claimed on the request's ticket as it is decoded: past the
    pending-audio bound (with another request pending) it is Overloaded, as a long upload is."""
    reference = clip_path("en", "quick_brown_fox").read_bytes()  # 2.9 s
    known = DiarizationOptions(known_speakers=(("Ann", reference), ("Bo", reference)))
    admission = Admission(AdmissionLimits(max_pending_audio_seconds=8.0))
    other = admission.admit(audio_seconds=1.0)
    ticket = admission.admit(audio_seconds=3.0)
    with pytest.raises(Overloaded):  # 1 + 3 + 2.9 fits, the second reference does not
        await reference_clips(known, AudioLimits(), request_seconds=3.0, on_progress=ticket.claim)
    assert admission.pending_audio_seconds == pytest.approx(1.0 + 3.0 + 2.89, abs=0.01)
    ticket.release()
    other.release()
    ticket = admission.admit(audio_seconds=3.0)
    clips = await reference_clips(known, AudioLimits(), request_seconds=3.0, on_progress=ticket.claim)
    assert set(clips) == {"Ann", "Bo"} and admission.pending_audio_seconds == pytest.approx(8.78, abs=0.01)
    with pytest.raises(AudioTooLongError, match="together"):
        await reference_clips(known, AudioLimits(max_seconds=8.0), request_seconds=3.0)
    with pytest.raises(OptionError, match="longer than 10 s"):  # decoded no further than just past 10 s
        await reference_clips(DiarizationOptions(known_speakers=(("Ann", wav_of(np.zeros(16000 * 60))),)), AudioLimits())
