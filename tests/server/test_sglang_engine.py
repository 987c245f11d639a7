"""--engine sglang against STAND-IN SGLang servers (tests/sglang_standin.py).

SGLang needs a GPU, so the servers here are stand-ins: SGLang's own request code judges every
body (the release's contract gate, request class, Whisper processor, SamplingParams) and this
project's engine decodes what it accepts (real Whisper output). A stands in for SGLang 0.5.21
without the plugin (prompts go by the private key), B for 0.5.23 with the asr_whisper_prompt
plugin (prompts go as input_ids). First the SGLangEngine in-process over real HTTP to the
stand-ins, then a live `asr-service serve --engine sglang` process with the OpenAI SDK and raw HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import io
import json
import time
from dataclasses import replace

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from asr_service.engine.params import EngineUnavailable, UnsupportedDecode
from asr_service.engine.sglang import Carrier, SGLangEngine
from asr_service.runtime import sglang_canaries
from asr_service.transcription import Transcriber
from asr_service.transcription_types import TranscriptionOptions
from asr_service.piece_decode import decode_params
from support.clips import clip_path, load_clip
from tests.helpers import append, assert_openai_error, sse_events, wav_bytes
from tests.sglang_standin import REPLY_FAULTS, Faults, SGLangStandIn

pytestmark = pytest.mark.server


OLDEST, CURRENT = "0.5.21", "0.5.23"


def standin(runtime, judges, version: str, **kwargs) -> SGLangStandIn:
    return SGLangStandIn(runtime.engine, runtime.adapter.tok, judges[version], **kwargs).start()


@pytest.fixture(scope="module")
def standins(runtime, sglang_judges):
    """A: SGLang 0.5.21 without the plugin, cumulative events (SGLang's default). B: 0.5.23 with
    the plugin, incremental events."""
    a = standin(runtime, sglang_judges, OLDEST)
    b = standin(runtime, sglang_judges, CURRENT, plugin=True, incremental=True)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(autouse=True)
def no_faults(standins):
    for s in standins:
        s.faults = Faults()
    yield


def engine_for(runtime, *urls, retry_after_s: float = 2.0) -> SGLangEngine:
    return SGLangEngine(list(urls), runtime.adapter.tok.sot, sglang_canaries(runtime.adapter),
                        retry_after_s=retry_after_s)


def remote(runtime, *urls, retry_after_s: float = 2.0) -> Transcriber:
    return Transcriber(engine_for(runtime, *urls, retry_after_s=retry_after_s), runtime.adapter, None)


async def admitted(runtime, *urls, retry_after_s: float = 2.0) -> Transcriber:
    """A transcriber whose servers have passed their canaries (so faults set later hit work)."""
    tr = remote(runtime, *urls, retry_after_s=retry_after_s)
    await tr.engine.admit()
    assert all(b["state"] == "up" for b in tr.engine.pool.snapshot()), tr.engine.pool.snapshot()
    return tr


def _tag(body: dict) -> list[dict]:
    return json.loads(body["sampling_params"]["structural_tag"])["format"]["elements"]


# ---- the engine in-process ----

async def test_each_server_is_admitted_with_the_way_of_carrying_prompts_it_honours(runtime, standins):
    a, b = standins
    tr = await admitted(runtime, a.url, b.url)
    carriers = {s["url"]: s["prompt_carrier"] for s in tr.engine.pool.snapshot()}
    assert carriers == {a.url: Carrier.DETECT_KEY.value, b.url: Carrier.INPUT_IDS.value}
    # A was tried with input_ids first: its processor replaced them with SGLang's English prompt,
    # so the canary came back as text. SGLang's judge saw the body and made that prompt.
    tok = runtime.adapter.tok
    canaries = [(body, v) for body, v in zip(a.requests, a.verdicts) if body["rid"].startswith("asr-canary-")]
    assert canaries[-2][1]["decoder_prompt"] == [tok.sot, tok.language_ids["en"], tok.transcribe, tok.no_timestamps]
    assert canaries[-1][1]["decoder_prompt"] == [tok.sot] and canaries[-1][0]["sampling_params"]["_detect_language"]
    # B's plugin took the canary's prompt, previous text and all.
    body, verdict = next((body, v) for body, v in zip(reversed(b.requests), reversed(b.verdicts))
                         if body["rid"].startswith("asr-canary-"))
    assert body["input_ids"][0] == tok.sot_prev and verdict["decoder_prompt"] == body["input_ids"]


@pytest.mark.parametrize("server", ["A", "B"])
async def test_fused_detection_matches_the_embedded_engine(runtime, standins, server):
    standin = standins["AB".index(server)]
    tok = runtime.adapter.tok
    tr = await admitted(runtime, standin.url)
    for lang, name in (("en", "quick_brown_fox"), ("fr", "bonjour_monde"), ("es", "hola_mundo")):
        audio = load_clip(lang, name)
        sent_before = len(standin.requests)
        result = await tr.transcribe(audio, TranscriptionOptions())
        local = await runtime.transcriber.transcribe(audio, TranscriptionOptions(vad_filter=False))
        assert result.language == lang and result.language_probability > 0.5, result
        assert result.text == local.text, (result.text, local.text)
        body, verdict = standin.requests[sent_before], standin.verdicts[sent_before]
        # One call per chunk, whose decoder prompt (made by SGLang's processor) is
        # [<|startoftranscript|>]; the token-level constraint: any language token, then the
        # task, then no timestamps.
        assert verdict["decoder_prompt"] == [tok.sot] and body["stream"] is True
        assert ("_detect_language" in body["sampling_params"]) == (standin is standins[0])
        first, task, mode, text = _tag(body)
        assert {e["token"] for e in first["elements"]} == set(tok.language_ids.values())
        assert task == {"type": "token", "token": tok.transcribe}
        assert mode == {"type": "token", "token": tok.no_timestamps}
        assert text["type"] == "any_tokens" and set(runtime.adapter.grammars.suppress_ids) <= set(text["exclude_tokens"])
        # The audio arrives as it was sent (PCM16 WAV data URL).
        sent = sf.read(io.BytesIO(base64.b64decode(body["audio_data"].split(",", 1)[1])), dtype="float32")[0]
        assert np.abs(sent - audio[: sent.shape[0]]).max() < 1e-4 and sent.shape[0] == audio.shape[0]


async def test_known_language_translate_and_timestamps_by_either_carrier(runtime, standins):
    a, b = standins
    tok = runtime.adapter.tok
    audio = load_clip("fr", "bonjour_monde")
    options = TranscriptionOptions(language="fr", task="translate", timestamps=True)
    results = []
    for standin in (a, b):
        tr = await admitted(runtime, standin.url)
        before = len(standin.requests)
        results.append(await tr.transcribe(audio, options))
        body, verdict = standin.requests[before], standin.verdicts[before]
        if standin is a:
            # The private key: the prompt's tokens after <|startoftranscript|> are forced as the
            # first generated ones, and stripped again from what the engine reports.
            assert verdict["decoder_prompt"] == [tok.sot]
            forced_language, forced_task, first_timestamp, text = _tag(body)
            assert [forced_language, forced_task] == [{"type": "token", "token": tok.language_ids["fr"]},
                                                      {"type": "token", "token": tok.translate}]
        else:  # the plugin: the whole prompt as input_ids, and SGLang's processor keeps it
            assert verdict["decoder_prompt"] == body["input_ids"] == [tok.sot, tok.language_ids["fr"], tok.translate]
            first_timestamp, text = _tag(body)
        # Whisper's rule, as a constraint: the text opens with a timestamp of at most 1.00 s.
        assert [e["token"] for e in first_timestamp["elements"]] == list(range(tok.timestamp_begin, tok.timestamp_begin + 51))
        assert text["type"] == "any_tokens"
    for result in results:
        assert result.task == "translate" and result.language == "fr" and result.text
        assert result.segments and result.segments[0].start == 0.0 and result.segments[-1].end > 0.5
        assert all(t < tok.eot for s in result.segments for t in s.tokens)
    assert results[0].text == results[1].text


async def test_a_prompt_goes_to_a_server_with_the_plugin_only(runtime, standins):
    a, b = standins
    tok = runtime.adapter.tok
    tr = await admitted(runtime, a.url, b.url)
    a_before, b_before = len(a.requests), len(b.requests)
    options = TranscriptionOptions(previous_text="Glossary: quick brown fox.")
    assert tr.refusal(options) is None
    for _ in range(3):  # least outstanding work would share these between A and B
        result = await tr.transcribe(load_clip("en", "quick_brown_fox"), options)
        assert "quick brown fox" in result.text.lower()
    assert len(a.requests) == a_before and len(b.requests) == b_before + 3
    assert all(v["decoder_prompt"][0] == tok.sot_prev and v["decoder_prompt"] == body["input_ids"]
               for body, v in zip(b.requests[b_before:], b.verdicts[b_before:]))
    # With A alone, nothing can carry it: refused before any work, naming the plugin.
    only_a = await admitted(runtime, a.url)
    problem = only_a.refusal(options)
    assert isinstance(problem, UnsupportedDecode) and problem.param == "prompt" and "plugin" in str(problem)
    # The engine says so itself, so a request that would put the previous window's text in the
    # prompt is refused before any work too, while A and B together carry it.
    assert tr.engine.carries_prompt_text and not only_a.engine.carries_prompt_text
    conditioned = TranscriptionOptions(condition_on_previous_text=True)
    assert tr.refusal(conditioned) is None
    problem = only_a.refusal(conditioned)
    assert isinstance(problem, UnsupportedDecode) and problem.param == "condition_on_previous_text"
    assert "plugin" in str(problem)


async def test_incremental_and_cumulative_events_give_the_same_tokens(runtime, standins):
    a, b = standins
    audio = load_clip("en", "counting")
    params = decode_params(runtime.adapter, TranscriptionOptions())
    results = []
    for standin in (a, b):
        engine = engine_for(runtime, standin.url)
        stream = engine.submit(audio, params)
        events = [e.token_id async for e in stream]
        assert events == stream.result.token_ids and stream.result.finish_reason == "stop"
        results.append(stream.result)
    assert results[0].token_ids == results[1].token_ids
    assert results[0].logprobs == pytest.approx(results[1].logprobs)
    assert results[0].probe_probs == pytest.approx(results[1].probe_probs)


async def test_cancel_posts_abort_request_and_frees_the_decode(runtime, standins):
    a, _ = standins
    engine = engine_for(runtime, a.url)
    audio = np.concatenate([load_clip("en", "quick_brown_fox"), load_clip("en", "counting")] * 2)
    stream = engine.submit(audio, decode_params(runtime.adapter, TranscriptionOptions()))
    got = 0
    async for _ in stream:
        got += 1
        if got == 5:
            stream.cancel()  # what the streaming layer does when its client leaves
    assert stream.result.finish_reason == "cancelled"
    rid = a.requests[-1]["rid"]
    deadline = time.monotonic() + 10
    while (rid not in a.aborted or rid in a.active) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert rid in a.aborted and rid not in a.active  # /abort_request arrived and the decode stopped
    assert engine.figures().active_sequences == 0 and engine.figures().cancelled_sequences == 1


async def test_a_server_failing_before_output_is_retried_on_the_other(runtime, standins):
    a, b = standins
    # A stays down longer than the decode on B can take on a loaded machine, so it is still
    # down when looked at (2 s was seen to lapse first under three test workers).
    tr = await admitted(runtime, a.url, b.url, retry_after_s=60.0)
    a.faults.drop_before_output = 1
    b_before = len(b.requests)
    audio = load_clip("en", "hello_world")
    # Both idle: the tie goes to A first (least recently used), which drops the connection.
    result = await tr.transcribe(audio, TranscriptionOptions(language="en"))
    assert result.text.strip(" .").lower() == "hello world"
    assert tr.engine.retried_total == 1 and len(b.requests) == b_before + 1
    state = {s["url"]: s for s in tr.engine.pool.snapshot()}
    assert state[a.url]["state"] == "down" and state[a.url]["failures"] == 1 and state[a.url]["last_error"]
    assert state[a.url]["prompt_carrier"] is None  # checked again before it gets work
    assert state[b.url]["state"] == "up" and state[b.url]["completed"] == 2  # its canary, then the decode


async def test_a_server_failing_mid_decode_ends_the_sequence_unavailable_then_comes_back(runtime, standins):
    a, b = standins
    tr = await admitted(runtime, a.url, b.url, retry_after_s=0.5)
    b.faults.drop_after_tokens = 4
    a.faults.drop_after_tokens = 4
    with pytest.raises(EngineUnavailable, match="failed after"):
        await tr.transcribe(load_clip("en", "quick_brown_fox"), TranscriptionOptions(fallback_temperatures=()))
    # Tokens had reached the caller: no silent retry (a stream cannot take text back).
    assert tr.engine.retried_total == 0
    assert any(s["state"] == "down" for s in tr.engine.pool.snapshot())
    a.faults.drop_after_tokens = b.faults.drop_after_tokens = None
    await asyncio.sleep(0.6)  # past the retry delay: the servers pass their canaries and get work again
    result = await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions())
    assert result.language == "en" and "world" in result.text.lower()
    await tr.engine.admit()  # the one that failed passes its canary again (in the background, or here)
    assert all(s["state"] == "up" and s["prompt_carrier"] for s in tr.engine.pool.snapshot())


# What each broken reply is called in the reason the front gives (in /health, the log, the error).
FAULT_REASONS = {"no_logprobs": "no logprobs in the reply", "no_output_ids": "no output_ids",
                 "bad_json": "not JSON", "http_500": "HTTP 500", "truncated": "without a finish reason"}


async def wait_for_state(engine, url: str, state: str, seconds: float = 10.0) -> dict:
    """The backend's snapshot once it is in ``state`` (its canary runs in the background)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        snapshot = next(b for b in engine.pool.snapshot() if b["url"] == url)
        if snapshot["state"] == state:
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} not {state} in {seconds} s: {engine.pool.snapshot()}")


@pytest.fixture
def no_lost_task_errors(caplog):
    """After the test: no task died with an exception nobody retrieved (asyncio logs those when
    the task is collected)."""
    yield
    gc.collect()
    assert "never retrieved" not in caplog.text and "Traceback" not in caplog.text, caplog.text


@pytest.mark.parametrize("fault", REPLY_FAULTS)
async def test_a_server_that_answers_its_canary_wrongly_is_out_with_the_reason_then_admitted_when_it_heals(
        runtime, standins, fault, no_lost_task_errors):
    a, _ = standins
    a.faults.reply_fault, a.faults.reply_fault_on = fault, "canary"
    tr = remote(runtime, a.url, retry_after_s=0.3)
    sent_before = len(a.requests)
    with pytest.raises(EngineUnavailable, match=FAULT_REASONS[fault]):
        await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions())
    snapshot = tr.engine.pool.snapshot()[0]
    assert snapshot["state"] == "down" and FAULT_REASONS[fault] in snapshot["last_error"]
    assert all(body["rid"].startswith("asr-canary-") for body in a.requests[sent_before:])  # no work went to it
    a.faults = Faults()
    # Its retry time comes: the canary runs again without any request, and it is admitted.
    await wait_for_state(tr.engine, a.url, "up")
    result = await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions(language="en"))
    assert "world" in result.text.lower()
    tr.engine.shutdown()


@pytest.mark.parametrize("fault", REPLY_FAULTS)
async def test_a_broken_reply_to_a_decode_is_a_clear_error_at_once_and_the_server_is_rechecked(
        runtime, standins, fault, no_lost_task_errors):
    a, _ = standins
    tr = await admitted(runtime, a.url, retry_after_s=0.3)
    a.faults.reply_fault, a.faults.reply_fault_on = fault, "work"
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match=FAULT_REASONS[fault]):
        await tr.transcribe(load_clip("fr", "bonjour_monde"), TranscriptionOptions(language="fr"))
    assert time.monotonic() - started < 3  # the decode of a 1 s clip, not a hang
    assert tr.engine.figures().active_sequences == 0
    a.faults = Faults()
    await wait_for_state(tr.engine, a.url, "up")
    result = await tr.transcribe(load_clip("fr", "bonjour_monde"), TranscriptionOptions())
    assert result.language == "fr" and "bonjour" in result.text.lower()  # never an empty transcript
    tr.engine.shutdown()


@pytest.mark.parametrize("fault", REPLY_FAULTS)
@pytest.mark.parametrize("at", ["canary", "work"])
async def test_with_a_healthy_server_beside_it_every_request_is_served(runtime, standins, fault, at,
                                                                        no_lost_task_errors):
    a, b = standins
    a.faults.reply_fault, a.faults.reply_fault_on = fault, at
    # At admission: A breaks its first canary. Mid-decode: both were admitted, then A breaks work.
    tr = remote(runtime, a.url, b.url, retry_after_s=30) if at == "canary" else await admitted(
        runtime, a.url, b.url, retry_after_s=30)
    for i, name in enumerate(("hello_world", "quick_brown_fox", "hello_world")):
        if i == 0 and fault == "truncated" and at == "work":
            # Found only at the end, when the tokens have reached the caller: no silent retry
            # (what was shown cannot be taken back), a clear error at once instead.
            with pytest.raises(EngineUnavailable, match=FAULT_REASONS[fault]):
                await tr.transcribe(load_clip("en", name), TranscriptionOptions(fallback_temperatures=()))
            continue
        result = await tr.transcribe(load_clip("en", name), TranscriptionOptions(fallback_temperatures=()))
        assert result.text.strip(), name
    state = {s["url"]: s for s in tr.engine.pool.snapshot()}
    assert state[a.url]["state"] == "down" and FAULT_REASONS[fault] in state[a.url]["last_error"]
    assert state[b.url]["state"] == "up"
    tr.engine.shutdown()


async def test_no_server_reachable_is_unavailable_with_the_reason(runtime):
    tr = remote(runtime, "http://127.0.0.1:9", "http://127.0.0.1:1")
    with pytest.raises(EngineUnavailable, match="ConnectError"):
        await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions())
    assert all(s["state"] == "down" for s in tr.engine.pool.snapshot())


async def test_current_sglang_without_the_plugin_gets_no_traffic_and_says_why(runtime, sglang_judges):
    newer = standin(runtime, sglang_judges, CURRENT)
    try:
        tr = remote(runtime, newer.url)
        with pytest.raises(EngineUnavailable, match="asr_whisper_prompt plugin"):
            await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions())
        error = tr.engine.pool.snapshot()[0]["last_error"]
        # input_ids: SGLang's processor replaced the prompt (canary answered text); the private
        # key: refused by the 0.5.23 contract gate (SGLang's own message).
        assert "ignores the decoder prompt" in error and "unknown field `_detect_language`" in error, error
        assert all(body["rid"].startswith("asr-canary-") for body in newer.requests)  # no real work was sent
    finally:
        newer.stop()


async def test_a_router_that_drops_the_constraint_gets_no_traffic(runtime, sglang_judges):
    """sglang-router / smg forward input_ids but their SamplingParams has no structural_tag."""
    router = standin(runtime, sglang_judges, CURRENT, plugin=True, drops_constraint=True)
    try:
        tr = remote(runtime, router.url)
        with pytest.raises(EngineUnavailable, match="does not apply the constraint"):
            await tr.transcribe(load_clip("en", "hello_world"), TranscriptionOptions())
        assert all(body["rid"].startswith("asr-canary-") for body in router.requests)
    finally:
        router.stop()


async def test_a_request_the_server_refuses_is_an_error_not_a_dead_server(runtime, standins):
    a, _ = standins
    engine = engine_for(runtime, a.url)
    params = decode_params(runtime.adapter, TranscriptionOptions(temperature=0.5))
    stream = engine.submit(load_clip("en", "hello_world"), replace(params, top_k=-5))  # SamplingParams.verify refuses
    await stream.collect()
    assert stream.result.finish_reason == "error" and "top_k" in stream.result.error
    assert engine.pool.snapshot()[0]["state"] == "up"


def test_what_sglang_cannot_carry_is_refused_before_sending(runtime):
    tr = remote(runtime, "http://127.0.0.1:9")
    for options, param in ((TranscriptionOptions(word_timestamps=True), "timestamp_granularities"),
                           (TranscriptionOptions(beam_size=4), "beam_size"),
                           (TranscriptionOptions(audio_sized_encoder=True), "audio_sized_encoder")):
        problem = tr.refusal(options)
        assert isinstance(problem, UnsupportedDecode) and problem.param == param, (options, problem)
    assert tr.refusal(TranscriptionOptions(language="de", timestamps=True, task="translate")) is None


def test_the_standin_answers_what_sglangs_own_code_says(standins):
    a, b = standins
    audio = "data:audio/wav;base64," + base64.b64encode(wav_bytes(np.zeros(1600, np.float32))).decode()
    good = {"rid": "r1", "text": "", "audio_data": audio, "stream": False,
            "sampling_params": {"_detect_language": True, "max_new_tokens": 2}}
    assert httpx.post(a.url + "/generate", json=good, timeout=60).status_code == 200
    for change in ({"sampling_params": {"_detect_language": True, "max_tokens": 2}},  # not a SamplingParams field
                   {"sampling_params": {"temperature": -1}},
                   {"sampling_params": {"regex": ".*", "structural_tag": "{}"}},
                   {"sampling_params": {"language": "xx"}},  # SGLang's processor: not a language
                   {"audio_data": "aGVsbG8="},  # not audio
                   {"text": None}):  # neither text nor input_ids: SGLang's GenerateReqInput refuses it
        r = httpx.post(a.url + "/generate", json={**good, **change}, timeout=60)
        verdict = a.verdicts[-1]
        said = verdict["request_error"] or verdict["processor_error"] or verdict["sampling_error"]
        assert r.status_code == 400 and said and r.json()["error"]["message"] == said, (change, r.text)
    # 0.5.23's contract gate, with its own message.
    r = httpx.post(b.url + "/generate", json=good, timeout=60)
    assert r.status_code == 400 and r.json()["error"] == b.verdicts[-1]["contract_error"]
    assert "unknown field `_detect_language`" in r.json()["error"]


# ---- a live front: asr-service serve --engine sglang ----

@pytest.fixture(scope="module")
def front(standins, start_server):
    a, b = standins
    # A failed server stays out 30 s, so what /health says right after a failure is certain. A
    # deployment moving from SGLang: plain stream=true sends SGLang's chunks.
    return start_server("--engine", "sglang", "--sglang-url", a.url, b.url, "--served-model-name", "whisper-1",
                        "--sglang-retry-after", "30", "--default-stream-format", "chunk")


def test_front_warms_every_backend_and_reports_them(front, standins):
    health = httpx.get(front.url + "/health").json()
    assert health["status"] == "ok" and health["engine"] == "sglang"
    assert [b["url"] for b in health["backends"]] == [s.url for s in standins]
    assert all(b["state"] == "up" and b["completed"] >= 8 for b in health["backends"])  # 8 warm variants each
    # Each passed its canary before the warm decodes: A by the private key, B as input_ids.
    assert [b["prompt_carrier"] for b in health["backends"]] == ["detect_key", "input_ids"]
    metrics = httpx.get(front.url + "/metrics").text
    for s, carrier in zip(standins, ("detect_key", "input_ids")):
        assert f'asr_backend_up{{url="{s.url}"}} 1.0' in metrics
        assert f'asr_backend_info{{last_error="",prompt_carrier="{carrier}",state="up",url="{s.url}"}} 1.0' in metrics


def test_front_sdk_fused_detection_and_verbose_json(front):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with open(clip_path("fr", "bonjour_monde"), "rb") as f:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     timestamp_granularities=["segment"])
    assert verbose.language == "fr" and "bonjour" in verbose.text.lower()
    assert verbose.segments and verbose.segments[-1].end > verbose.segments[0].start
    with open(clip_path("en", "hello_world"), "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text.strip(" .").lower() == "hello world"


def test_front_streams_deltas_and_a_client_that_leaves_aborts_the_decode(front, standins):
    fox = clip_path("en", "quick_brown_fox").read_bytes()
    # An SGLang / vLLM client: plain stream=true, choices[0].delta.content (--default-stream-format chunk).
    r = httpx.post(front.url + "/v1/audio/transcriptions", data={"stream": "true"},
                   files={"file": ("fox.wav", fox, "audio/wav")}, timeout=120)
    chunks = [json.loads(e) for e in sse_events(r)[:-1]]
    assert all(c["object"] == "transcription.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "quick brown fox" in content.lower() and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # An OpenAI SDK client on the same server still gets OpenAI's events by naming them.
    r = httpx.post(front.url + "/v1/audio/transcriptions", data={"stream": "true", "stream_format": "openai"},
                   files={"file": ("fox.wav", fox, "audio/wav")}, timeout=120)
    payloads = [json.loads(e) for e in sse_events(r)[:-1]]
    deltas = [p["delta"] for p in payloads if p["type"] == "transcript.text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == payloads[-1]["text"] == content

    aborted_before = sum(len(s.aborted) for s in standins)
    audio = np.concatenate([load_clip("en", "quick_brown_fox"), load_clip("en", "counting")] * 2)
    with httpx.stream("POST", front.url + "/v1/audio/transcriptions", data={"stream": "true"},
                      files={"file": ("long.wav", wav_bytes(audio), "audio/wav")}, timeout=120) as stream:
        assert stream.status_code == 200
        deadline = time.monotonic() + 30
        while not any(s.active for s in standins):  # leave while a stand-in decodes for this stream
            assert time.monotonic() < deadline
            time.sleep(0.01)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        health = httpx.get(front.url + "/health").json()
        if sum(len(s.aborted) for s in standins) > aborted_before and health["active_sequences"] == 0:
            break
        time.sleep(0.1)
    assert sum(len(s.aborted) for s in standins) > aborted_before
    assert health["active_sequences"] == 0 and all(b["outstanding"] == 0 for b in health["backends"]), health
    assert not any(s.active for s in standins)


async def test_front_realtime_session_decodes_through_sglang(front, standins):
    import websockets


    sent_before = sum(len(s.requests) for s in standins)
    pcm = (np.clip(load_clip("en", "quick_brown_fox"), -1, 1) * 32767).astype("<i2").tobytes()
    async with websockets.connect(front.url.replace("http://", "ws://") + "/v1/realtime") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": "whisper-1"}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for i in range(0, len(pcm), 3200):
            await ws.send(append(pcm[i : i + 3200]))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        async with asyncio.timeout(60):
            while (event := json.loads(await ws.recv()))["type"] != "transcription.done":
                assert event["type"] != "error", event
    assert event["language"] == "en" and "quick brown fox" in event["text"].lower(), event
    assert sum(len(s.requests) for s in standins) > sent_before  # decoded by the SGLang stand-ins


def test_front_keeps_serving_when_one_backend_fails_mid_request(front, standins):
    a, b = standins
    a.faults.drop_before_output = 3
    b_sent = len(b.requests)
    files = {"file": ("hello.wav", clip_path("en", "hello_world").read_bytes(), "audio/wav")}
    for _ in range(3):
        r = httpx.post(front.url + "/v1/audio/transcriptions", files=files, timeout=120)
        assert r.status_code == 200 and "world" in r.json()["text"].lower()
    health = httpx.get(front.url + "/health").json()
    state = {x["url"]: x for x in health["backends"]}
    # A dropped the first request before any token: retried on B; A then stays out (30 s here).
    assert a.faults.drop_before_output == 2 and len(b.requests) == b_sent + 3
    assert health["status"] == "degraded" and state[a.url]["state"] == "down" and state[a.url]["failures"] == 1
    assert 'asr_backend_up{url="%s"} 0.0' % a.url in httpx.get(front.url + "/metrics").text


def test_front_sends_a_prompt_to_the_server_with_the_plugin_and_reports_dead_backends(front, standins):
    a, b = standins
    files = {"file": ("hello.wav", clip_path("en", "hello_world").read_bytes(), "audio/wav")}
    b_before = len(b.requests)
    r = httpx.post(front.url + "/v1/audio/transcriptions", data={"prompt": "Glossary: world."}, files=files, timeout=60)
    assert r.status_code == 200 and "world" in r.json()["text"].lower()
    assert b.requests[b_before]["input_ids"][0] == b.verdicts[b_before]["decoder_prompt"][0]  # <|startofprev|>
    r = httpx.post(front.url + "/v1/audio/transcriptions", data={"timestamp_granularities[]": "word",
                                                                 "response_format": "verbose_json"}, files=files, timeout=60)
    assert_openai_error(r, 400, param="timestamp_granularities", code="unsupported_by_engine")
    for s in standins:
        s.faults.drop_after_tokens = 2
    r = httpx.post(front.url + "/v1/audio/transcriptions", data={"temperature_fallback": "false"}, files=files,
                   timeout=60)
    assert_openai_error(r, 503, code="backend_unavailable")
    assert r.headers["retry-after"]


def test_a_front_whose_backend_answers_without_logprobs_serves_on_the_other_and_readmits_it(standins, start_server):
    """The version-mismatch case: A answers every /generate without the logprobs the body asks
    for, from the front's start on. The front comes up on B, says why A is out, serves every
    request, and takes A back once A answers correctly; its log shows no task that died."""
    a, b = standins
    a.faults.reply_fault = "no_logprobs"
    sent_before = len(a.requests)
    front = start_server("--engine", "sglang", "--sglang-url", a.url, b.url, "--sglang-retry-after", "1")
    health = httpx.get(front.url + "/health").json()
    state = {x["url"]: x for x in health["backends"]}
    assert health["status"] == "degraded" and state[a.url]["state"] in ("down", "unchecked")
    assert "no logprobs in the reply" in state[a.url]["last_error"]
    assert 'last_error="its canary decode failed: malformed reply: no logprobs' in httpx.get(front.url + "/metrics").text
    files = {"file": ("hello.wav", clip_path("en", "hello_world").read_bytes(), "audio/wav")}
    for _ in range(3):
        r = httpx.post(front.url + "/v1/audio/transcriptions", files=files, timeout=60)
        assert r.status_code == 200 and "world" in r.json()["text"].lower(), r.text
    assert all(body["rid"].startswith("asr-canary-") for body in a.requests[sent_before:])  # no work went to A
    a.faults = Faults()
    deadline = time.monotonic() + 20
    while httpx.get(front.url + "/health").json()["status"] != "ok":
        assert time.monotonic() < deadline, httpx.get(front.url + "/health").json()
        time.sleep(0.2)
    log = front.log_path.read_text()
    assert "is out: its canary decode failed: malformed reply: no logprobs" in log
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]


def test_fused_timestamps_constraint_opens_with_an_early_timestamp(runtime):
    from asr_service.engine.sglang.wire import constraint

    tok = runtime.adapter.tok
    params = decode_params(runtime.adapter, TranscriptionOptions(timestamps=True))
    elements = json.loads(constraint(params, Carrier.DETECT_KEY))["format"]["elements"]
    languages, task, first_timestamp, text = elements
    assert len(languages["elements"]) == len(tok.language_ids) and task == {"type": "token", "token": tok.transcribe}
    assert [e["token"] for e in first_timestamp["elements"]] == list(range(tok.timestamp_begin, tok.timestamp_begin + 51))
    assert text["type"] == "any_tokens" and tok.timestamp_begin not in text["exclude_tokens"]

