"""Optional int8 dynamic quantization of the linear layers (CPU).

It speeds up the encoder and the vocabulary projection of every decode step on the CPU (figures
in docs/performance.md). Activations stay float; weights are
int8 with one scale per output channel (fbgemm dynamic linear). Its WER cost is measured in
bench/. torch.ao.quantization is deprecated upstream in favour of torchao but
still ships in torch 2.x; it is used here because it needs nothing beyond torch.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .model import Whisper


def quantize_int8(model: Whisper) -> Whisper:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation notice of torch.ao.quantization
        projection = nn.Linear(model.dims.n_text_state, model.dims.n_vocab, bias=False)
        projection.weight = model.decoder.token_embedding.weight
        model.decoder.output_projection = projection
        # Per output channel, as CTranslate2 quantizes: per-tensor scales cost real WER here.
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
