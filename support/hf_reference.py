"""HF transformers' Whisper on the same weights: the reference implementation for tests and bench."""

from __future__ import annotations


def hf_config(d):
    import transformers

    return transformers.WhisperConfig(
        vocab_size=d.n_vocab, num_mel_bins=d.n_mels, d_model=d.n_audio_state,
        encoder_layers=d.n_audio_layer, decoder_layers=d.n_text_layer,
        encoder_attention_heads=d.n_audio_head, decoder_attention_heads=d.n_text_head,
        encoder_ffn_dim=4 * d.n_audio_state, decoder_ffn_dim=4 * d.n_text_state,
        max_source_positions=d.n_audio_ctx, max_target_positions=d.n_text_ctx,
        decoder_start_token_id=50258, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
    )


def hf_model_from(loaded):
    """WhisperForConditionalGeneration holding a LoadedModel's weights."""
    import transformers

    hf = transformers.WhisperForConditionalGeneration(hf_config(loaded.dims)).eval()
    hf.load_state_dict(to_hf_state_dict(loaded.model), strict=False)
    return hf


def to_hf_state_dict(model) -> dict:
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
