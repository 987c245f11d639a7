"""The fallback policy on its own: which decode is retried, which is kept, which is silence."""

import pytest

from asr_service.fallback import DecodeFigures, QualityThresholds, is_silent, pick_best, rejection
from asr_service.language_vote import is_outlier, vote

pytestmark = pytest.mark.unit

T = QualityThresholds()


def figures(temperature=0.0, logprob=-0.2, ratio=1.0, no_speech=0.01, parsed=True, speech=True):
    return DecodeFigures(temperature, logprob, ratio, no_speech, parsed, speech_found=speech)


def test_retry_triggers():
    assert rejection(figures(), T) is None
    assert rejection(figures(ratio=2.5), T) == "compression_ratio"  # compresses like a loop
    assert rejection(figures(logprob=-1.2), T) == "avg_logprob"  # unlikely text
    assert rejection(figures(parsed=False), T) == "unparsed"
    # No speech and low confidence: silence, not retried (a hotter decode only invents more).
    assert rejection(figures(logprob=-1.2, no_speech=0.9), T) is None
    assert is_silent(figures(logprob=-1.2, no_speech=0.9), T)
    assert not is_silent(figures(logprob=-0.3, no_speech=0.9), T)  # confident speech stays
    assert is_silent(figures(speech=False), T)


def test_the_first_passing_decode_is_kept():
    attempts = [figures(ratio=3.0), figures(0.2, logprob=-1.5), figures(0.4, logprob=-0.5), figures(0.6, logprob=-0.1)]
    assert pick_best(attempts, T) == 2


def test_when_none_passes_the_most_likely_non_loop_is_kept():
    loop = figures(0.0, logprob=-0.1, ratio=9.0)
    sampled = [figures(0.2, logprob=-1.6, ratio=1.0), figures(0.4, logprob=-1.3, ratio=2.0), figures(0.6, logprob=-0.9, ratio=3.0)]
    assert pick_best([loop] + sampled, T) == 2  # -1.3 beats -1.6; the likelier ones are loops
    assert pick_best([loop, figures(0.2, logprob=-0.5, ratio=4.0)], T) == 0  # all loops: the most likely


def test_vote_and_outliers():
    es, fr = {"es": 0.9, "fr": 0.1}, {"es": 0.35, "fr": 0.65}
    assert vote([(es, 30.0), (es, 30.0), (fr, 5.0)]) == ("es", round((0.9 * 60 + 0.35 * 5) / 65, 4))
    assert vote([(fr, 5.0)], language="es") == ("es", 0.35)
    assert is_outlier("fr", fr, "es")  # disagrees, and not sure of itself
    assert not is_outlier("fr", {"fr": 0.95}, "es")  # sure of itself: code-switching, kept
    assert not is_outlier("es", es, "es")
