"""Models named by hub repository id, fetched with the hub's own client (huggingface_hub).

``huggingface_hub.snapshot_download`` owns everything a user of the hub expects: its cache
(``HF_HOME`` / ``HF_HUB_CACHE``), ``HF_HUB_OFFLINE=1``, ``HF_TOKEN`` for gated and private
repositories, ``HF_ENDPOINT`` for a mirror, revisions, resumed downloads and the progress bar.
It writes each file under a temporary name and links it into the snapshot only once complete,
and refuses a cached snapshot its recorded file list says is incomplete; what is left here is
choosing the files a Whisper needs and saying clearly why a fetch failed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import ModelLoadError

# "owner/name", optionally "@revision" (a branch, tag or commit).
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")

# What loading needs from either layout: configs and the tokenizer (*.json, vocabulary.txt), and
# one set of weights: CTranslate2's model.bin or HF's safetensors (whole or in shards, as HF
# names them; large-v3 repositories also carry float32 copies under other names). A repository
# that has neither gets its pytorch_model.bin. Other weights (flax, tf, onnx, ggml) are never
# fetched. The choice depends on the repository only, so an offline start asks the cache for
# exactly what the online one fetched.
_CONFIG_FILES = ["*.json", "vocabulary.txt"]
_WEIGHT_FILES = ["model.bin", "model.safetensors", "model-*-of-*.safetensors"]
_LEGACY_WEIGHT_FILES = ["pytorch_model.bin"]


def is_repo_id(spec: str) -> bool:
    return _REPO_ID.match(spec) is not None


def fetch(spec: str, weights: bool = True) -> Path:
    """The local snapshot of the repository ``spec`` names ("owner/name[@revision]"), fetched
    into the hub cache unless it is there already. ``weights=False`` (a front whose decoding runs
    on SGLang servers) leaves an HF layout's weights on the hub; a CTranslate2 layout keeps its
    dims in model.bin, so that is fetched anyway. ModelLoadError names the repository and why."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, IncompleteSnapshotError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    match = _REPO_ID.match(spec)
    if match is None:
        raise ModelLoadError(f"{spec!r} is not a hub repository id (owner/name, optionally @revision)")
    repo, revision = match["repo"], match["revision"]
    where = f"{repo!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        if not weights:
            folder = Path(snapshot_download(repo, revision=revision, allow_patterns=_CONFIG_FILES))
            if _is_hf_layout(folder):
                return folder
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=_CONFIG_FILES + _WEIGHT_FILES))
        if not _has_weights(folder):
            folder = Path(snapshot_download(repo, revision=revision, allow_patterns=_LEGACY_WEIGHT_FILES))
        if not _has_weights(folder) and not (folder / "pytorch_model.bin").exists():
            raise ModelLoadError(f"the hub repository {where} holds no Whisper weights this server reads "
                                 f"({', '.join(_WEIGHT_FILES + _LEGACY_WEIGHT_FILES)})")
    except ModelLoadError:
        raise
    except GatedRepoError:
        raise ModelLoadError(f"the hub repository {where} is gated: accept its terms on the hub and set HF_TOKEN "
                             "to a token with access") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"the hub has no repository {where} (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"the hub repository {repo!r} has no revision {revision!r}") from None
    except IncompleteSnapshotError as e:
        raise ModelLoadError(f"the cached copy of {where} is incomplete (an interrupted fetch) and the hub cannot be "
                             f"reached to finish it: {_first_line(e)}") from None
    except LocalEntryNotFoundError as e:
        raise ModelLoadError(f"{where} is not in the hub cache and cannot be fetched: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the client's transport errors (a dropped connection) are its own types
        raise ModelLoadError(f"fetching {where} from the hub failed: {type(e).__name__}: {_first_line(e)}") from None
    return folder


def _is_hf_layout(folder: Path) -> bool:
    """An HF checkpoint's config.json describes the model; a CTranslate2 one's only decoding."""
    config = folder / "config.json"
    return config.exists() and json.loads(config.read_text()).get("model_type") == "whisper"


def _has_weights(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in _WEIGHT_FILES)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
