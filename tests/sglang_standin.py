"""A STAND-IN for an SGLang server serving Whisper, for tests only (SGLang needs a GPU).

What SGLang decides about a request is decided by SGLang's own code: every body goes to the
judge of the release it stands in for (support/sglang_judge.py: SGLang 0.5.21 or 0.5.23
installed in a side folder), which runs the 0.5.22+ contract gate, ``GenerateReqInput``, the
Whisper multimodal processor (SGLang's own, or with ``plugin`` the asr_whisper_prompt plugin's)
and ``SamplingParams``. A refusal there is answered as SGLang's HTTP server answers it; what it
accepts is decoded with the decoder prompt SGLang's processor made and the sampling params it
left. The stand-in's own parts, each a reading of SGLang's source rather than its code:

- Decoding: this project's own BatchEngine (real Whisper output), greedy at temperature 0, the
  ``structural_tag`` compiled with xgrammar as SGLang's xgrammar backend does, no Whisper logit
  rules (SGLang applies none). ``drops_constraint`` stands in for sglang-router / smg, whose
  typed ``SamplingParams`` has no ``structural_tag`` (the decode runs unconstrained).
- Streaming (SSE ``data: {json}``, then ``data: [DONE]``): one event per token, cumulative
  ``output_ids`` / ``text`` / logprob lists (SGLang's default) or only the new part
  (``incremental=True``, SGLang's ``--incremental-streaming-output``). ``meta_info`` holds ``id``,
  ``finish_reason`` (null, then ``{"type": "stop", "matched": eot}``, ``{"type": "length",
  "length": n}`` or ``{"type": "abort", ...}``), ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, and with ``return_logprob`` ``output_token_logprobs`` rows ``[logprob, id,
  null]`` and ``output_token_ids_logprobs`` (one row list per position). Logprobs are after the
  grammar mask, as in SGLang; a masked id's -inf is null in JSON (orjson's encoding).
  Deviation: the requested ids' logprobs are exact at output position 0 (computed from the
  engine's probe, renormalised over what the grammar allows there); at later positions they are
  null. ``text`` holds the ordinary tokens' text only.
- Errors while a streamed request is set up come inside the stream as ``data: {"error": ...}``
  with HTTP 200, as SGLang's ``stream_results`` does; non-streamed ones as HTTP 400
  ``{"error": {"message": ...}}``; the contract gate's as HTTP 400 ``{"error": "..."}``.
- ``POST /abort_request`` (``{"rid", "abort_all"}``) cancels that decode; its stream then ends
  with an ``abort`` finish. A client that disconnects also cancels its decode (SGLang's
  background abort task).
- Identical audio maps to one array, so the engine's encoder cache serves repeats (SGLang has a
  multimodal cache of its own).
- Faults for tests: drop the connection before any token, or after N tokens; replies that break
  the protocol (``REPLY_FAULTS``), on the front's canaries, on its other decodes, or on both.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import math
import threading
import time
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch
import uvicorn
import xgrammar as xgr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from adapters.decode_request import Constraint, DecodeParams
from support.server_process import free_port
from support.sglang_judge import SGLangJudge

WHISPER_MAX_POSITIONS = 448


class Refused(ValueError):
    """What SGLang raises as ValueError while setting a request up."""


# Replies that break the protocol the way a version mismatch, a proxy or a crashing GPU worker does.
REPLY_FAULTS = ("no_logprobs", "no_output_ids", "bad_json", "http_500", "truncated")


@dataclass
class Faults:
    drop_before_output: int = 0  # the next N requests: the connection drops before any token
    drop_after_tokens: int | None = None  # every request: the connection drops after this many tokens
    # Until cleared, every reply to the requests ``reply_fault_on`` names ("canary": the front's
    # admission decodes, "work": the others, "any") is broken as REPLY_FAULTS says:
    # no_logprobs: events without output_token_logprobs; no_output_ids: events without
    # output_ids; bad_json: an event that is not JSON; http_500: HTTP 500 before any event;
    # truncated: the tokens, then [DONE] without the finishing event.
    reply_fault: str | None = None
    reply_fault_on: str = "any"

    def breaks(self, rid: str) -> str | None:
        """The fault the reply to ``rid`` gets, or None."""
        canary = rid.startswith("asr-canary-")
        if self.reply_fault_on == "any" or self.reply_fault_on == ("canary" if canary else "work"):
            return self.reply_fault
        return None


@dataclass
class Job:
    rid: str
    audio: np.ndarray
    params: DecodeParams
    first_allowed: set[int]  # what the grammar allows at output position 0
    requested_ids: list[int]
    stream: bool
    return_logprob: bool


class SGLangStandIn:
    def __init__(self, engine, tok, judge: SGLangJudge, plugin: bool = False, incremental: bool = False,
                 drops_constraint: bool = False):
        self.engine, self.tok, self.judge = engine, tok, judge
        self.plugin, self.incremental, self.drops_constraint = plugin, incremental, drops_constraint
        self.faults = Faults()
        self.requests: list[dict] = []  # every /generate body received
        self.verdicts: list[dict] = []  # the judge's verdict on each
        self.finished: dict[str, dict] = {}  # rid -> finish_reason sent
        self.aborted: list[str] = []  # rids named by /abort_request
        self.disconnected: list[str] = []  # rids whose client left before the end
        self.active: dict[str, object] = {}  # rid -> the engine's SequenceStream
        self._audio_cache: dict[str, np.ndarray] = {}
        info = xgr.TokenizerInfo(tok.encoded_vocab(), xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size,
                                 stop_token_ids=[tok.eot], add_prefix_space=False)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build_app()

    # ---- lifecycle ----
    def start(self) -> "SGLangStandIn":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("stand-in did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    # ---- the request, judged by SGLang's own code ----
    def parse(self, body, verdict: dict) -> Job:
        """The decode SGLang would run for ``body``, from the judge's verdict on it."""
        for key in ("request_error", "processor_error", "sampling_error"):
            if verdict[key]:
                raise Refused(verdict[key])
        prompt, sampling = verdict["decoder_prompt"], verdict["sampling_params"]
        audio = self._audio(body["audio_data"])
        requested = body.get("token_ids_logprob") or []
        grammar = None if self.drops_constraint else self._constraint(sampling)
        max_new = min(sampling.get("max_new_tokens", 128), WHISPER_MAX_POSITIONS - len(prompt))
        temperature = float(sampling.get("temperature", 1.0))
        params = DecodeParams(
            # The engine below reads only the compiled form of a constraint.
            prompt_ids=tuple(prompt), eot_id=self.tok.eot, max_new_tokens=max_new,
            constraint=None if grammar is None else Constraint((), grammar),
            temperature=temperature if temperature > 1e-6 else 0.0,
            top_k=sampling.get("top_k"), top_p=sampling.get("top_p"), seed=sampling.get("sampling_seed"),
            probe_index=len(prompt) - 1, probe_ids=tuple(requested))
        return Job(body["rid"], audio, params, _allowed_first(grammar, self.tok.vocab_size), requested,
                   body.get("stream", False), body.get("return_logprob", False))

    def _audio(self, data_url: str) -> np.ndarray:
        """The same audio gets the same array, so the engine's encoder cache serves repeats (the
        warm-up sends each variant the same silence), as SGLang's multimodal cache reuses the
        encoder output of identical audio."""
        key = hashlib.sha1(data_url.encode()).hexdigest()
        if key not in self._audio_cache:
            self._audio_cache[key] = _wav(data_url)
            while len(self._audio_cache) > 8:
                self._audio_cache.pop(next(iter(self._audio_cache)))
        return self._audio_cache[key]

    def _constraint(self, sampling: dict):
        """The compiled constraint (or None), as SGLang's xgrammar backend compiles it."""
        if sampling.get("regex"):
            return self._compiler.compile_regex(sampling["regex"])
        if sampling.get("json_schema") or sampling.get("ebnf"):
            raise Refused("the stand-in compiles structural_tag and regex only")
        if not sampling.get("structural_tag"):
            return None
        tag = json.loads(sampling["structural_tag"])
        if tag.get("structures") is not None or not isinstance(tag.get("format"), dict):
            raise Refused("structural_tag: expected xgrammar's format object (not the legacy structures/triggers)")
        return self._compiler.compile_structural_tag(sampling["structural_tag"])

    # ---- the app ----
    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            self.requests.append(body)
            verdict = await asyncio.to_thread(self.judge.judge, body, self.plugin)
            self.verdicts.append(verdict)
            if verdict["contract_error"]:
                return JSONResponse({"error": verdict["contract_error"]}, 400)
            stream = isinstance(body, dict) and body.get("stream") is True
            try:
                job = self.parse(body, verdict)
            except (Refused, ValueError, RuntimeError) as e:
                if stream:
                    return StreamingResponse(_refused_stream(str(e)), media_type="text/event-stream")
                return JSONResponse({"error": {"message": str(e)}}, 400)
            if self.faults.breaks(job.rid) == "http_500":
                return JSONResponse({"error": {"message": "stand-in fault: internal server error"}}, 500)
            if job.stream:
                return StreamingResponse(self._events(job), media_type="text/event-stream")
            last = None
            async for last in self._outputs(job):
                pass
            return JSONResponse(last)

        @app.post("/abort_request")
        async def abort(request: Request):
            body = await request.json()
            rid = body.get("rid", "")
            if not isinstance(rid, str) or not isinstance(body.get("abort_all", False), bool):
                return JSONResponse({"error": {"message": "rid must be a string"}}, 400)
            self.aborted.append(rid)
            running = self.active.get(rid)
            if running is not None:
                running.cancel()
            return Response(status_code=200)

        @app.get("/health")
        async def health():
            return Response(status_code=200)

        return app

    async def _events(self, job: Job):
        drop_now = self.faults.drop_before_output > 0
        if drop_now:
            self.faults.drop_before_output -= 1
            raise ConnectionAbortedError("stand-in fault: connection dropped before any token")
        sent = 0
        done = False
        fault = self.faults.breaks(job.rid)
        try:
            async for out in self._outputs(job):
                if fault == "bad_json":
                    yield b"data: {'output_ids': [\n\n"
                    break
                if fault == "no_logprobs":
                    out["meta_info"].pop("output_token_logprobs", None)
                    out["meta_info"].pop("output_token_ids_logprobs", None)
                if fault == "no_output_ids":
                    del out["output_ids"]
                if fault == "truncated" and out["meta_info"]["finish_reason"] is not None:
                    break  # the finishing event never comes
                yield b"data: " + json.dumps(out).encode() + b"\n\n"
                sent += 1
                limit = self.faults.drop_after_tokens
                if limit is not None and sent >= limit and out["meta_info"]["finish_reason"] is None:
                    raise ConnectionAbortedError(f"stand-in fault: connection dropped after {sent} tokens")
            yield b"data: [DONE]\n\n"
            done = True
        finally:
            if not done and job.rid not in self.finished:
                self.disconnected.append(job.rid)

    async def _outputs(self, job: Job):
        """One output dict per generated token, the last with its finish reason."""
        stream = self.engine.submit(job.audio, job.params)
        self.active[job.rid] = stream
        ids: list[int] = []
        rows: list[list] = []
        position_rows: list[list] = []
        try:
            async for event in stream:
                ids.append(event.token_id)
                rows.append([_json_float(event.logprob), event.token_id, None])
                if len(ids) == 1:
                    position_rows.append(self._first_position(job, stream.result.probe_probs))
                else:
                    position_rows.append([[None, t, None] for t in job.requested_ids])
                yield self._output(job, ids, rows, position_rows, None)
            finish = _finish(stream.result, job.params)
            self.finished[job.rid] = finish
            yield self._output(job, ids, rows, position_rows, finish, final=True)
        finally:
            stream.cancel()  # the client left: free the engine's slot
            self.active.pop(job.rid, None)

    def _first_position(self, job: Job, probe_probs: dict[int, float]) -> list[list]:
        allowed = {t: p for t, p in probe_probs.items() if t in job.first_allowed}
        total = sum(allowed.values())
        return [[_json_float(math.log(allowed[t] / total)) if t in allowed and total > 0 else None, t, None]
                for t in job.requested_ids]

    def _output(self, job: Job, ids, rows, position_rows, finish, final: bool = False) -> dict:
        meta = {"id": job.rid, "finish_reason": finish, "prompt_tokens": len(job.params.prompt_ids),
                "completion_tokens": len(ids), "cached_tokens": 0}
        if not self.incremental:
            start = 0  # cumulative: everything so far
        else:
            start = len(ids) if final else len(ids) - 1  # the finishing event carries no new token
        if job.return_logprob:
            meta["output_token_logprobs"] = rows[start:]
            if job.requested_ids:
                meta["output_token_ids_logprobs"] = position_rows[start:]
        return {"text": self.tok.decode(ids[start:]), "output_ids": ids[start:], "meta_info": meta}


def _wav(data_url: str) -> np.ndarray:
    try:
        raw = base64.b64decode(data_url.split(",", 1)[1], validate=True)
        samples, rate = sf.read(io.BytesIO(raw), dtype="float32")
    except Exception as e:
        raise Refused(f"Could not decode audio: {e}") from None
    if rate != 16000 or samples.ndim != 1:
        raise Refused(f"the stand-in takes 16 kHz mono audio (got {rate} Hz, shape {samples.shape})")
    return samples


def _allowed_first(grammar, vocab_size: int) -> set[int]:
    if grammar is None:
        return set(range(vocab_size))
    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    return set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())


def _finish(result, params: DecodeParams) -> dict:
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": params.eot_id}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.token_ids)}
    if result.finish_reason == "grammar":
        return {"type": "stop", "matched": None}
    return {"type": "abort", "message": f"Abort ({result.finish_reason})", "status_code": None, "err_type": None}


def _json_float(value: float):
    return value if math.isfinite(value) else None  # orjson writes -inf as null


async def _refused_stream(message: str):
    error = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
    yield b"data: " + json.dumps(error).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
    await asyncio.sleep(0)
