"""Auth, backpressure, upload limits, metrics and request logs through a live server on loopback."""

import asyncio
import contextlib
import hmac
import json
import socket
import subprocess
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import websockets

from asr_service.server.auth import ApiKeys, keys_from
from support.clips import clip_path, load_clip
from support.redecodes import redecodes, redecodes_since
from tests.helpers import assert_openai_error, one_hertz_bomb, wav_bytes

pytestmark = pytest.mark.server

KEYS = ("sk-test-first-0123456789", "sk-test-second-abcdefghij")
ENV_KEY = "sk-test-from-env-zyxwvu"
MAX_BYTES = 4_000_000
MAX_PENDING = 2


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("--threads", "2", "--served-model-name", "whisper-1", "--api-key", KEYS[0],
                        "--api-key", KEYS[1], "--max-bytes", str(MAX_BYTES), "--max-pending-requests", str(MAX_PENDING),
                        env={"ASR_API_KEYS": ENV_KEY})  # read by the server process at start


def auth(key: str = KEYS[0]) -> dict:
    return {"Authorization": f"Bearer {key}"}


def clip_upload(name: str = "hello_world"):
    return {"file": (f"{name}.wav", clip_path("en", name).read_bytes(), "audio/wav")}


# ---- auth ----

def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    keys = ApiKeys(("key-one", "key-two", "key-three"))
    assert keys.accepts("key-one") and not keys.accepts("key-on") and not keys.accepts(None)
    assert len(calls) == 9  # all three keys, each time, even after a match
    assert keys_from(["a", "b"], {"ASR_API_KEYS": " c, a ,"}) == ("a", "b", "c")
    assert ApiKeys(()).accepts(None)  # no keys configured: open
    unicode_key = ApiKeys(("clé-ünï",))
    assert unicode_key.accepts("clé-ünï".encode().decode("latin-1"))  # its UTF-8 bytes, as a server hands them on
    assert not unicode_key.accepts("clé-ünï".encode("latin-1").decode("latin-1"))  # its latin-1 bytes


@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("POST", "/v1/audio/transcriptions"),
                                          ("POST", "/v1/audio/translations"), ("GET", "/metrics")])
def test_every_route_needs_a_key(server, method, path):
    for headers, presented in (({}, False), (auth("sk-wrong"), True), ({"Authorization": KEYS[0]}, False)):
        r = httpx.request(method, server.url + path, headers=headers, files=clip_upload() if method == "POST" else None)
        error = assert_openai_error(r, 401, code="invalid_api_key")
        assert r.headers["www-authenticate"] == "Bearer"
        assert ("Incorrect" in error["message"]) == presented
    for key in (*KEYS, ENV_KEY):
        r = httpx.request(method, server.url + path, headers=auth(key), files=clip_upload() if method == "POST" else None,
                          timeout=60)
        assert r.status_code == 200, r.text


def test_health_and_the_page_stay_open(server):
    assert httpx.get(server.url + "/health").status_code == 200
    head = httpx.head(server.url + "/health")  # load balancers probe with HEAD
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/page/workbench.js").status_code == 200


def test_openai_sdk_with_the_key(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS[1], max_retries=0)
    assert client.audio.transcriptions.create(model="whisper-1", file=clip_path("en", "hello_world").open("rb")).text \
        == "Hello world."
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-nope", max_retries=0).models.list()


async def test_realtime_needs_a_key_in_the_header_or_the_subprotocol(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with websockets.connect(url) as ws:
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["error"]["code"] == "invalid_api_key"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 1008
    async with websockets.connect(url, additional_headers=auth()) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
    # A key in the URL is refused, and uvicorn's log line of the handshake does not show it.
    async with websockets.connect(url + f"&api_key={KEYS[0]}") as ws:
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_api_key"
    await asyncio.sleep(0.2)
    log = server.log_path.read_text()
    assert KEYS[0] not in log and "/v1/realtime?intent=transcription&api_key=REDACTED" in log
    # A browser's form: the key rides in a subprotocol; the server answers with "realtime" only.
    async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEYS[1]}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"


def test_request_ids_and_json_logs_without_keys(server):
    r = httpx.post(server.url + "/v1/audio/transcriptions", headers={**auth(), "X-Request-Id": "trace-42"},
                   files=clip_upload())
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
    generated = httpx.get(server.url + "/v1/models", headers=auth()).headers["x-request-id"]
    assert len(generated) == 32
    httpx.get(server.url + "/v1/models", headers=auth("sk-wrong-key-for-the-log"))
    time.sleep(0.2)
    log = server.log_path.read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    ours = [line for line in lines if line["request_id"] == "trace-42"]
    assert len(ours) == 1 and ours[0]["path"] == "/v1/audio/transcriptions" and ours[0]["status"] == 200
    assert [line["status"] for line in lines if line["request_id"] == generated] == [200]
    for secret in (*KEYS, ENV_KEY, "sk-wrong-key-for-the-log"):
        assert secret not in log


# ---- limits ----

def test_upload_past_the_limit_is_refused_while_it_is_read(server):
    """A chunked upload (no Content-Length) of 64 MB against a 4 MB limit: the server stops
    reading after the limit, answers 413 and closes; the client, still sending, sees the 413 or
    the connection reset, long before the body is all sent."""
    total, sent, reply, reset = 64 * 1024 * 1024, 0, b"", False
    boundary = "x" * 16
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode()
    block = b"\0" * 65536
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall((f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS[0]}\r\n"
                   f"Content-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\r\n"
                   ).encode() + b"%x\r\n%s\r\n" % (len(head), head))
        s.settimeout(0.05)
        try:
            while sent < total and b"}}" not in reply:
                try:
                    s.sendall(b"%x\r\n%s\r\n" % (len(block), block))
                    sent += len(block)
                except TimeoutError:  # the server is not reading
                    pass
                try:
                    reply += s.recv(65536)
                except TimeoutError:
                    pass
        except (BrokenPipeError, ConnectionResetError):
            reset = True
    assert sent < total / 4, sent  # the server stopped reading after a few MB of 64
    if not reset:
        assert reply.startswith(b"HTTP/1.1 413 ") and b'"code":"file_too_large"' in reply, reply[:400]
    assert httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload()).status_code == 200


def test_a_tiny_file_that_decodes_into_hours_is_refused_and_others_are_served(server):
    r = httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(),
                   files={"file": ("bomb.wav", one_hertz_bomb(), "audio/wav")}, timeout=30)
    error = assert_openai_error(r, 400, code="invalid_audio")
    assert error["param"] == "file" and "1 Hz" in error["message"]
    assert httpx.get(server.url + "/health").json()["pending_requests"] == 0
    assert httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload()).status_code == 200


def test_a_huge_prompt_neither_stalls_the_server_nor_the_request(server):
    """A prompt of 900 KB (near the form's per-field limit) is cut to Whisper's prompt budget by
    characters before it is tokenized: /health stays quick and the clip is transcribed."""
    slowest, answer = 0.0, {}
    worker = threading.Thread(target=lambda: answer.update(r=httpx.post(
        server.url + "/v1/audio/transcriptions", headers=auth(), data={"prompt": "Quick brown fox. " * 52_000},
        files=clip_upload(), timeout=60)))
    worker.start()
    while worker.is_alive():
        started = time.monotonic()
        assert httpx.get(server.url + "/health").status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    assert answer["r"].status_code == 200 and answer["r"].json()["text"] == "Hello world.", answer["r"].text
    assert slowest < 1.0, slowest


def wait_for_health(url: str, figure: str, at_least: int, timeout: float = 30) -> None:
    """Poll /health until ``figure`` reaches ``at_least`` (or the timeout passes: the caller's
    assertions then say what was missing)."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/health").json()[figure] < at_least and time.monotonic() < deadline:
        time.sleep(0.02)


def long_speech(seconds: float) -> bytes:
    clip = load_clip("en", "quick_brown_fox")
    return wav_bytes(np.tile(clip, int(seconds / (len(clip) / 16000)) + 1)[: int(seconds * 16000)])


def test_work_past_the_bound_gets_429_with_retry_after(server):
    # Three different sentences (one said again and again without a pause would send the decode
    # through the whole fallback): two of these keep the engine busy for a few seconds.
    gap = np.zeros(8000, np.float32)
    body = wav_bytes(np.concatenate([part for name in ("quick_brown_fox", "counting", "hello_world")
                                     for part in (load_clip("en", name), gap)]))
    results = []

    def post_long():
        r = httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(),
                       files={"file": ("long.wav", body, "audio/wav")}, timeout=300)
        results.append(r.status_code)

    threads = [threading.Thread(target=post_long) for _ in range(MAX_PENDING)]
    for t in threads:
        t.start()
    wait_for_health(server.url, "pending_requests", MAX_PENDING)
    r = httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload())
    error = assert_openai_error(r, 429, code="server_busy")
    assert error["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
    for t in threads:
        t.join()
    assert results == [200] * MAX_PENDING  # the admitted ones were answered
    health = httpx.get(server.url + "/health").json()
    assert health["pending_requests"] == 0 and health["active_sequences"] == 0
    assert httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload()).status_code == 200


def test_metrics_report_requests_engine_and_detection(server):
    httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload())
    text = httpx.get(server.url + "/metrics", headers=auth()).text
    for line in ('asr_requests_total{endpoint="/v1/audio/transcriptions",status="200"}',
                 'asr_requests_total{endpoint="/v1/models",status="401"}',
                 'asr_language_detections_total{language="en",outcome="detected"}',
                 'asr_rejected_requests_total{reason="overloaded"}',
                 "asr_request_duration_seconds_bucket{endpoint=\"/v1/audio/transcriptions\",le=\"+Inf\"}",
                 'asr_audio_seconds_total{endpoint="/v1/audio/transcriptions"}',
                 "asr_active_sequences 0.0", "asr_queued_sequences 0.0", "asr_pending_requests 0.0",
                 "asr_decoded_tokens_total", 'asr_batch_size_bucket{le="16"}', "asr_warmup_seconds"):
        assert line in text, line
    values = {l.split(" ")[0]: float(l.split(" ")[1]) for l in text.splitlines() if l and not l.startswith("#")}
    assert values["asr_decoded_tokens_total"] > 0 and values['asr_batch_size_bucket{le="+Inf"}'] > 0
    # The engine's time by phase: a transcription encodes, runs decoder steps and projects them.
    phases = {k.split('"')[1]: v for k, v in values.items() if k.startswith("asr_engine_phase_seconds_total{")}
    assert set(phases) == {"encoder", "prefill", "decoder_layers", "vocabulary_projection", "logits_pipeline",
                           "beam_search", "word_alignment"}
    assert all(phases[p] > 0 for p in ("encoder", "decoder_layers", "vocabulary_projection", "logits_pipeline"))


def test_metrics_count_redecodes_by_the_rule_that_asked(server):
    """A window sent to the temperature fallback is counted under the rule it failed: no decode
    has an average log-probability above 0, so log_prob_threshold=0 fails every one."""
    before = redecodes(server.url, auth())
    r = httpx.post(server.url + "/v1/audio/transcriptions", headers=auth(), files=clip_upload(),
                   data={"log_prob_threshold": "0"}, timeout=120)
    assert r.status_code == 200, r.text
    assert redecodes_since(server.url, before, auth()) == {"avg_logprob": 1}


# ---- deadline and shutdown: a server of their own ----

def test_request_deadline_then_sigterm_drains_in_flight_work(start_server):
    proc = start_server("--threads", "2", "--request-timeout", "4", "--shutdown-grace", "60")
    r = httpx.post(proc.url + "/v1/audio/transcriptions", files={"file": ("long.wav", long_speech(120), "audio/wav")},
                   timeout=60)
    assert_openai_error(r, 504, code="timeout")
    # The cancelled decodes leave the engine at its next step (those still queued at its next
    # admission, a moment later).
    deadline = time.monotonic() + 5

    def busy(health: dict) -> bool:
        return bool(health["active_sequences"] or health["queued_sequences"] or health["pending_requests"])

    while busy(health := httpx.get(proc.url + "/health").json()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert health["active_sequences"] == 0 and health["queued_sequences"] == 0 and health["pending_requests"] == 0

    # An upload that trickles in is pending work from its first byte, and the deadline covers it.
    host, port = proc.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\n\r\n--b\r\n")
        started = time.monotonic()
        wait_for_health(proc.url, "pending_requests", 1, timeout=3)
        assert httpx.get(proc.url + "/health").json()["pending_requests"] == 1
        sock.setblocking(False)
        reply = b""
        while b'"code":"timeout"' not in reply and time.monotonic() - started < 15:
            with contextlib.suppress(OSError):
                sock.send(b"x")  # 10 bytes a second
            time.sleep(0.1)
            with contextlib.suppress(BlockingIOError):
                reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"timeout"' in reply, reply[:300]
    assert httpx.get(proc.url + "/health").json()["pending_requests"] == 0

    answer = {}
    body = wav_bytes(load_clip("en", "quick_brown_fox"))
    worker = threading.Thread(target=lambda: answer.update(r=httpx.post(
        proc.url + "/v1/audio/transcriptions", files={"file": ("fox.wav", body, "audio/wav")}, timeout=60)))
    worker.start()
    wait_for_health(proc.url, "pending_requests", 1, timeout=10)
    proc.proc.send_signal(subprocess.signal.SIGTERM)
    time.sleep(0.2)
    refused = httpx.post(proc.url + "/v1/audio/transcriptions", files=clip_upload())
    assert_openai_error(refused, 503, code="shutting_down")
    worker.join()
    assert answer["r"].status_code == 200 and answer["r"].json()["text"] == \
        "The quick brown fox jumps over the lazy dog."
    assert proc.proc.wait(timeout=30) == 0


def test_work_still_running_when_the_grace_ends_gets_proper_endings(start_server):
    """SIGTERM with a 2 s grace while a long request, a long stream and a realtime session are
    inside: at the end of the grace each client gets an ending in its own protocol (a 503 in the
    OpenAI shape; an error event and [DONE]; an error event and close 1012), and the process
    exits cleanly soon after."""
    proc = start_server("--threads", "2", "--shutdown-grace", "2")
    body = long_speech(150)
    endings: dict = {}

    def plain():
        endings["plain"] = httpx.post(proc.url + "/v1/audio/transcriptions",
                                      files={"file": ("long.wav", body, "audio/wav")}, timeout=60)

    def streamed():
        with httpx.stream("POST", proc.url + "/v1/audio/transcriptions", data={"stream": "true"},
                          files={"file": ("long.wav", body, "audio/wav")}, timeout=60) as r:
            endings["stream"] = [line for line in r.iter_lines() if line.startswith("data:")]

    def realtime():
        async def session():
            async with websockets.connect(proc.url.replace("http://", "ws://") + "/v1/realtime") as ws:
                received = [json.loads(await ws.recv())]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    while True:
                        received.append(json.loads(await ws.recv()))
                endings["realtime"] = (received, closed.value.rcvd.code if closed.value.rcvd else None)

        asyncio.run(session())

    clients = [threading.Thread(target=f) for f in (plain, streamed, realtime)]
    for client in clients:
        client.start()
    wait_for_health(proc.url, "pending_requests", 2)
    signalled = time.monotonic()
    proc.proc.send_signal(subprocess.signal.SIGTERM)
    for client in clients:
        client.join(timeout=30)
    assert proc.proc.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 2 + 5  # the grace, the endings, uvicorn's own stop

    assert_openai_error(endings["plain"], 503, code="shutting_down")
    assert endings["stream"][-1] == "data: [DONE]"
    assert json.loads(endings["stream"][-2].removeprefix("data:"))["error"]["code"] == "shutting_down"
    events, close_code = endings["realtime"]
    assert events[0]["type"] == "session.created" and events[-1]["type"] == "error"  # vLLM's error event
    assert events[-1]["code"] == "shutting_down" and close_code == 1012


def test_a_second_signal_exits_at_once_and_cleanly(start_server):
    """SIGTERM starts a 30 s drain; SIGINT then stops the server at once, with a long decode
    still running in the engine, and the process exits 0 (not torch's abort at teardown)."""
    proc = start_server("--threads", "2", "--shutdown-grace", "30")
    body = long_speech(150)
    def post():
        with contextlib.suppress(httpx.HTTPError):  # cut off by the forced stop: any ending will do here
            httpx.post(proc.url + "/v1/audio/transcriptions", files={"file": ("long.wav", body, "audio/wav")}, timeout=60)

    worker = threading.Thread(target=post)
    worker.start()
    wait_for_health(proc.url, "active_sequences", 1)
    proc.proc.send_signal(subprocess.signal.SIGTERM)
    time.sleep(0.3)
    signalled = time.monotonic()
    proc.proc.send_signal(subprocess.signal.SIGINT)
    assert proc.proc.wait(timeout=30) == 0
    assert time.monotonic() - signalled < 5
    worker.join(timeout=60)
