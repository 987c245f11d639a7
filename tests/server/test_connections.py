"""Connection hygiene through a live server on loopback: silent and slow connections are timed
out, an answer sent before the body is read reaches the client, connections past the cap are
refused in the OpenAI shape, and a flood of them neither floods the log nor runs the process
out of files."""

import contextlib
import json
import resource
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from asr_service.server.connections import LOG_EVERY_SECONDS
from support.clips import clip_path

pytestmark = pytest.mark.server

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
KEEP_ALIVE = 1.0
LINGERING_TIME = 8.0  # far enough past a pause's close (BODY_TIMEOUT after it) to tell them apart
OPEN_FILES = 440  # the server's limit: its cap is then 88 connections


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("--threads", "2", "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout",
                        str(BODY_TIMEOUT), "--keep-alive-timeout", str(KEEP_ALIVE), "--lingering-time", str(LINGERING_TIME),
                        open_files=OPEN_FILES)


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_to_end(sock: socket.socket, timeout: float = 15) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data, time.monotonic() - started


def error_of(reply: bytes, status: int) -> dict:
    """The OpenAI-shaped error of a raw HTTP reply, checked whole."""
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), reply[:300]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    with connect(server) as sock:
        data, took = read_to_end(sock)
    assert data == b"" and HEADER_TIMEOUT - 0.5 < took < HEADER_TIMEOUT + 2, took


def test_headers_dripped_a_byte_at_a_time_get_408_while_others_are_served(server):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
    with connect(server) as sock:
        started = time.monotonic()
        sock.settimeout(0.2)
        reply = b""
        for byte in request:  # ~5 bytes a second: never done within the timeout
            with contextlib.suppress(OSError):
                sock.send(bytes([byte]))
            with contextlib.suppress(TimeoutError):
                if not (chunk := sock.recv(65536)):
                    break
                reply += chunk
            if time.monotonic() - started > 1:  # meanwhile a well-behaved client is served at once
                assert httpx.get(server.url + "/health", timeout=2).status_code == 200
        took = time.monotonic() - started
    error = error_of(reply, 408)
    assert error["code"] == "timeout" and error["type"] == "timeout_error" and took < HEADER_TIMEOUT + 2, took


def test_an_upload_that_stops_gets_408_and_frees_its_place(server):
    with connect(server) as sock:
        sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\n\r\n--b\r\n")
        reply, took = read_to_end(sock)
    error = error_of(reply, 408)
    assert error["code"] == "timeout" and "nothing arrived" in error["message"]
    assert took < 2 * BODY_TIMEOUT + 2, took  # answered, then closed when no more of the body came
    assert httpx.get(server.url + "/health").json()["pending_requests"] == 0


def test_an_idle_connection_after_a_response_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply, took = read_to_end(sock)
    assert reply.startswith(b"HTTP/1.1 200 ") and took < KEEP_ALIVE + 2, took


def test_a_client_still_sending_reads_the_early_answer(server):
    """An answer sent before the body is read (here 404: no such route) reaches a client that
    sends its whole body before reading, instead of a reset."""
    with connect(server) as sock:
        sock.sendall(b"POST /v1/audio/transcription HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
                     b"Content-Length: 3000000\r\n\r\n" + b"x" * 3_000_000)
        sock.settimeout(10)
        reply = b""
        while b"}}" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
    assert error_of(reply, 404)["type"] == "not_found_error"


def send_after_an_early_answer(server, pause_after: float | None) -> tuple[bytes, float]:
    """Declare a 100 GB upload (413 at once) and go on sending, stopping after ``pause_after``
    seconds (None: never); what the server sent, and when it closed the connection."""
    with connect(server) as sock:
        sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
        started, reply, closed = time.monotonic(), b"", False
        sock.settimeout(0.05)
        while not closed and time.monotonic() - started < LINGERING_TIME + 5:
            try:
                if pause_after is None or time.monotonic() - started < pause_after:
                    sock.sendall(b"\0" * 65536)
                chunk = sock.recv(65536)
                reply += chunk
                closed = chunk == b""
            except TimeoutError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "the server kept the connection open"
        return reply, time.monotonic() - started


def test_a_body_sent_after_its_answer_is_dropped_while_it_comes_for_a_bounded_time(server):
    """The client reads the 413 it was sent early; the server drops what follows, closing the
    connection when the client pauses longer than the body timeout, or after the lingering time
    of sending."""
    reply, took = send_after_an_early_answer(server, pause_after=1.0)
    assert error_of(reply, 413)["code"] == "file_too_large"
    assert 1.0 + BODY_TIMEOUT - 0.5 < took < 1.0 + BODY_TIMEOUT + 2, took
    reply, took = send_after_an_early_answer(server, pause_after=None)
    assert error_of(reply, 413)["code"] == "file_too_large"
    assert LINGERING_TIME - 1 < took < LINGERING_TIME + 3, took


def test_connections_past_the_cap_are_refused_and_the_server_stays_healthy(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))  # this client's own sockets
    log_before = server.log_path.read_text()
    started = time.monotonic()
    sockets = []
    try:
        for _ in range(2 * OPEN_FILES):  # more than the server could hold open, at once
            with contextlib.suppress(OSError):
                sockets.append(connect(server))
        time.sleep(0.5)
        replies = []
        for sock in sockets:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                replies.append(sock.recv(65536))
        refused = [r for r in replies if r]
        print(f"{len(sockets)} connections in {time.monotonic() - started:.1f} s, {len(refused)} refused")
        assert len(sockets) > OPEN_FILES and len(refused) > OPEN_FILES / 2, (len(sockets), len(refused))
        for reply in refused:
            assert error_of(reply, 503)["code"] == "too_many_connections" and b"\r\nRetry-After: 1\r\n" in reply
        open_files = len(list(Path(f"/proc/{server.proc.pid}/fd").iterdir()))
        assert open_files < OPEN_FILES, open_files
    finally:
        for sock in sockets:
            sock.close()
    # The ones let in were silent: the header timeout has closed them by now, and a client is served.
    time.sleep(HEADER_TIMEOUT)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with open(clip_path("en", "hello_world"), "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text == "Hello world."
    log = server.log_path.read_text()[len(log_before):]
    assert "Traceback" not in log and "Too many open files" not in log, log[-2000:]
    periods = (time.monotonic() - started) / LOG_EVERY_SECONDS
    assert 1 <= log.count("refusing connections") <= periods + 1, log  # rate-limited, with counts


def test_the_server_logged_no_error_through_all_of_it(server):
    log = server.log_path.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
