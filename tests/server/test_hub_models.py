"""Models named by hub repository id, fetched by huggingface_hub from a STAND-IN hub on loopback
(support/hub_standin.py; these machines cannot reach the real one) that serves the packaged
model's files in the CTranslate2 layout (as Systran/faster-whisper-* are) and the HF layout (as
openai/whisper-* are). The server and CLI run as users run them, with HF_ENDPOINT and HF_HOME
pointing at the stand-in and a cache of the test's own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from support.clips import clip_path
from support.hub_standin import StandinHub
from support.packaged_model import ctranslate2_dir, hf_dir

pytestmark = pytest.mark.server

CLI = str(Path(sys.executable).parent / "asr-service")
CT2_REPO, HF_REPO, BROKEN_REPO = "Systran/faster-whisper-base", "openai/whisper-base", "broken/whisper-base"
# Files an HF repository carries beside the weights this server reads: never fetched.
NOT_FETCHED = {"flax_model.msgpack": b"flax", "tf_model.h5": b"tf", "pytorch_model.bin": b"torch",
               "model.fp32-00001-of-00002.safetensors": b"fp32 copy"}
FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    ct2 = Path(ctranslate2_dir(tmp_path_factory.mktemp("ct2")))
    hub = StandinHub()
    hub.add(CT2_REPO, ct2)
    hub.add(HF_REPO, hf_dir(tmp_path_factory.mktemp("hf")), extra=NOT_FETCHED)
    hub.add(BROKEN_REPO, ct2)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    return tmp_path_factory.mktemp("hf-home")


def hub_env(hub, home, offline=False) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1" if offline else "0"}


def transcribe(hub, home, model, offline=False):
    return subprocess.run([CLI, "transcribe", str(clip_path("en", "quick_brown_fox")), "--model", model,
                           "--response-format", "verbose_json"], env=hub_env(hub, home, offline),
                          capture_output=True, text=True, timeout=600)


def snapshot_files(home, repo) -> set[str]:
    snapshots = Path(home) / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    return {p.name for p in snapshots.glob("*/*")}


@pytest.mark.parametrize("repo", [CT2_REPO, HF_REPO])
def test_a_hub_model_in_either_layout_is_fetched_and_transcribes(hub, hf_home, repo):
    """Both layouts hold the packaged weights, so both transcribe as the packaged model does;
    only what loading needs is fetched (not the HF repository's flax, tf, torch-pickle or float32
    copies)."""
    done = transcribe(hub, hf_home, repo)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["text"] == FOX
    fetched = snapshot_files(hf_home, repo)
    assert not fetched & set(NOT_FETCHED), fetched
    assert ("model.bin" in fetched) if repo == CT2_REPO else ("model.safetensors" in fetched), fetched
    assert not any(r.endswith(tuple(NOT_FETCHED)) and r.startswith("GET") for r in hub.requests)


def test_a_fetched_model_starts_offline_and_by_revision_without_the_hub(hub, hf_home):
    if "model.bin" not in snapshot_files(hf_home, CT2_REPO):  # cached by the test before, unless run alone
        assert transcribe(hub, hf_home, CT2_REPO).returncode == 0
    seen = len(hub.requests)
    commit = hub.repos[CT2_REPO].commit
    done = transcribe(hub, hf_home, f"{CT2_REPO}@{commit}", offline=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["text"] == FOX
    assert len(hub.requests) == seen  # HF_HUB_OFFLINE=1: not one request


def test_unknown_repositories_and_revisions_are_clear_errors(hub, tmp_path):
    done = transcribe(hub, tmp_path, "nobody/whisper-none")
    assert done.returncode == 2 and "the hub has no repository 'nobody/whisper-none'" in done.stderr, done.stderr
    done = transcribe(hub, tmp_path, f"{CT2_REPO}@v9")
    assert done.returncode == 2 and f"the hub repository '{CT2_REPO}' has no revision 'v9'" in done.stderr
    done = transcribe(hub, tmp_path, "nobody/never-fetched", offline=True)
    assert done.returncode == 2 and "is not in the hub cache and cannot be fetched" in done.stderr


def test_an_interrupted_fetch_is_never_loaded_and_is_finished_later(hub, tmp_path):
    """The weights' download drops halfway: the start fails naming the repository and the reason;
    an offline start then refuses the partial copy instead of loading it; once the hub serves the
    file, the next start finishes the fetch."""
    hub.broken.add((BROKEN_REPO, "model.bin"))
    try:
        done = transcribe(hub, tmp_path, BROKEN_REPO)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"fetching '{BROKEN_REPO}' from the hub failed" in done.stderr, done.stderr[-2000:]
        assert "model.bin" not in snapshot_files(tmp_path, BROKEN_REPO)
        done = transcribe(hub, tmp_path, BROKEN_REPO, offline=True)
        assert done.returncode == 2 and f"the cached copy of '{BROKEN_REPO}' is incomplete" in done.stderr, done.stderr
    finally:
        hub.broken.clear()
    done = transcribe(hub, tmp_path, BROKEN_REPO)
    assert done.returncode == 0 and json.loads(done.stdout)["text"] == FOX, done.stderr[-2000:]


def test_a_front_for_sglang_fetches_an_hf_model_without_its_weights(hub, tmp_path):
    """--engine sglang's front needs the tokenizer and config only: an HF layout's weights stay on
    the hub (a CTranslate2 layout keeps its dims inside model.bin, so that one is fetched whole)."""
    probe = ("from asr_service.model_loading import load_model; import sys; m = load_model(sys.argv[1], weights=False); "
             "print(m.model is None, m.dims.n_vocab)")
    done = subprocess.run([sys.executable, "-c", probe, HF_REPO], env=hub_env(hub, tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["True", "51865"], done.stderr[-2000:]
    assert not any(name.endswith(".safetensors") for name in snapshot_files(tmp_path, HF_REPO))


def test_the_server_serves_a_hub_model_under_its_repository_id(hub, hf_home, start_server):
    if "model.safetensors" not in snapshot_files(hf_home, HF_REPO):  # cached by the first test, unless run alone
        assert transcribe(hub, hf_home, HF_REPO).returncode == 0
    server = start_server("--model", HF_REPO, env=hub_env(hub, hf_home, offline=True))
    assert [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]] == [HF_REPO]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with open(clip_path("en", "quick_brown_fox"), "rb") as f:
        assert client.audio.transcriptions.create(model=HF_REPO, file=f).text == FOX
