"""SGLangEngine: the engine interface (``submit`` -> SequenceStream) over SGLang servers.

Each sequence is one streamed ``/generate`` call (see ``wire``). Tokens are handed to the
stream as they arrive, so the streaming layer above holds text back until the fused prefix
parses exactly as with the embedded engine. A cancelled stream (the client left, a deadline,
a speculative decode dropped) closes the call and posts ``/abort_request`` with its rid, so the
server frees the sequence at once. A server that fails before any token reached the caller has
its sequence retried on another; after that the sequence ends ``unavailable`` (a stream cannot
take text back). The batching itself happens inside SGLang.

Admission: before a server gets its first decode, and again after each failure, it must pass
the adapter's canary decodes (CanaryDecode), tried with each way of carrying the prompt, best
first (``wire.Carrier``): the first that passes is how that server is sent prompts from then on.
A server that passes none (SGLang 0.5.22+ without the plugin, a router that drops the
constraint, a server that refuses the body) is down with that reason in /health, /metrics and
the log, and gets no traffic; it is checked again when its retry time comes (a watcher sends the
canary then, whether or not decodes arrive).

Faults: every reply is checked where it is read (``wire.StreamState``) against what the body asked
for; a reply that is not SGLang's answer to it (no token ids, no logprobs, JSON that does not
parse, a cut stream, a 5xx) is a BackendFailure: the server is taken out with that reason, and
the sequence goes to another admitted server if none of its tokens reached the caller, or ends
``unavailable`` at once. Each sequence's task owns its stream and finishes it whatever happens,
so no caller waits on a decode that died; nothing raised in a task goes unlogged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid

import httpx
import numpy as np

from adapters.decode_request import CanaryDecode, DecodeParams

from ..interface import EngineFigures
from ..params import Priority, StepEvent, UnsupportedDecode
from ..stream import SequenceStream
from . import wire
from .backends import Backend, BackendPool
from .wire import Carrier

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 1.0  # how often servers whose retry time has come are sent their canary
CANARY_AUDIO = np.zeros(16000, np.float32)  # 1 s of silence


class BackendFailure(Exception):
    """The server failed (transport error, 5xx, stream cut short): try another."""


class ContractRefusal(BackendFailure):
    """The server's /generate contract refuses the private prompt key (SGLang 0.5.22+)."""


class SGLangEngine:
    name = "sglang"
    beam_search = False  # SGLang's /generate has no beam search for Whisper (wire.refusal)
    audio_sized_encoder = False  # its servers encode whole windows (wire.refusal)

    def __init__(self, urls: list[str], decoder_start_id: int, canaries: dict[Carrier, CanaryDecode],
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 120.0, retry_after_s: float = 2.0):
        """``canaries``: the canary decode for each carrier (the one for DETECT_KEY cannot hold
        text before <|startoftranscript|>; the one for INPUT_IDS should, to prove it is carried)."""
        self.pool = BackendPool(list(urls), retry_after=retry_after_s)
        # SGLang batches on the GPU what it is sent: a long file's windows go out 32 per server
        # at a time (engine.interface.Engine).
        self.max_request_windows = 32 * len(urls)
        self.decoder_start_id = decoder_start_id
        self.canaries = {carrier: canaries[carrier] for carrier in Carrier}
        self._admissions: dict[str, asyncio.Task] = {}  # url -> the canary run in progress
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=30.0, pool=None)
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()  # sequences, canaries and aborts in flight (strong references)
        self._watcher: asyncio.Task | None = None  # re-checks servers that are out (_watch)
        self._active = 0
        self.tokens_total = 0
        self.submitted_total = 0
        self.cancelled_total = 0
        self.retried_total = 0  # sequences sent again after a server failed before any token

    @property
    def warm_copies(self) -> int:
        return len(self.pool.backends)  # one warm decode per variant reaches each server

    def figures(self) -> EngineFigures:
        # SGLang queues and batches inside its servers: the front never holds a sequence back.
        return EngineFigures(active_sequences=self._active, queued_sequences=0,
                             submitted_sequences=self.submitted_total, cancelled_sequences=self.cancelled_total,
                             tokens=self.tokens_total, backends=self.pool.snapshot())

    @property
    def carries_prompt_text(self) -> bool:
        """Only ``input_ids`` carries text before <|startoftranscript|>; before any server is
        admitted nothing is known, and nothing is refused."""
        admitted = self.pool.carriers()
        return not admitted or Carrier.INPUT_IDS in admitted

    def refusal(self, params: DecodeParams) -> UnsupportedDecode | None:
        problem = wire.refusal(params)
        if problem is None:
            admitted = self.pool.carriers()
            if admitted and not admitted & self._carriers_for(params):
                return UnsupportedDecode(wire.PROMPT_NEEDS_PLUGIN, "prompt")
        return problem

    def _carriers_for(self, params: DecodeParams) -> frozenset[Carrier]:
        return frozenset(c for c in Carrier if wire.carries(c, params, self.decoder_start_id))

    def submit(self, audio: np.ndarray, params: DecodeParams, priority: Priority | None = None) -> SequenceStream:
        # ``priority`` is not sent: each SGLang server schedules its own queue, and a request's
        # windows reach it in order. Nor is ``params.draft_ids``: the server steps through every
        # token, which gives the tokens a draft would.
        problem = self.refusal(params)
        if problem is not None:
            raise problem
        self._watch()
        loop = asyncio.get_running_loop()
        stream = SequenceStream(loop)
        self.submitted_total += 1
        task = loop.create_task(self._run(audio, params, stream))
        self._keep(task)

        def cancel():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is closed: nothing runs any more
                pass

        stream.on_cancel = cancel  # a cancel aborts the remote decode at once
        return stream

    def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # ---- one sequence ----
    def _keep(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            # One pool of connections per event loop; every sequence holds one while it streams.
            self._client = httpx.AsyncClient(timeout=self._timeout, limits=httpx.Limits(max_connections=None))
            self._client_loop = loop
        return self._client

    async def _run(self, audio: np.ndarray, params: DecodeParams, stream: SequenceStream) -> None:
        """One sequence to its end. It owns the stream: whatever happens, the stream finishes
        (a result, an error or cancelled), so no request waits on a decode nobody runs."""
        self._active += 1
        try:
            await self._send(audio, params, stream)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave the caller waiting: say so, and log it
            log.exception("SGLang sequence failed inside the front")
            self._finish(stream, "error", f"the front failed while decoding through SGLang: {type(e).__name__}: {e}")
        finally:
            self._active -= 1
            if not stream.result.finish_reason:  # cancelled before it started: end it all the same
                self._finish(stream, "cancelled")

    async def _send(self, audio: np.ndarray, params: DecodeParams, stream: SequenceStream) -> None:
        carriers = self._carriers_for(params)
        tried: set[str] = set()
        while True:
            await self._admit_due(tried, carriers)
            backend = self.pool.pick(tried, carriers)
            if backend is None:
                why = self.pool.unavailable_reason(carriers)
                return self._finish(stream, "unavailable", why if not tried else f"every SGLang backend failed: {why}")
            tried.add(backend.url)
            body = wire.generate_body(f"asr-{uuid.uuid4().hex}", audio, params, backend.carrier)
            backend.outstanding += 1
            try:
                reason, error = await self._generate(backend, body, params, stream,
                                                     wire.forced_tokens(params, backend.carrier))
            except asyncio.CancelledError:
                self._abort(backend, body["rid"])
                self._finish(stream, "cancelled")
                raise
            except wire.GenerateError as e:  # the request itself: every server would say the same
                return self._finish(stream, "error", f"SGLang refused the decode: {e}")
            except BackendFailure as e:
                self._failed(backend, str(e))
                delivered = len(stream.result.token_ids)  # only a first attempt can have any
                if delivered == 0:
                    self.retried_total += 1
                    continue  # nothing reached the caller: send it to another server
                return self._finish(stream, "unavailable",
                                    f"SGLang backend {backend.url} failed after {delivered} tokens: {e}")
            finally:
                backend.outstanding -= 1
            self.pool.succeeded(backend)
            return self._finish(stream, reason, error)

    # ---- admission ----
    async def admit(self) -> None:
        """Check every server due for admission now, and wait for the verdicts."""
        self._watch()
        runs = self._start_admissions()
        if runs:
            await asyncio.shield(asyncio.gather(*runs))

    async def _admit_due(self, exclude: set[str], carriers: frozenset[Carrier]) -> None:
        """Start the canaries of every server due for admission; wait for them only when no
        admitted server can take this decode (a server that hangs in its canary holds up no
        decode another can take)."""
        runs = self._start_admissions()
        if runs and not self.pool.live(exclude, carriers):
            # A decode cancelled while it waits leaves the admissions running for the others.
            await asyncio.shield(asyncio.gather(*runs))

    def _watch(self) -> None:
        """Keep checking servers that are out, on their retry schedule, whether or not decodes
        arrive: one that answers its canary correctly again is admitted, and /health says so."""
        loop = asyncio.get_running_loop()
        if self._watcher is None or self._watcher.done() or self._watcher.get_loop() is not loop:
            self._watcher = loop.create_task(self._watch_admissions())
            self._keep(self._watcher)

    async def _watch_admissions(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self._start_admissions()
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("SGLang admission watcher")

    def _start_admissions(self) -> list[asyncio.Task]:
        """The canary run of each server due for admission: at most one per server at a time,
        shared by whoever waits for it."""
        loop = asyncio.get_running_loop()
        runs = []
        for backend in self.pool.due_for_admission():
            run = self._admissions.get(backend.url)
            if run is None or run.done() or run.get_loop() is not loop:
                run = loop.create_task(self._admit(backend))
                self._admissions[backend.url] = run
                self._keep(run)
            runs.append(run)
        return runs

    async def _admit(self, backend: Backend) -> None:
        failures = []
        for carrier, canary in self.canaries.items():
            stream = SequenceStream(asyncio.get_running_loop())
            body = wire.generate_body(f"asr-canary-{uuid.uuid4().hex}", CANARY_AUDIO, canary.params, carrier)
            try:
                _, error = await self._generate(backend, body, canary.params, stream,
                                                wire.forced_tokens(canary.params, carrier))
                failure = error or canary.failure(stream.result.token_ids)
            except wire.GenerateError as e:
                failure = f"it refused the canary decode: {e}"
            except ContractRefusal as e:
                failure = str(e)
            except BackendFailure as e:
                return self._failed(backend, f"its canary decode failed: {e}")
            except Exception as e:  # a reply no check foresaw: the server stays out, the front goes on
                log.exception("SGLang backend %s: the canary's reply could not be read", backend.url)
                return self._failed(backend, f"its canary's reply could not be read: {type(e).__name__}: {e}")
            if failure is None:
                self.pool.admitted(backend, carrier)
                log.info("SGLang backend %s admitted: the prompt goes as %s", backend.url, carrier.value)
                return
            failures.append(f"with the prompt as {carrier.value}, {failure}")
        self._failed(backend, "the canary decode failed: " + "; ".join(failures))

    def _failed(self, backend: Backend, why: str) -> None:
        """Take ``backend`` out with its reason: /health, /metrics and the log say it, and when
        its canary runs again."""
        retry_in = self.pool.failed(backend, why)
        log.warning("SGLang backend %s is out: %s; its canary runs again in %.0f s", backend.url, why, retry_in)

    # ---- one call ----
    async def _generate(self, backend: Backend, body: dict, params: DecodeParams, stream: SequenceStream,
                        forced: tuple[int, ...]) -> tuple[str, str | None]:
        state = wire.StreamState()
        result = stream.result
        try:
            async with self._http().stream("POST", f"{backend.url}/generate", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    refusal = wire.contract_refusal(response.status_code, text)
                    if refusal is not None:
                        raise ContractRefusal(refusal)
                    if 400 <= response.status_code < 500:
                        raise wire.GenerateError(f"HTTP {response.status_code}: {text[:500]}")
                    raise BackendFailure(f"HTTP {response.status_code}: {text[:200]}")
                async for line in response.aiter_lines():
                    event = wire.parse_event_line(line)
                    if event is None:
                        continue
                    start = len(state.token_ids)
                    new = state.update(event)
                    for offset, token in enumerate(new):
                        position = start + offset
                        if position < len(forced):
                            if token != forced[position]:
                                raise wire.GenerateError(f"the server did not follow the constraint: token {token} "
                                                         f"where the prompt forces {forced[position]}")
                            continue
                        if not result.token_ids:
                            result.probe_probs = _probabilities(state.first_position_logprobs)
                        result.token_ids.append(token)
                        result.logprobs.append(state.logprobs[position])
                        self.tokens_total += 1
                        stream.emit(StepEvent(token, state.logprobs[position]))
                    if state.finish is not None:
                        break
        except httpx.HTTPError as e:
            raise BackendFailure(f"{type(e).__name__}: {e}") from None
        except wire.MalformedReply as e:  # not an SGLang reply to this request: the server is at fault
            raise BackendFailure(f"malformed reply: {e}") from None
        return _finish(state, params, stream, forced)

    def _abort(self, backend: Backend, rid: str) -> None:
        """Tell the server to drop ``rid`` now (closing the stream also does, later)."""
        async def send():
            try:
                await self._http().post(f"{backend.url}/abort_request", json={"rid": rid}, timeout=ABORT_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - best effort: closing the stream also aborts it
                log.info("abort of %s on %s not delivered: %s", rid, backend.url, e)

        self._keep(asyncio.get_running_loop().create_task(send()))

    def _finish(self, stream: SequenceStream, reason: str, error: str | None = None) -> None:
        if reason == "cancelled":
            self.cancelled_total += 1
        stream.finish(reason, error)


def _probabilities(logprobs: dict[int, float] | None) -> dict[int, float]:
    """Probe probabilities from the first output position. Masked ids (-inf: not allowed there)
    are left out, so a no-speech probability the grammar hid reads as unknown, not as zero."""
    return {t: math.exp(lp) for t, lp in (logprobs or {}).items() if lp > float("-inf")}


def _finish(state: wire.StreamState, params: DecodeParams, stream: SequenceStream,
            forced: tuple[int, ...]) -> tuple[str, str | None]:
    """How a finished /generate stream ended (the finish reason and an error, if any); the end of
    text appended where SGLang matched it without returning it, as the embedded engine reports it."""
    if state.finish is None:
        raise BackendFailure(f"the stream ended after {len(state.token_ids)} tokens without a finish reason")
    if len(state.token_ids) < len(forced):
        raise BackendFailure(f"malformed reply: it finished after {len(state.token_ids)} tokens, before the "
                             f"{len(forced)} the constraint forces")
    kind = state.finish.get("type")
    result = stream.result
    if kind == "stop":
        if state.finish.get("matched") == params.eot_id and result.token_ids[-1:] != [params.eot_id]:
            result.token_ids.append(params.eot_id)
            result.logprobs.append(0.0)
            stream.emit(StepEvent(params.eot_id, 0.0))
        return "stop", None
    if kind == "length":
        return "length", None
    return "error", f"SGLang ended the decode: {state.finish.get('message') or state.finish}"
