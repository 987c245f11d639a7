"""Token-strict constraints: what xgrammar allows at each step, by token id."""

import pytest
import xgrammar as xgr

from support.token_masks import allowed

pytestmark = pytest.mark.model


@pytest.fixture
def fused(adapter):
    return adapter.build_fused_autodetect_params()


def test_step0_allows_exactly_the_language_tokens(adapter, tok, fused):
    m = xgr.GrammarMatcher(fused.constraint.compiled)
    assert allowed(m, tok.vocab_size) == set(tok.language_ids.values())
    assert len(tok.language_ids) == 99


def test_byte_spelled_prefix_is_rejected_at_step0(tok, fused):
    m = xgr.GrammarMatcher(fused.constraint.compiled)
    for piece in ("<", "|"):
        ids = tok.encode(piece)
        assert len(ids) == 1
        assert not m.accept_token(ids[0]), piece
    # No ordinary token whose text could begin a spelled "<|fr|>" is allowed.
    assert all(tok.token_string(i).startswith("<|") and i in tok.special_ids for i in allowed(m, tok.vocab_size))


def test_prefix_then_text_without_special_tokens(tok, fused):
    m = xgr.GrammarMatcher(fused.constraint.compiled)
    assert m.accept_token(tok.language_ids["fr"])
    assert allowed(m, tok.vocab_size) == {tok.transcribe}
    assert m.accept_token(tok.transcribe)
    assert allowed(m, tok.vocab_size) == {tok.no_timestamps}
    assert m.accept_token(tok.no_timestamps)
    text_ok = allowed(m, tok.vocab_size)
    assert tok.eot in text_ok
    assert not (text_ok & (tok.special_ids - {tok.eot}))
    assert not any(i >= tok.timestamp_begin for i in text_ok)
    for t in tok.encode(" Bonjour le monde"):
        assert m.accept_token(t)
    assert not m.accept_token(tok.language_ids["en"])
    assert not m.accept_token(tok.sot)
    assert m.accept_token(tok.eot) and m.is_terminated()


def test_timestamp_variant_requires_an_early_timestamp_and_allows_them_in_text(adapter, tok):
    params = adapter.build_fused_autodetect_params(timestamps=True)
    m = xgr.GrammarMatcher(params.constraint.compiled)
    m.accept_token(tok.language_ids["en"])
    m.accept_token(tok.transcribe)
    # Whisper's rule, in the constraint: the text opens with a timestamp of at most 1.00 s.
    assert allowed(m, tok.vocab_size) == set(range(tok.timestamp_begin, tok.timestamp_begin + 51))
    assert m.accept_token(tok.timestamp_begin)
    text_ok = allowed(m, tok.vocab_size)
    assert tok.timestamp_begin + 100 in text_ok and tok.no_timestamps not in text_ok


def test_narrowing_to_candidate_languages(adapter, tok):
    params = adapter.build_fused_autodetect_params(candidate_languages=("fr", "en"))
    m = xgr.GrammarMatcher(params.constraint.compiled)
    assert allowed(m, tok.vocab_size) == {tok.language_ids["en"], tok.language_ids["fr"]}
    assert not m.accept_token(tok.language_ids["de"])


def test_translate_task_token_is_forced(adapter, tok):
    params = adapter.build_fused_autodetect_params(task="translate")
    m = xgr.GrammarMatcher(params.constraint.compiled)
    m.accept_token(tok.language_ids["de"])
    assert allowed(m, tok.vocab_size) == {tok.translate}


def test_grammar_variants_compile_once_with_deterministic_keys(adapter):
    g = adapter.grammars
    a = g.key("transcribe", False, ("fr", "en"))
    b = g.key("transcribe", False, ("en", "fr", "en"))
    assert a == b
    assert g.get(a) is g.get(b)
    assert g.compile_counts[a] == 1


def test_known_language_timestamps_open_with_an_early_timestamp(adapter, tok):
    m = xgr.GrammarMatcher(adapter.build_prompt("en", timestamps=True).constraint.compiled)
    assert allowed(m, tok.vocab_size) == set(range(tok.timestamp_begin, tok.timestamp_begin + 51))


def test_suppressed_symbols_are_kept_out_of_text(adapter, tok):
    suppressed = adapter.grammars.suppress_ids
    assert suppressed  # the packaged model names the non-speech symbols Whisper avoids
    m = xgr.GrammarMatcher(adapter.build_prompt("en").constraint.compiled)
    assert not (allowed(m, tok.vocab_size) & set(suppressed))
