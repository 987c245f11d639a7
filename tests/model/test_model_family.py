"""The Whisper family beyond base: large-v3 and its turbo and distil derivatives (128 mel bins,
a 100th language that moves every later id up one, 4 or 2 decoder layers) and the English-only
.en models (no language or task tokens in their prompts, nothing to detect). Small random-weight
checkpoints of each shape (support/whisper_family.py) are loaded by the project's loader and
decoded by its engine; the ids they must use are the real models' published ones."""

import numpy as np
import pytest
import xgrammar as xgr

from asr_service.engine.features import log_mel_spectrogram
from asr_service.request_options import OptionError, build_options
from asr_service.runtime import RuntimeSettings, build_runtime
from asr_service.transcription_types import TranscriptionOptions

from asr_service.warmup import variant_params

from support.clips import load_clip
from support.token_masks import allowed
from support.whisper_family import SHAPES, write_checkpoint

pytestmark = pytest.mark.model

# The real checkpoints' ids (openai/whisper's tokenizer; HF's generation configs agree).
V3_IDS = {"eot": 50257, "sot": 50258, "translate": 50359, "transcribe": 50360, "sot_prev": 50362, "no_speech": 50363,
          "no_timestamps": 50364, "timestamp_begin": 50365, "vocab_size": 51866}
EN_IDS = {"eot": 50256, "sot": 50257, "translate": 50357, "transcribe": 50358, "sot_prev": 50360, "no_speech": 50361,
          "no_timestamps": 50362, "timestamp_begin": 50363, "vocab_size": 51864}
EXPECTED_IDS = {"large-v3": V3_IDS, "large-v3-turbo": V3_IDS, "distil-large-v3": V3_IDS, "tiny.en": EN_IDS}


@pytest.fixture(scope="module", params=list(SHAPES))
def member(request, tmp_path_factory):
    """(shape, runtime) for a random-weight checkpoint of each shape, on the float32 CPU engine."""
    shape = SHAPES[request.param]
    directory = write_checkpoint(shape, tmp_path_factory.mktemp(shape.name))
    runtime = build_runtime(RuntimeSettings(model=str(directory), device="cpu", quantize="none", threads=2))
    yield shape, runtime
    runtime.close()


def test_the_checkpoint_loads_in_its_shape_with_the_real_ids(member):
    shape, runtime = member
    dims, tok = runtime.loaded.dims, runtime.adapter.tok
    assert (dims.n_mels, dims.n_vocab, dims.n_text_layer) == (shape.n_mels, shape.n_vocab, shape.decoder_layers)
    assert {name: getattr(tok, name) for name in EXPECTED_IDS[shape.name]} == EXPECTED_IDS[shape.name]
    # Alignment heads: none in the config, so every head of the decoder's upper half.
    assert runtime.adapter.alignment_heads == tuple((layer, h) for layer in range(shape.decoder_layers // 2,
                                                                                   shape.decoder_layers) for h in (0, 1))


def test_the_grammar_and_prompts_use_the_members_own_ids(member):
    shape, runtime = member
    adapter, tok = runtime.adapter, runtime.adapter.tok
    english = adapter.build_prompt("en", timestamps=False)
    if shape.tokenizer == "en":
        assert adapter.supported_languages == ("en",) and not adapter.supports_language_detection
        assert list(english.prompt_ids) == [tok.sot, tok.no_timestamps]
        assert list(adapter.build_prompt("en", timestamps=True).prompt_ids) == [tok.sot]
        with pytest.raises(NotImplementedError):
            adapter.build_fused_autodetect_params()
        parsed = adapter.parse_output([*tok.encode(" Hello."), tok.eot], english)
        assert (parsed.language, parsed.text, parsed.prefix_length) == ("en", "Hello.", 0)
    else:
        assert len(adapter.supported_languages) == 100 and adapter.supported_languages[-1] == "yue"
        assert list(english.prompt_ids) == [tok.sot, tok.language_ids["en"], tok.transcribe, tok.no_timestamps]
        m = xgr.GrammarMatcher(adapter.build_fused_autodetect_params().constraint.compiled)
        assert allowed(m, tok.vocab_size) == set(range(tok.sot + 1, tok.translate))  # the 100 languages
        assert m.accept_token(tok.language_ids["yue"]) and allowed(m, tok.vocab_size) == {tok.transcribe}
        fused = adapter.build_fused_autodetect_params()
        output = [tok.language_ids["yue"], tok.transcribe, tok.no_timestamps, *tok.encode(" 你好"), tok.eot]
        parsed = adapter.parse_output(output, fused)
        assert (parsed.language, parsed.text, parsed.prefix_length) == ("yue", "你好", 3)
    text = xgr.GrammarMatcher(english.constraint.compiled)
    text_ok = allowed(text, tok.vocab_size)
    assert tok.eot in text_ok and not text_ok & (tok.special_ids - {tok.eot})
    assert max(text_ok) == tok.eot  # no timestamp in text without timestamps
    timed = xgr.GrammarMatcher(adapter.build_prompt("en", timestamps=True).constraint.compiled)
    assert allowed(timed, tok.vocab_size) == set(range(tok.timestamp_begin, tok.timestamp_begin + 51))


async def test_the_engine_decodes_it_and_the_output_parses_under_its_ids(member):
    """Random weights say nothing sensible, but the forced prefix and the timestamp rules are
    the member's own: the decode parses, names a language the model has, and times its
    segments inside the audio."""
    shape, runtime = member
    audio = load_clip("en", "quick_brown_fox")
    options = TranscriptionOptions(max_new_tokens=12, fallback_temperatures=())
    result = await runtime.transcriber.transcribe(audio, options)
    assert result.detection_failure is None
    assert result.language in runtime.adapter.supported_languages
    if shape.tokenizer == "en":
        assert result.language == "en" and result.language_probability == 1.0
    timed = await runtime.transcriber.transcribe(audio, TranscriptionOptions(
        language="en", timestamps=True, max_new_tokens=12, fallback_temperatures=()))
    assert timed.detection_failure is None
    assert all(0 <= s.start <= s.end <= timed.duration for s in timed.segments)
    assert all(t < runtime.adapter.tok.eot for s in timed.segments for t in s.tokens)


@pytest.mark.parametrize("member", ["tiny.en"], indirect=True)
def test_an_english_only_model_refuses_translation_and_other_languages(member):
    shape, runtime = member
    assert [name for name, _ in variant_params(runtime.adapter)] == ["transcribe/notimestamps/known-language",
                                                                     "transcribe/timestamps/known-language"]
    with pytest.raises(OptionError) as refused:
        build_options({}, runtime.adapter, "translate", "json")
    assert refused.value.param == "model" and "cannot translate" in str(refused.value)
    with pytest.raises(OptionError) as refused:
        build_options({"language": "fr"}, runtime.adapter, "transcribe", "json")
    assert refused.value.param == "language" and refused.value.code == "unsupported_language"
    assert build_options({}, runtime.adapter, "transcribe", "json").language is None  # decoded as English


def test_128_bin_log_mel_matches_transformers_feature_extractor():
    transformers = pytest.importorskip("transformers")
    audio = load_clip("en", "quick_brown_fox")
    extractor = transformers.WhisperFeatureExtractor(feature_size=128)
    reference = extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    ours = log_mel_spectrogram(audio, 128).numpy()
    assert ours.shape == reference.shape == (128, 3000)
    assert np.abs(ours - reference).max() < 2e-3
