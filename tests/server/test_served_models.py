"""Several models in one server, each picked by the request's ``model``: the packaged base (the
default, also as whisper-1), a small random-weight English-only checkpoint from a directory, and
a small random-weight large-v3-turbo-shaped checkpoint named by hub id, fetched on first use
from a STAND-IN hub on loopback (support/hub_standin.py) that sends it slowly, so its loading can
be watched while the other models serve. At most two models are loaded at once, and an idle one
is unloaded after a few seconds."""

import json
import threading
import time

import httpx
import openai
import pytest

from support.clips import clip_path
from support.hub_standin import StandinHub
from support.whisper_family import SHAPES, write_checkpoint

pytestmark = pytest.mark.server

TURBO = "openai/whisper-large-v3-turbo"
IDLE_TIMEOUT_S = 4
FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = StandinHub()
    hub.add(TURBO, write_checkpoint(SHAPES["large-v3-turbo"], tmp_path_factory.mktemp("turbo")))
    hub.slow[(TURBO, "model.safetensors")] = 0.6  # about 8 s for its 14 MB: time to watch it load
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def server(start_server, hub, tmp_path_factory):
    english = write_checkpoint(SHAPES["tiny.en"], tmp_path_factory.mktemp("tiny-en"))
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path_factory.mktemp("hf-home")), "HF_HUB_OFFLINE": "0"}
    return start_server("--threads", "2", "--model", "whisper-base=whisper-base,whisper-1", "--model",
                        f"{english}=tiny-en", "--model", TURBO, "--model", "/nonexistent/whisper=broken",
                        "--max-loaded-models", "2",
                        "--model-idle-timeout", str(IDLE_TIMEOUT_S), env=env)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def states(server) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(server.url + "/v1/models").json()["data"]}


def fox(client, model, **kw):
    # The random-weight models' text is noise that runs to the token cap, and fails the fallback's
    # checks at every temperature: a few tokens say as much as hundreds.
    extra = {} if model in ("whisper-base", "whisper-1") else {"extra_body": {"max_completion_tokens": 4}}
    with open(clip_path("en", "quick_brown_fox"), "rb") as f:
        return client.audio.transcriptions.create(model=model, file=f, **extra, **kw)


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {seconds} s"
        time.sleep(0.2)


def test_every_served_name_is_listed_with_its_model_and_state(server):
    # Ready once the default is; the English-only model loads after it, in the background.
    wait_for(lambda: states(server)["tiny-en"] == "loaded", 60, "loaded at start")
    models = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(m["id"], m["status"]) for m in models] == [("whisper-base", "loaded"), ("whisper-1", "loaded"),
                                                        ("tiny-en", "loaded"), (TURBO, "unloaded"),
                                                        ("broken", "unloaded")]
    assert [m["root"] for m in models[:2]] == ["whisper-base"] * 2 and models[2]["root"].endswith("tiny-en0")
    assert all(m["object"] == "model" and m["owned_by"] == "asr-service" for m in models)
    assert httpx.get(f"{server.url}/v1/models/{TURBO}").json()["root"] == TURBO
    assert httpx.get(server.url + "/health").json()["models"] == {"whisper-base": "loaded", "tiny-en": "loaded",
                                                                 TURBO: "unloaded", "broken": "unloaded"}


def test_a_name_not_served_is_404_listing_the_served_ones(server, client):
    with pytest.raises(openai.NotFoundError) as missing:
        fox(client, "Systran/faster-whisper-large-v3")
    body = missing.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert all(name in body["message"] for name in ("whisper-base", "whisper-1", "tiny-en", TURBO, "broken"))
    assert httpx.get(server.url + "/v1/models/whisper-9").status_code == 404
    assert fox(client, "whisper-1").text == FOX  # the server is fine


def test_each_name_reaches_its_own_model(client):
    """whisper-1 and whisper-base are one model; the English-only one answers in English with no
    detection and refuses to translate; the base model detects."""
    assert fox(client, "whisper-base").text == fox(client, "whisper-1").text == FOX
    english = fox(client, "tiny-en", response_format="verbose_json")
    assert english.language == "en" and english.model_extra["language_probability"] == 1.0
    with pytest.raises(openai.BadRequestError) as refused:
        with open(clip_path("fr", "comptage"), "rb") as f:
            client.audio.translations.create(model="tiny-en", file=f)
    assert refused.value.body["param"] == "model" and "cannot translate" in refused.value.body["message"]


def test_a_model_loading_on_first_use_holds_up_no_other(server, client):
    """The turbo-shaped model is fetched and loaded for its first request; meanwhile the base
    model answers. With two models loaded already, the idle English-only one makes room."""
    answers = {}
    first_use = threading.Thread(target=lambda: answers.update(turbo=fox(client, TURBO, response_format="verbose_json")))
    first_use.start()
    wait_for(lambda: states(server)[TURBO] == "loading", 30, "loading")
    assert fox(client, "whisper-base").text == FOX
    assert states(server)[TURBO] == "loading"  # the base model answered while the other was still loading
    first_use.join(timeout=120)
    assert isinstance(answers["turbo"].language, str) and answers["turbo"].language  # its fused prefix parsed
    assert states(server) == {"whisper-base": "loaded", "whisper-1": "loaded", "tiny-en": "unloaded", TURBO: "loaded",
                              "broken": "unloaded"}


def test_an_idle_model_is_unloaded_and_loads_again_when_asked_for(server, client):
    fox(client, TURBO)
    wait_for(lambda: states(server)[TURBO] == "unloaded", 10 * IDLE_TIMEOUT_S, "unloaded when idle")
    assert states(server)["whisper-base"] == "loaded"  # the default stays
    assert fox(client, "tiny-en", language="en").text is not None
    assert states(server)["tiny-en"] == "loaded"


def test_a_realtime_session_picks_its_model_at_connect(server):
    """?model= chooses; a session.update naming another served model is refused, naming how."""
    from websockets.sync.client import connect

    with connect(server.url.replace("http", "ws") + "/v1/realtime?intent=transcription&model=tiny-en") as ws:
        created = json.loads(ws.recv())
        assert created["session"]["audio"]["input"]["transcription"]["model"] == "tiny-en"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": "whisper-base"}}}}}))
        error = json.loads(ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "model_not_found"
        assert "?model=whisper-base" in error["error"]["message"]
    with connect(server.url.replace("http", "ws") + "/v1/realtime?intent=transcription&model=nope") as ws:
        error = json.loads(ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "model_not_found"


def test_a_model_that_cannot_load_says_why_and_the_others_serve_on(server, client):
    with pytest.raises(openai.APIStatusError) as failed:
        fox(client, "broken")
    assert failed.value.status_code == 503
    body = failed.value.body
    assert body["code"] == "model_unavailable" and "'broken' could not be loaded" in body["message"]
    assert "/nonexistent/whisper" in body["message"]  # the loader's reason
    card = httpx.get(server.url + "/v1/models/broken").json()
    assert card["status"] == "failed" and "/nonexistent/whisper" in card["error"]
    assert fox(client, "whisper-1").text == FOX
