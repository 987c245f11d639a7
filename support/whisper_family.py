"""Small random-weight Whisper checkpoints shaped like the family's members, for loader, grammar
and decode tests (the real ones are gigabytes and on a hub these machines cannot reach).

Each is an HF directory written by transformers: the member's mel bins, vocabulary size and
decoder depth, tiny widths. Its tokenizer is the packaged (base, multilingual) tokenizer.json
changed by the same insertions the real member's has:
- large-v3 and its derivatives (turbo, distil-large-v3): ``<|yue|>`` added as the 100th language
  right after ``<|su|>``, so every later special and timestamp id moves up one, and
  ``<|nocaptions|>`` renamed ``<|nospeech|>``;
- English-only (.en): a GPT-2 vocabulary, one text token fewer, so ``<|endoftext|>`` and every
  special after it sit one lower (the language tokens are still listed).
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    name: str
    n_mels: int
    n_vocab: int
    decoder_layers: int
    tokenizer: str  # "v2" (as packaged), "v3" or "en"


SHAPES = {
    "large-v3": Shape("large-v3", 128, 51866, 2, "v3"),
    "large-v3-turbo": Shape("large-v3-turbo", 128, 51866, 4, "v3"),
    "distil-large-v3": Shape("distil-large-v3", 128, 51866, 2, "v3"),
    "tiny.en": Shape("tiny.en", 80, 51864, 2, "en"),
}


def _shifted(tokenizer: dict, first: int, by: int) -> dict:
    """Every added (special) token from id ``first`` on moved by ``by``."""
    out = copy.deepcopy(tokenizer)
    for token in out["added_tokens"]:
        if token["id"] >= first:
            token["id"] += by
    for name, token_id in list(out["model"]["vocab"].items()):
        if token_id >= first:
            out["model"]["vocab"][name] = token_id + by
    for special in out["post_processor"]["special_tokens"].values():
        special["ids"] = [i + by if i >= first else i for i in special["ids"]]
    return out


def v3_tokenizer(packaged: dict) -> dict:
    su = next(t for t in packaged["added_tokens"] if t["content"] == "<|su|>")
    out = _shifted(packaged, su["id"] + 1, 1)
    out["added_tokens"].append({**su, "id": su["id"] + 1, "content": "<|yue|>"})
    out["added_tokens"].sort(key=lambda t: t["id"])
    for token in out["added_tokens"]:
        if token["content"] == "<|nocaptions|>":
            token["content"] = "<|nospeech|>"
    return out


def english_only_tokenizer(packaged: dict) -> dict:
    eot = next(t["id"] for t in packaged["added_tokens"] if t["content"] == "<|endoftext|>")
    out = copy.deepcopy(packaged)
    vocab = out["model"]["vocab"]
    dropped = next(name for name, i in vocab.items() if i == eot - 1)  # the last text token
    del vocab[dropped]
    out["model"]["merges"] = [m for m in out["model"]["merges"]
                              if "".join(m if isinstance(m, list) else m.split(" ")) != dropped]
    return _shifted(out, eot, -1)


@functools.lru_cache(maxsize=1)
def _packaged():
    """The packaged model's tokenizer and config (its model.bin is read whole for them: once)."""
    from asr_service.model_loading import load_model

    return load_model(weights=False)


def write_checkpoint(shape: Shape, out: Path, seed: int = 0) -> Path:
    """A random-weight checkpoint of ``shape`` in ``out`` (an HF Whisper directory)."""
    import torch
    import transformers

    packaged = _packaged()
    tokenizer = json.loads(packaged.tokenizer_file.read_text())
    tokenizer = {"v2": tokenizer, "v3": v3_tokenizer(tokenizer), "en": english_only_tokenizer(tokenizer)}[shape.tokenizer]
    eot = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")
    config = transformers.WhisperConfig(
        vocab_size=shape.n_vocab, num_mel_bins=shape.n_mels, d_model=64, encoder_layers=1,
        decoder_layers=shape.decoder_layers, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=256, decoder_ffn_dim=256, max_source_positions=1500, max_target_positions=448,
        decoder_start_token_id=eot + 1, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(seed)
    transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(out)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    # Suppressed symbols: the packaged list's text tokens (all below every member's end of text).
    (out / "generation_config.json").write_text(json.dumps(
        {"suppress_tokens": [i for i in packaged.suppress_ids if i < eot]}))
    return out
