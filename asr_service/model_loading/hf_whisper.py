"""HF-format Whisper directory (config.json + safetensors or pytorch_model.bin) -> state dict."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..engine.model import WhisperDims
from .errors import ModelLoadError


def _read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    weights: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            weights.update(load_file(str(f)))
    elif (directory / "pytorch_model.bin").exists():
        weights = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelLoadError(f"{directory} has a config.json but no *.safetensors or pytorch_model.bin")
    # WhisperForConditionalGeneration prefixes everything with "model."
    return {k.removeprefix("model."): v.float() for k, v in weights.items()}


def read_hf_dims(directory: Path) -> WhisperDims:
    config = json.loads((directory / "config.json").read_text())
    if config.get("model_type") != "whisper":
        raise ModelLoadError(f"{directory}/config.json has model_type {config.get('model_type')!r}, not 'whisper'")
    dims = WhisperDims(
        n_mels=config["num_mel_bins"],
        n_audio_ctx=config["max_source_positions"],
        n_audio_state=config["d_model"],
        n_audio_head=config["encoder_attention_heads"],
        n_audio_layer=config["encoder_layers"],
        n_vocab=config["vocab_size"],
        n_text_ctx=config["max_target_positions"],
        n_text_state=config["d_model"],
        n_text_head=config["decoder_attention_heads"],
        n_text_layer=config["decoder_layers"],
    )
    return dims


def read_hf_whisper(directory: Path) -> tuple[WhisperDims, dict[str, torch.Tensor]]:
    dims = read_hf_dims(directory)
    w = _read_hf_weights(directory)
    try:
        return dims, _map_hf(w, dims)
    except KeyError as e:
        raise ModelLoadError(f"{directory} is missing weight {e}: not a Whisper checkpoint?") from None


def _map_hf(w: dict[str, torch.Tensor], dims: WhisperDims) -> dict[str, torch.Tensor]:
    sd = {
        "encoder.conv1.weight": w["encoder.conv1.weight"],
        "encoder.conv1.bias": w["encoder.conv1.bias"],
        "encoder.conv2.weight": w["encoder.conv2.weight"],
        "encoder.conv2.bias": w["encoder.conv2.bias"],
        "encoder.positions": w["encoder.embed_positions.weight"],
        "encoder.ln_post.weight": w["encoder.layer_norm.weight"],
        "encoder.ln_post.bias": w["encoder.layer_norm.bias"],
        "decoder.token_embedding.weight": w["decoder.embed_tokens.weight"],
        "decoder.positions": w["decoder.embed_positions.weight"],
        "decoder.ln.weight": w["decoder.layer_norm.weight"],
        "decoder.ln.bias": w["decoder.layer_norm.bias"],
    }

    def copy(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = w[f"{src}.weight"]
        sd[f"{dst}.bias"] = w[f"{src}.bias"]

    def fused(dst: str, srcs: list[str]) -> None:
        sd[f"{dst}.weight"] = torch.cat([w[f"{s}.weight"] for s in srcs])
        # HF's k_proj has no bias: Whisper keys are unbiased.
        sd[f"{dst}.bias"] = torch.cat(
            [w.get(f"{s}.bias", torch.zeros(w[f"{s}.weight"].shape[0])) for s in srcs]
        )

    for i in range(dims.n_audio_layer):
        s, d = f"encoder.layers.{i}", f"encoder.layers.{i}"
        copy(f"{d}.attn_ln", f"{s}.self_attn_layer_norm")
        fused(f"{d}.qkv", [f"{s}.self_attn.{p}_proj" for p in "qkv"])
        copy(f"{d}.out", f"{s}.self_attn.out_proj")
        copy(f"{d}.mlp_ln", f"{s}.final_layer_norm")
        copy(f"{d}.mlp.fc1", f"{s}.fc1")
        copy(f"{d}.mlp.fc2", f"{s}.fc2")
    for i in range(dims.n_text_layer):
        s, d = f"decoder.layers.{i}", f"decoder.layers.{i}"
        copy(f"{d}.self_ln", f"{s}.self_attn_layer_norm")
        fused(f"{d}.self_qkv", [f"{s}.self_attn.{p}_proj" for p in "qkv"])
        copy(f"{d}.self_out", f"{s}.self_attn.out_proj")
        copy(f"{d}.cross_ln", f"{s}.encoder_attn_layer_norm")
        copy(f"{d}.cross_q", f"{s}.encoder_attn.q_proj")
        fused(f"{d}.cross_kv", [f"{s}.encoder_attn.{p}_proj" for p in "kv"])
        copy(f"{d}.cross_out", f"{s}.encoder_attn.out_proj")
        copy(f"{d}.mlp_ln", f"{s}.final_layer_norm")
        copy(f"{d}.mlp.fc1", f"{s}.fc1")
        copy(f"{d}.mlp.fc2", f"{s}.fc2")
    return sd
