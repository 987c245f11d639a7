"""parse_fused_output / parse_output / strip_special_tokens on token ids."""

import logging

import pytest

pytestmark = pytest.mark.model


def ids(tok, text):
    return tok.encode(text)


def test_fused_happy_path(adapter, tok):
    out = [tok.language_ids["fr"], tok.transcribe, tok.no_timestamps] + ids(tok, " Bonjour le monde.") + [tok.eot]
    assert adapter.parse_fused_output(out) == ("fr", "Bonjour le monde.")


def test_missing_prefix_fails_strict_and_logs(adapter, tok, caplog):
    with caplog.at_level(logging.WARNING):
        assert adapter.parse_fused_output(ids(tok, " Hello world") + [tok.eot]) == (None, None)
    assert "not a language token" in caplog.text
    # Too short to hold the prefix at all.
    assert adapter.parse_fused_output([tok.language_ids["en"]]) == (None, None)
    # Language but no task token.
    assert adapter.parse_fused_output([tok.language_ids["en"]] + ids(tok, " Hello there")) == (None, None)


def test_unknown_language_token_never_becomes_english(adapter, tok):
    # <|translate|> where the language should be, and an ordinary token: both fail.
    for first in (tok.translate, ids(tok, " en")[0]):
        out = [first, tok.transcribe, tok.no_timestamps] + ids(tok, " text")
        assert adapter.parse_fused_output(out) == (None, None)


def test_timestamp_variant_segments_from_ids(adapter, tok):
    ts = lambda s: tok.timestamp_begin + round(s / 0.02)  # noqa: E731
    out = (
        [tok.language_ids["en"], tok.transcribe, ts(0.0)] + ids(tok, " Hello there.") + [ts(1.5), ts(1.5)]
        + ids(tok, " General Kenobi.") + [ts(3.04), tok.eot]
    )
    params = adapter.build_fused_autodetect_params(timestamps=True)
    parsed = adapter.parse_output(out, params)
    assert parsed.failure is None and parsed.language == "en"
    assert [(s.start, s.end, s.text) for s in parsed.segments] == [
        (0.0, 1.5, " Hello there."), (1.5, 3.04, " General Kenobi.")]
    assert parsed.text == "Hello there. General Kenobi."
    assert adapter.parse_fused_output(out) == ("en", "Hello there. General Kenobi.")


def test_an_output_ending_on_an_opening_timestamp_says_where_speech_goes_on(adapter, tok):
    ts = lambda s: tok.timestamp_begin + round(s / 0.02)  # noqa: E731
    params = adapter.build_prompt("en", timestamps=True)
    body = [ts(0.0)] + ids(tok, " Hello there.") + [ts(1.5)]
    assert adapter.parse_output(body + [ts(24.12), tok.eot], params).continues_at == 24.12  # the seek's sign
    assert adapter.parse_output(body + [tok.eot], params).continues_at is None  # the window is done
    unfinished = adapter.parse_output(body + [ts(2.0)] + ids(tok, " General"), params)  # cut by the budget
    assert unfinished.continues_at is None and unfinished.segments[-1].end is None


def test_known_language_output_has_no_prefix(adapter, tok):
    params = adapter.build_prompt("de")
    parsed = adapter.parse_output(ids(tok, " Guten Tag.") + [tok.eot], params)
    assert (parsed.language, parsed.text) == ("de", "Guten Tag.")


def test_every_text_token_spells_the_bytes_the_tokenizer_decodes_it_to(adapter, tok):
    """token_bytes (include[]=logprobs) against the tokenizer's own decoding: a token that is
    whole characters decodes to exactly its bytes, and a text of multi-byte characters split
    across tokens is spelled exactly by its tokens' bytes together."""
    whole = 0
    for token in range(tok.eot):
        raw = adapter.token_bytes(token)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert text == tok.decode([token]), token
        whole += 1
    assert whole > 0.9 * tok.eot
    text = " Zürich, 東京, ça va? Привет"
    assert b"".join(adapter.token_bytes(t) for t in ids(tok, text)).decode("utf-8") == text
    with pytest.raises(ValueError):
        adapter.token_bytes(tok.eot)


def test_strip_special_tokens_keeps_spoken_lookalikes(adapter):
    text = "<|en|><|transcribe|><|notimestamps|> say <|foo|> and <|0.00|>hi<|endoftext|>"
    assert adapter.strip_special_tokens(text) == " say <|foo|> and hi"


def test_language_validation_and_probabilities(adapter, tok):
    import pytest

    from adapters import UnsupportedLanguageError

    assert adapter.validate_language("FR") == "fr"
    assert adapter.validate_language(None) is None
    with pytest.raises(UnsupportedLanguageError) as e:
        adapter.validate_language("xx")
    assert "xx" in str(e.value) and "en" in e.value.supported
    probs = adapter.language_probabilities({tok.language_ids["en"]: 0.3, tok.language_ids["fr"]: 0.1}, ("en", "fr"))
    assert abs(probs["en"] - 0.75) < 1e-9 and abs(sum(probs.values()) - 1) < 1e-9


@pytest.mark.parametrize("unit", ["hello ", "Grüße, 世界! 🎙️ ", "=" * 40 + " "])
def test_a_huge_prompt_keeps_the_tokens_a_full_tokenization_keeps(adapter, tok, unit):
    """The prompt is cut by characters before it is tokenized (so megabytes cost what a short
    prompt costs); the context tokens are exactly the last ones of the whole text's tokens."""
    text = unit * (200_000 // len(unit))
    budget = adapter.n_text_ctx // 2 - 1
    prompt = adapter.build_prompt("en", previous_text=text).prompt_ids
    assert list(prompt[: budget + 1]) == [tok.sot_prev] + tok.encode(" " + text.strip())[-budget:]
    assert prompt[budget + 1] == tok.sot
