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


# (kind, our name, CTranslate2's name) for the layers of each stack.
_ENCODER_LAYER = (("norm", "attn_ln", "self_attention/layer_norm"), ("linear", "qkv", "self_attention/linear_0"),
                  ("linear", "out", "self_attention/linear_1"), ("norm", "mlp_ln", "ffn/layer_norm"),
                  ("linear", "mlp.fc1", "ffn/linear_0"), ("linear", "mlp.fc2", "ffn/linear_1"))
_DECODER_LAYER = (("norm", "self_ln", "self_attention/layer_norm"), ("linear", "self_qkv", "self_attention/linear_0"),
                  ("linear", "self_out", "self_attention/linear_1"), ("norm", "cross_ln", "attention/layer_norm"),
                  ("linear", "cross_q", "attention/linear_0"), ("linear", "cross_kv", "attention/linear_1"),
                  ("linear", "cross_out", "attention/linear_2"), ("norm", "mlp_ln", "ffn/layer_norm"),
                  ("linear", "mlp.fc1", "ffn/linear_0"), ("linear", "mlp.fc2", "ffn/linear_1"))


def convert_ctranslate2_whisper(
    variables: dict[str, np.ndarray], bf16: set[str]
) -> tuple[WhisperDims, dict[str, torch.Tensor]]:
    def t(name: str) -> torch.Tensor:
        return _tensor(variables, bf16, name)

    if "encoder/conv1/weight" not in variables:
        raise ModelLoadError("CTranslate2 model has no encoder/conv1: not a Whisper model")
    conv1 = t("encoder/conv1/weight")
    dims = _dims(variables, conv1)
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
    for stack, layers, parts in (("encoder", dims.n_audio_layer, _ENCODER_LAYER),
                                 ("decoder", dims.n_text_layer, _DECODER_LAYER)):
        for i in range(layers):
            for kind, dst, src in parts:
                dst, src = f"{stack}.layers.{i}.{dst}", f"{stack}/layer_{i}/{src}"
                if kind == "norm":
                    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = t(f"{src}/gamma"), t(f"{src}/beta")
                else:
                    sd[f"{dst}.weight"] = t(f"{src}/weight")
                    sd[f"{dst}.bias"] = (t(f"{src}/bias") if f"{src}/bias" in variables
                                         else torch.zeros(sd[f"{dst}.weight"].shape[0]))
    return dims, sd


def _dims(variables: dict[str, np.ndarray], conv1: torch.Tensor) -> WhisperDims:
    return WhisperDims(
        n_mels=conv1.shape[1],
        n_audio_ctx=variables["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=int(variables["encoder/num_heads"]),
        n_audio_layer=_count_layers(variables, "encoder"),
        n_vocab=variables["decoder/embeddings/weight"].shape[0],
        n_text_ctx=variables["decoder/position_encodings/encodings"].shape[0],
        n_text_state=variables["decoder/embeddings/weight"].shape[1],
        n_text_head=int(variables["decoder/num_heads"]),
        n_text_layer=_count_layers(variables, "decoder"),
    )
