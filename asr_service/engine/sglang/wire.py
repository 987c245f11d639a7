"""SGLang's native ``/generate`` wire format for Whisper, as read from SGLang's source (0.5.21-0.5.23)
and checked with its own request code (tests/server/test_sglang_contract.py).

How SGLang builds a Whisper decode (``srt/multimodal/processors/whisper.py``): its processor
makes the decoder prompt itself and replaces the request's ``text`` / ``input_ids`` with it:
``[<|startoftranscript|>]`` when ``sampling_params`` holds the private key ``_detect_language``,
otherwise ``<|sot|><|lang|><|transcribe|><|notimestamps or 0.00|>`` (English when no ``language``
key). ``GenerateReqInput`` still needs one of ``text`` / ``input_ids``. So there are two ways to
carry this project's prompts, and each backend is checked for which one it honours (``Carrier``):

- ``input_ids``: the whole prompt (previous text, language, task, timestamps) as ``input_ids``.
  Needs the asr_whisper_prompt plugin (sglang-plugin/ in this repository) on the SGLang host,
  whose processor takes the prompt from there; works with every release that loads plugins
  (0.5.21-0.5.23 read ``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE``).
- ``detect_key``: ``text: ""`` and ``_detect_language``, so the prompt is
  ``[<|startoftranscript|>]``, and the prompt's remaining tokens forced first by the constraint
  (``token`` elements), then stripped from the output again. No previous text can be carried.
  SGLang 0.5.11-0.5.21 without the plugin; 0.5.22 and later refuse the key on ``/generate`` (a
  JSON contract check rejects unknown ``sampling_params`` keys with HTTP 400 "unknown field").

The constraint is a ``structural_tag`` (xgrammar's JSON format; SGLang hands the string to
``GrammarCompiler.compile_structural_tag``): the strictest form SGLang accepts, because it works
on token ids. ``regex`` is matched on bytes, so the model could spell ``<|fr|>`` with ordinary
tokens, and special tokens could slip into the text. It is the adapter's own constraint, which
keeps the suppressed non-speech tokens out of the text and opens timestamped text with a
timestamp of at most 1 s. SGLang applies no logit rules, so Whisper's others are missing (no
blank first token; paired timestamps that never go back); the adapter parses fail-strict.

Responses: with ``"stream": true`` each event is ``data: {json}`` and the stream ends with
``data: [DONE]``. An event holds ``output_ids`` and ``meta_info`` (``id``, ``finish_reason``:
null until the end, then ``{"type": "stop", "matched": id}``, ``{"type": "length", "length": n}``
or ``{"type": "abort", "message": ...}``; ``completion_tokens``; with ``return_logprob``:
``output_token_logprobs`` as ``[logprob, token_id, text]`` rows and, for ``token_ids_logprob``,
``output_token_ids_logprobs`` as one list of rows per output position). By default the ids and
logprob lists are cumulative; a server started with ``--incremental-streaming-output`` sends
only the new part, which ``completion_tokens`` tells apart. Errors raised while the request is
set up arrive inside the stream as ``data: {"error": {"message", "type", "code"}}``.
Logprobs are taken after the grammar mask, so a masked token's logprob is -inf (null in JSON).
"""

from __future__ import annotations

import base64
import io
import json
import math
import wave
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from adapters.decode_request import DecodeParams

from ...pcm import SAMPLE_RATE
from ..params import UnsupportedDecode

DETECT_LANGUAGE_KEY = "_detect_language"  # SGLang's FUSED_AUTODETECT_FLAG


class Carrier(str, Enum):
    """How a backend is sent the decoder prompt (see the module's docstring), best first."""

    INPUT_IDS = "input_ids"
    DETECT_KEY = "detect_key"


def carries(carrier: Carrier, params: DecodeParams, decoder_start_id: int) -> bool:
    """Whether ``carrier`` can send ``params``' prompt: only ``input_ids`` carries text before
    <|startoftranscript|> (previous text, hotwords)."""
    return carrier is Carrier.INPUT_IDS or (bool(params.prompt_ids) and params.prompt_ids[0] == decoder_start_id)


PROMPT_NEEDS_PLUGIN = ("a prompt (previous text or hotwords) needs the asr_whisper_prompt plugin on the SGLang "
                       "servers (docs/scaling-out.md): SGLang's own Whisper processor builds the decoder prompt "
                       "itself and drops any text before <|startoftranscript|>")


def refusal(params: DecodeParams) -> UnsupportedDecode | None:
    """Why this decode cannot go to any SGLang server, or None."""
    if params.alignment_heads:
        return UnsupportedDecode("word timestamps need the decoder's cross-attention, which SGLang does not "
                                 "return", "timestamp_granularities")
    if params.beam_size > 1:
        return UnsupportedDecode("beam search is not available with the SGLang engine", "beam_size")
    if params.audio_sized_encoder:
        return UnsupportedDecode("SGLang servers encode the whole 30 s window", "audio_sized_encoder")
    return None


def wav_data_url(samples: np.ndarray) -> str:
    """16 kHz mono PCM16 WAV as a data URL: SGLang's load_audio takes ``data:...;base64,``."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def forced_tokens(params: DecodeParams, carrier: Carrier) -> tuple[int, ...]:
    """The prompt tokens the constraint forces at the start of the output (and the engine strips)."""
    return params.prompt_ids[1:] if carrier is Carrier.DETECT_KEY else ()


def constraint(params: DecodeParams, carrier: Carrier) -> str:
    """The structural tag to send: the forced prompt tokens first, then the adapter's own
    constraint (which already carries Whisper's rules that a constraint can say: see
    adapters/whisper_grammar.py)."""
    forced = [{"type": "token", "token": t} for t in forced_tokens(params, carrier)]
    rest = list(params.constraint.elements) if params.constraint is not None else [{"type": "any_tokens", "exclude_tokens": []}]
    return json.dumps({"type": "structural_tag", "format": {"type": "sequence", "elements": forced + rest}},
                      separators=(",", ":"))


def generate_body(rid: str, samples: np.ndarray, params: DecodeParams, carrier: Carrier) -> dict:
    """The /generate request for one sequence over one audio window (always streamed)."""
    forced = len(forced_tokens(params, carrier))
    sampling = {
        "max_new_tokens": params.max_new_tokens + forced,
        "temperature": params.temperature,
        "structural_tag": constraint(params, carrier),
        # The text field is not used (the adapter parses token ids), but keep it faithful.
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    # vLLM's penalties are SGLang's too (same names, same neutral values).
    if params.repetition_penalty != 1.0:
        sampling["repetition_penalty"] = params.repetition_penalty
    if params.frequency_penalty:
        sampling["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        sampling["presence_penalty"] = params.presence_penalty
    if params.temperature > 0:
        if params.min_p:
            sampling["min_p"] = params.min_p
        if params.top_k:
            sampling["top_k"] = params.top_k
        if params.top_p is not None:
            sampling["top_p"] = params.top_p
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
    body = {"rid": rid}
    if carrier is Carrier.INPUT_IDS:
        body["input_ids"] = list(params.prompt_ids)
    else:
        sampling[DETECT_LANGUAGE_KEY] = True
        # SGLang's request class refuses a body with no text, input_ids or input_embeds; its own
        # transcription endpoint sends an empty text, which its Whisper processor then replaces.
        body["text"] = ""
    body |= {
        "audio_data": wav_data_url(samples),
        "modalities": ["audio"],
        "sampling_params": sampling,
        "stream": True,
        "return_logprob": True,
    }
    if params.probe_ids:
        body["token_ids_logprob"] = list(params.probe_ids)
    return body


def contract_refusal(status: int, text: str) -> str | None:
    """SGLang >= 0.5.22's answer to the private key, explained; None for any other answer."""
    if status == 400 and DETECT_LANGUAGE_KEY in text and "unknown field" in text:
        return ("this SGLang server refuses the Whisper prompt key `_detect_language` on /generate (SGLang 0.5.22 "
                "and later check sampling_params against a fixed schema) and does not read the prompt from "
                "input_ids: install the asr_whisper_prompt plugin on it (see docs/scaling-out.md). "
                f"Server said: {text[:300]}")
    return None


class MalformedReply(ValueError):
    """A reply that breaks the /generate protocol (a version mismatch, a proxy, a crashing
    worker): the server failed, whatever the request was."""


@dataclass
class StreamState:
    """What one streamed /generate call has delivered so far (cumulative or incremental events).

    The one place a reply is read: every event is checked against what the request asked for
    (``return_logprob`` was asked for, so every token comes with its logprob row; the rows
    asked for with ``token_ids_logprob``), and anything else is a MalformedReply naming what is
    missing. Nothing unchecked reaches the caller."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_position_logprobs: dict[int, float] | None = None  # token_ids_logprob rows at output 0
    finish: dict | None = None

    def update(self, event) -> list[int]:
        """Take one event; returns the token ids it adds."""
        if not isinstance(event, dict):
            raise MalformedReply(f"an event is not a JSON object: {_shown(event)}")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise GenerateError(str(message), error.get("code") if isinstance(error, dict) else None)
        ids = event.get("output_ids")
        if not isinstance(ids, list) or not all(_is_id(t) for t in ids):
            raise MalformedReply(f"an event carries no output_ids (token ids): {_shown(event)}")
        meta = event.get("meta_info")
        if not isinstance(meta, dict):
            raise MalformedReply(f"an event has no meta_info: {_shown(event)}")
        total = meta.get("completion_tokens")
        cumulative = total is None or len(ids) == total
        if cumulative and len(ids) < len(self.token_ids):
            raise MalformedReply(f"an event holds {len(ids)} token ids after {len(self.token_ids)} were sent")
        new = ids[len(self.token_ids):] if cumulative else ids
        rows = meta.get("output_token_logprobs")
        if rows is None and not new:
            rows = []  # an event that adds no token need not carry the (empty) rows
        if not isinstance(rows, list):
            raise MalformedReply("no logprobs in the reply (output_token_logprobs, asked for with return_logprob)")
        rows = rows[len(self.logprobs):] if cumulative else rows
        if len(rows) < len(new):
            raise MalformedReply(f"no logprobs in the reply for {len(new) - len(rows)} of its {len(new)} new tokens")
        for token, row in zip(new, rows):
            if not (isinstance(row, list) and len(row) >= 2 and _is_logprob(row[0]) and row[1] == token):
                raise MalformedReply(f"a logprob row {_shown(row)} does not match its token {token}")
        positions = meta.get("output_token_ids_logprobs") or []
        if self.first_position_logprobs is None and positions and (cumulative or not self.token_ids):
            self.first_position_logprobs = _position_logprobs(positions[0])
        finish = meta.get("finish_reason")
        if finish is not None and not (isinstance(finish, dict) and isinstance(finish.get("type"), str)):
            raise MalformedReply(f"a finish_reason that is not SGLang's: {_shown(finish)}")
        self.token_ids += new
        self.logprobs += [_logprob(r[0]) for r in rows[: len(new)]]
        if finish:
            self.finish = finish
        return new


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_logprob(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _position_logprobs(rows) -> dict[int, float]:
    """One output position's ``token_ids_logprob`` rows ([logprob, id, text] each) by id."""
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) >= 2 and _is_id(r[1])
                                             and _is_logprob(r[0]) for r in rows):
        raise MalformedReply(f"output_token_ids_logprobs rows that are not [logprob, id, text]: {_shown(rows)}")
    return {r[1]: _logprob(r[0]) for r in rows}


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


class GenerateError(Exception):
    """An error SGLang reported for the request itself (not a failed server)."""

    def __init__(self, message: str, code=None):
        super().__init__(message)
        self.code = code


def _logprob(value) -> float:
    if value is None:
        return float("-inf")
    value = float(value)
    return value if math.isfinite(value) else float("-inf")


def parse_event_line(line: str):
    """One SSE line -> its JSON event (checked by StreamState.update); None for blank lines,
    comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except ValueError as e:
        raise MalformedReply(f"an event is not JSON ({e}): {payload[:200]}") from None
