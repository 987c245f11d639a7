"""CTranslate2 Whisper variables -> state dict of ``asr_service.engine.model.Whisper``."""

from __future__ import annotations

import re

import numpy as np
import torch

from ..engine.model import WhisperDims
from .errors import ModelLoadError


def _tensor(variables: dict[str, np.ndarray], bf16: set[str], name: str) -> torch.Tensor:
    try:
        array = variables[name]
    except KeyError:
        raise ModelLoadError(f"CTranslate2 model is missing variable {name!r}: not a Whisper model?") from None
    if name in bf16:
        return torch.from_numpy(array.astype(np.int32) << 16).view(torch.float32)
    if array.dtype == np.int8:
        # int8 weights carry a per-row scale in "<name>_scale" (ctranslate2 quantization).
        scale = variables.get(name + "_scale")
        if scale is None:
            raise ModelLoadError(f"int8 variable {name!r} has no scale")
        return torch.from_numpy(array.astype(np.float32) / scale.astype(np.float32)[:, None])
    return torch.from_numpy(array.astype(np.float32))


def _count_layers(variables: dict[str, np.ndarray], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"/layer_(\d+)/")
    return 1 + max(int(m.group(1)) for name in variables if (m := pattern.match(name)))


def convert_ctranslate2_whisper(
    variables: dict[str, np.ndarray], bf16: set[str]
) -> tuple[WhisperDims, dict[str, torch.Tensor]]:
    def t(name: str) -> torch.Tensor:
        return _tensor(variables, bf16, name)

    if "encoder/conv1/weight" not in variables:
        raise ModelLoadError("CTranslate2 model has no encoder/conv1: not a Whisper model")
    conv1 = t("encoder/conv1/weight")
    d = conv1.shape[0]
    dims = WhisperDims(
        n_mels=conv1.shape[1],
        n_audio_ctx=variables["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=d,
        n_audio_head=int(variables["encoder/num_heads"]),
        n_audio_layer=_count_layers(variables, "encoder"),
        n_vocab=variables["decoder/embeddings/weight"].shape[0],
        n_text_ctx=variables["decoder/position_encodings/encodings"].shape[0],
        n_text_state=variables["decoder/embeddings/weight"].shape[1],
        n_text_head=int(variables["decoder/num_heads"]),
        n_text_layer=_count_layers(variables, "decoder"),
    )
    sd: dict[str, torch.Tensor] = {
        "encoder.conv1.weight": conv1,
        "encoder.conv1.bias": t("encoder/conv1/bias"),
        "encoder.conv2.weight": t("encoder/conv2/weight"),
        "encoder.conv2.bias": t("encoder/conv2/bias"),
        "encoder.positions": t("encoder/position_encodings/encodings"),
        "encoder.ln_post.weight": t("encoder/layer_norm/gamma"),
        "encoder.ln_post.bias": t("encoder/layer_norm/beta"),
        "decoder.token_embedding.weight": t("decoder/embeddings/weight"),
        "decoder.positions": t("decoder/position_encodings/encodings"),
        "decoder.ln.weight": t("decoder/layer_norm/gamma"),
        "decoder.ln.bias": t("decoder/layer_norm/beta"),
    }

    def linear(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = t(f"{src}/weight")
        sd[f"{dst}.bias"] = t(f"{src}/bias") if f"{src}/bias" in variables else torch.zeros(sd[f"{dst}.weight"].shape[0])

    def norm(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = t(f"{src}/gamma")
        sd[f"{dst}.bias"] = t(f"{src}/beta")

    for i in range(dims.n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"encoder.layers.{i}"
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        linear(f"{dst}.qkv", f"{src}/self_attention/linear_0")
        linear(f"{dst}.out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.fc2", f"{src}/ffn/linear_1")
    for i in range(dims.n_text_layer):
        src, dst = f"decoder/layer_{i}", f"decoder.layers.{i}"
        norm(f"{dst}.self_ln", f"{src}/self_attention/layer_norm")
        linear(f"{dst}.self_qkv", f"{src}/self_attention/linear_0")
        linear(f"{dst}.self_out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.cross_ln", f"{src}/attention/layer_norm")
        linear(f"{dst}.cross_q", f"{src}/attention/linear_0")
        linear(f"{dst}.cross_kv", f"{src}/attention/linear_1")
        linear(f"{dst}.cross_out", f"{src}/attention/linear_2")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.fc2", f"{src}/ffn/linear_1")
    return dims, sd
