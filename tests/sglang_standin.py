"""A STAND-IN for an SGLang server serving Whisper, for tests only (SGLang needs a GPU).

It speaks SGLang 0.5.21's native wire format as read from SGLang's source, and produces its
tokens with this project's own BatchEngine, so what comes back is real Whisper output:

- ``POST /generate`` takes a ``GenerateReqInput`` body (srt/managers/io_struct.py). Every key is
  checked against that dataclass's fields (stricter than SGLang, which ignores unknown top-level
  keys: a typo in the client fails here), and each field the client uses is type-checked.
- ``sampling_params`` goes through what SGLang's Whisper processor does
  (srt/multimodal/processors/whisper.py): ``_detect_language`` and ``timestamp_granularities``
  are popped, and without ``_detect_language`` also ``language``. The decoder prompt is then
  ``[<|startoftranscript|>]`` (detect) or ``<|sot|><|lang|><|transcribe|><|notimestamps|>`` (or
  ``<|0.00|>`` with timestamps; English when no language), never anything the request carries.
  The remaining keys must be ``SamplingParams`` fields (srt/sampling/sampling_params.py) and pass
  its ``verify`` ranges; only one of json_schema / regex / ebnf / structural_tag.
- The constraint is compiled as SGLang's xgrammar backend does (``compile_structural_tag`` of the
  JSON text; ``compile_regex``) and no Whisper logit rules are applied, as in SGLang. Greedy at
  temperature 0.
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
  ``{"error": {"message": ...}}``.
- ``POST /abort_request`` (``{"rid", "abort_all"}``) cancels that decode; its stream then ends
  with an ``abort`` finish. A client that disconnects also cancels its decode (SGLang's
  background abort task).
- ``contract=True`` answers like SGLang 0.5.22 and later, whose JSON contract refuses unknown
  ``sampling_params`` keys with HTTP 400 ``{"error": "unknown field `key`, expected one of ..."}``.
- Identical audio maps to one array, so the engine's encoder cache serves repeats (SGLang has a
  multimodal cache of its own).
- Faults for tests: drop the connection before any token, or after N tokens.
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

from asr_service.engine.params import Constraint, DecodeParams
from support.server_process import free_port

# GenerateReqInput's fields (SGLang 0.5.21, srt/managers/io_struct.py).
GENERATE_FIELDS = frozenset("""rid session_id text input_ids input_embeds image_data video_data audio_data mm_hashes
mm_content_hashes use_audio_in_video video_config sampling_params return_logprob logprob_start_len top_logprobs_num
token_ids_logprob return_sampling_mask sampling_logprobs_mode return_text_in_logprobs return_flat_raw_top_logprobs
return_flat_raw_top_logprobs_b64 stream log_metrics return_hidden_states return_routed_experts routed_experts_start_len
return_indexer_topk modalities session_params lora_path lora_id custom_logit_processor positional_embed_overrides
bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size routed_dp_rank data_parallel_rank
disagg_prefill_dp_rank routing_key conversation_id http_worker_ipc background require_reasoning max_thinking_tokens
priority extra_key no_logs custom_labels return_bytes return_entropy return_prompt_token_ids external_trace_header
received_time need_wait_for_mm_inputs num_items_assigned encoder_urls max_dynamic_patch min_dynamic_patch
image_max_dynamic_patch video_max_dynamic_patch images_config multi_item_delimiter_indices token_indices_to_pool
cache_salt kv_hints""".split())
# SamplingParams' API fields (SGLang 0.5.21, srt/sampling/sampling_params.py).
SAMPLING_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
                   "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                   "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                   "custom_params")
# SGLang 0.5.22+'s JSON contract for sampling_params (sglang/api/v1/api_types.py): the same plus two.
CONTRACT_SAMPLING_FIELDS = SAMPLING_FIELDS + ("watermark", "choice")
WHISPER_MAX_POSITIONS = 448


class Refused(ValueError):
    """What SGLang raises as ValueError while setting a request up."""


@dataclass
class Faults:
    drop_before_output: int = 0  # the next N requests: the connection drops before any token
    drop_after_tokens: int | None = None  # every request: the connection drops after this many tokens


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
    def __init__(self, engine, tok, incremental: bool = False, contract: bool = False):
        self.engine, self.tok = engine, tok
        self.incremental, self.contract = incremental, contract
        self.faults = Faults()
        self.requests: list[dict] = []  # every /generate body received
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

    # ---- the request, checked as SGLang checks it ----
    def parse(self, body) -> Job:
        if not isinstance(body, dict):
            raise Refused("the request body must be a JSON object")
        unknown = sorted(set(body) - GENERATE_FIELDS)
        if unknown:
            raise Refused(f"unknown GenerateReqInput fields: {unknown}")
        rid = _typed(body, "rid", str)
        if not rid:
            raise Refused("rid: the client must name its request to abort it")
        audio_data = _typed(body, "audio_data", str)
        if not audio_data.startswith("data:") or "," not in audio_data:
            raise Refused("audio_data: expected a data URL (data:...;base64,...)")
        audio = self._audio(audio_data)
        if body.get("text") is None and body.get("input_ids") is None and body.get("input_embeds") is None:
            raise Refused("Either text, input_ids or input_embeds should be provided.")  # GenerateReqInput's check
        modalities = body.get("modalities")
        if modalities is not None and modalities != ["audio"]:
            raise Refused(f"modalities: {modalities!r}")
        stream = _typed(body, "stream", bool, False)
        return_logprob = _typed(body, "return_logprob", bool, False)
        requested = body.get("token_ids_logprob") or []
        if not (isinstance(requested, list) and all(type(t) is int and 0 <= t < self.tok.vocab_size for t in requested)):
            raise Refused("token_ids_logprob: expected a list of token ids")
        sampling = dict(_typed(body, "sampling_params", dict, {}))
        prompt = self._whisper_prompt(sampling)
        grammar = self._sampling(sampling)
        max_new = sampling.get("max_new_tokens", 128)
        max_new = min(max_new, WHISPER_MAX_POSITIONS - len(prompt))
        temperature = float(sampling.get("temperature", 1.0))
        params = DecodeParams(
            # The engine below reads only the compiled form of a constraint.
            prompt_ids=tuple(prompt), eot_id=self.tok.eot, max_new_tokens=max_new,
            constraint=None if grammar is None else Constraint((), grammar),
            temperature=temperature if temperature > 1e-6 else 0.0,
            top_k=sampling.get("top_k"), top_p=sampling.get("top_p"), seed=sampling.get("sampling_seed"),
            probe_index=len(prompt) - 1, probe_ids=tuple(requested))
        return Job(rid, audio, params, _allowed_first(grammar, self.tok.vocab_size), requested, stream, return_logprob)

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

    def _whisper_prompt(self, sampling: dict) -> list[int]:
        """What WhisperProcessor.process_mm_data_async does with sampling_params."""
        tok = self.tok
        detect = sampling.pop("_detect_language", None)
        timestamps = sampling.pop("timestamp_granularities", None)
        if detect:
            return [tok.sot]
        language = sampling.pop("language", None) or "en"
        if language not in tok.language_ids:
            raise Refused(f"Language '{language}' not recognized.")
        return [tok.sot, tok.language_ids[language], tok.transcribe,
                tok.timestamp_begin if timestamps else tok.no_timestamps]

    def _sampling(self, sampling: dict):
        """SamplingParams(**rest) and verify(); the compiled constraint (or None)."""
        unknown = [k for k in sampling if k not in SAMPLING_FIELDS]
        if unknown:
            raise Refused(f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'")
        checks = {"max_new_tokens": lambda v: type(v) is int and v >= 0,
                  "temperature": lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v >= 0,
                  "top_p": lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
                  "top_k": lambda v: type(v) is int and (v >= 1 or v == -1),
                  "sampling_seed": lambda v: type(v) is int,
                  "skip_special_tokens": lambda v: type(v) is bool,
                  "spaces_between_special_tokens": lambda v: type(v) is bool,
                  "structural_tag": lambda v: isinstance(v, str), "regex": lambda v: isinstance(v, str)}
        for key, ok in checks.items():
            if key in sampling and sampling[key] is not None and not ok(sampling[key]):
                raise Refused(f"{key} has an invalid value {sampling[key]!r}")
        constraints = [k for k in ("json_schema", "regex", "ebnf", "structural_tag") if sampling.get(k)]
        if len(constraints) > 1:
            raise Refused("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        if not constraints:
            return None
        text = sampling[constraints[0]]
        if constraints[0] == "regex":
            return self._compiler.compile_regex(text)
        if constraints[0] != "structural_tag":
            raise Refused(f"the stand-in compiles structural_tag and regex only, not {constraints[0]}")
        tag = json.loads(text)
        if tag.get("structures") is not None or not isinstance(tag.get("format"), dict):
            raise Refused("structural_tag: expected xgrammar's format object (not the legacy structures/triggers)")
        return self._compiler.compile_structural_tag(text)

    # ---- the app ----
    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            self.requests.append(body)
            if self.contract:
                keys = body.get("sampling_params", {}) if isinstance(body, dict) else {}
                unknown = [k for k in keys if k not in CONTRACT_SAMPLING_FIELDS]
                if unknown:
                    listed = ", ".join(f"`{f}`" for f in CONTRACT_SAMPLING_FIELDS)
                    return JSONResponse({"error": f"unknown field `{unknown[0]}`, expected one of {listed}"}, 400)
            stream = isinstance(body, dict) and body.get("stream") is True
            try:
                job = self.parse(body)
            except (Refused, ValueError, RuntimeError) as e:
                if stream:
                    return StreamingResponse(_refused_stream(str(e)), media_type="text/event-stream")
                return JSONResponse({"error": {"message": str(e)}}, 400)
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
        try:
            async for out in self._outputs(job):
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


def _typed(body: dict, key: str, kind: type, default=None):
    if key not in body or body[key] is None:
        if default is None:
            raise Refused(f"{key} is required")
        return default
    if type(body[key]) is not kind:
        raise Refused(f"{key}: expected {kind.__name__}, got {type(body[key]).__name__}")
    return body[key]


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
