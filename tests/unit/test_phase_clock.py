"""The engine's phase clock: nested phases are counted once, and the phases add up."""

import time

import pytest

from asr_service.engine.interface import ENGINE_PHASES
from asr_service.engine.phase_clock import PhaseClock

pytestmark = pytest.mark.unit


def test_nested_phase_stops_the_outer_clock():
    clock = PhaseClock()
    start = time.perf_counter()
    with clock.timing("beam_search"):
        time.sleep(0.05)
        with clock.timing("word_alignment"):
            time.sleep(0.1)
        time.sleep(0.05)
    total = time.perf_counter() - start
    seconds = clock.seconds()
    assert set(seconds) == set(ENGINE_PHASES)
    assert seconds["word_alignment"] >= 0.1 and seconds["beam_search"] >= 0.1
    # Together they are at most the time spent: the inner 0.1 s was not counted in both.
    assert 0.2 <= seconds["beam_search"] + seconds["word_alignment"] <= total
    assert seconds["encoder"] == 0.0


def test_a_phase_that_raises_is_still_counted():
    clock = PhaseClock()
    try:
        with clock.timing("encoder"):
            time.sleep(0.02)
            raise RuntimeError("engine step failed")
    except RuntimeError:
        pass
    with clock.timing("prefill"):
        pass
    assert clock.seconds()["encoder"] >= 0.02 and clock.seconds()["prefill"] < clock.seconds()["encoder"]
