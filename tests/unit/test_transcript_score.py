"""support/transcript_score: how the benches and the long-audio tests judge a transcript."""

import pytest

from support.dialogue import Utterance
from support.transcript_score import score

pytestmark = pytest.mark.unit

TRUTH = [Utterance("A", "We leave from the north gate at seven.", 0.5, 3.0),
         Utterance("B", "Every one of us will be there.", 4.0, 6.0)]


def test_a_compound_written_closed_counts_as_its_open_form_in_wer_compounds_only():
    closed = score(TRUTH, "We leave from the Northgate at 7. Everyone of us will be there.")
    assert closed["wer"] == round(4 / 15, 4)  # "north gate" and "every one": a substitution and a deletion each
    assert closed["wer_compounds"] == 0.0
    assert closed["utterances_found"] == 2


def test_words_that_differ_still_count_in_wer_compounds():
    misheard = score(TRUTH, "We leave from the north gate at salmon. Every one of us will be where.")
    assert misheard["wer"] == misheard["wer_compounds"] == round(2 / 15, 4)
    # Two neighbouring words are joined only into a word one side writes: "bet here" is not "be there".
    apart = score(TRUTH, "We leave from the north gate at seven. Every one of us will bet here.")
    assert apart["wer_compounds"] == apart["wer"] == round(2 / 15, 4)
