"""speech_coverage: when a decode's text cannot account for the speech under it, and where a
window is cut to decode it again in parts."""

import pytest

from adapters.base import ParsedOutput, ParsedSegment
from asr_service.speech_coverage import THIN_MIN_SPEECH_S, DecodedSpan, may_be_thin, pause_near, speech_in, thin_spans

pytestmark = pytest.mark.unit

SR = 16000


def _thin(parsed, regions, _rate, length):
    return thin_spans([DecodedSpan(0, parsed, length)], regions, SR)


def _segment(start, end, tokens):
    return ParsedSegment(start, end, "x" * tokens, list(range(tokens)))


def test_speech_is_counted_only_where_the_regions_overlap_the_span():
    regions = [(0, 100), (200, 300)]
    assert speech_in(regions, 50, 250) == 100
    assert speech_in(regions, 100, 200) == 0


def test_a_segment_of_a_few_tokens_over_many_seconds_of_speech_is_thin():
    regions = [(0, 20 * SR)]  # twenty seconds of speech
    parsed = ParsedOutput("en", "x", [_segment(0.0, 4.0, 12), _segment(4.0, 20.0, 2)])
    assert _thin(parsed, regions, SR, 20 * SR) == [(4 * SR, 20 * SR)]


def test_segments_at_the_pace_of_slow_speech_are_not_thin():
    regions = [(0, 20 * SR)]
    parsed = ParsedOutput("en", "x", [_segment(0.0, 10.0, 20), _segment(10.0, 20.0, 15)])
    assert _thin(parsed, regions, SR, 20 * SR) == []


def test_a_segment_at_half_the_pace_of_the_others_is_thin():
    """Two sentences said one after the other, written once: the segment holds the tokens of
    one over the speech of two, at half the voice's pace in the rest of the decode."""
    regions = [(0, 30 * SR)]
    paced = [_segment(5.0 * i, 5.0 * (i + 1), 26) for i in range(4)]
    parsed = ParsedOutput("en", "x", paced + [_segment(20.0, 30.0, 27)])
    assert _thin(parsed, regions, SR, 30 * SR) == [(20 * SR, 30 * SR)]
    varied = [_segment(5.0 * i, 5.0 * (i + 1), n) for i, n in enumerate((26, 20, 24, 22))]
    assert _thin(ParsedOutput("en", "x", varied + [_segment(20.0, 30.0, 36)]), regions, SR, 30 * SR) == []


def test_a_long_segment_over_silence_is_not_thin():
    """What counts is the speech under a segment, not its length: three tokens over ten seconds
    that hold one second of speech account for it."""
    regions = [(0, SR)]
    assert _thin(ParsedOutput("en", "x", [_segment(0.0, 10.0, 3)]), regions, SR, 10 * SR) == []


def test_short_speech_is_never_thin():
    speech = int((THIN_MIN_SPEECH_S - 0.5) * SR)
    assert _thin(ParsedOutput("en", "x", [_segment(0.0, 3.0, 1)]), [(0, speech)], SR, 3 * SR) == []


def test_without_timestamps_the_whole_text_is_judged_over_the_whole_chunk():
    regions = [(0, 25 * SR)]
    assert _thin(ParsedOutput("en", "x", [_segment(None, None, 10)]), regions, SR, 30 * SR) == [(0, 30 * SR)]
    assert _thin(ParsedOutput("en", "x", [_segment(None, None, 60)]), regions, SR, 30 * SR) == []


def test_a_continuation_is_judged_in_the_window_s_time_against_the_window_s_pace():
    """The seek's continuation decodes the window's tail: its segments are placed after its
    offset, and held to the pace of the decode before it."""
    regions = [(0, 30 * SR)]
    head = ParsedOutput("en", "x", [_segment(5.0 * i, 5.0 * (i + 1), 25) for i in range(3)])
    rest = ParsedOutput("en", "x", [_segment(0.0, 10.0, 26), _segment(10.0, 15.0, 25)])
    decodes = [DecodedSpan(0, head, 30 * SR), DecodedSpan(15 * SR, rest, 15 * SR)]
    assert thin_spans(decodes, regions, SR) == [(15 * SR, 25 * SR)]


def test_an_open_last_segment_runs_to_the_end_of_the_chunk():
    regions = [(0, 30 * SR)]
    parsed = ParsedOutput("en", "x", [_segment(0.0, 25.0, 80), _segment(25.0, None, 1)])
    assert _thin(parsed, regions, SR, 30 * SR) == [(25 * SR, 30 * SR)]


def test_output_that_did_not_parse_is_not_judged():
    assert _thin(ParsedOutput(None, None, failure="bad prefix"), [(0, 30 * SR)], SR, 30 * SR) == []


def test_the_cut_is_the_pause_nearest_the_target_within_the_bounds():
    regions = [(0, 100), (200, 300), (500, 600), (900, 1000)]  # pauses centred at 150, 400, 750
    assert pause_near(regions, 700, 0, 1000) == 750
    assert pause_near(regions, 700, 0, 500) == 400
    assert pause_near(regions, 500, 160, 390) is None
    assert pause_near([(0, 1000)], 500, 0, 1000) is None


def test_only_a_segment_as_long_as_the_speech_floor_may_be_thin():
    short = ParsedOutput("en", "x", [_segment(0.0, THIN_MIN_SPEECH_S - 0.1, 1), _segment(2.9, 5.0, 1)])
    assert not may_be_thin([DecodedSpan(0, short, 5 * SR)], SR)
    long = ParsedOutput("en", "x", [_segment(0.0, THIN_MIN_SPEECH_S, 30)])
    assert may_be_thin([DecodedSpan(0, long, 5 * SR)], SR)
