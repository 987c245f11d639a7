"""SGLang's native ``/generate`` wire format for Whisper, as read from SGLang's source (0.5.21).

How SGLang builds a Whisper decode (``srt/multimodal/processors/whisper.py``): the decoder
prompt is never taken from the request's ``text`` or ``input_ids``, though one of them must be
there (``GenerateReqInput`` refuses a body without; SGLang's own endpoint sends ``text: ""``). The processor replaces them
with ``[<|startoftranscript|>]`` when ``sampling_params`` holds the private key
``_detect_language`` (it pops it before the rest becomes ``SamplingParams``), and otherwise with
``<|sot|><|lang|><|transcribe|><|notimestamps or 0.00|>``, the language from a ``language`` key
(English when absent). So the one prompt that carries every variant (any language, translate,
timestamps) is ``[<|startoftranscript|>]`` plus a constraint that forces the rest: every request
here sends ``_detect_language`` and puts the prompt's remaining tokens into the constraint as
``token`` elements, which the engine strips from the output again.

The constraint is a ``structural_tag`` (xgrammar's JSON format; SGLang hands the string to
``GrammarCompiler.compile_structural_tag``): the strictest form SGLang accepts, because it works
on token ids. ``regex`` is matched on bytes, so the model could spell ``<|fr|>`` with ordinary
tokens, and special tokens could slip into the text. It is the adapter's own constraint, which
keeps the suppressed non-speech tokens out of the text and opens timestamped text with a
timestamp of at most 1 s. SGLang applies no logit rules, so Whisper's others are missing (no
blank first token; paired timestamps that never go back); the adapter parses fail-strict.

SGLang 0.5.22 and later refuse ``_detect_language`` on ``/generate``: a JSON contract check
(``sglang/api/v1``) rejects unknown ``sampling_params`` keys with HTTP 400 "unknown field".
``contract_refusal`` recognises that answer so it can be reported as what it is.

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

import numpy as np

from ...pcm import SAMPLE_RATE
from ..params import DecodeParams, UnsupportedDecode

DETECT_LANGUAGE_KEY = "_detect_language"  # SGLang's FUSED_AUTODETECT_FLAG


def refusal(params: DecodeParams, decoder_start_id: int) -> UnsupportedDecode | None:
    """Why this decode cannot go to SGLang, or None."""
    if not params.prompt_ids or params.prompt_ids[0] != decoder_start_id:
        return UnsupportedDecode("a prompt (previous text or hotwords) cannot be sent to SGLang: its Whisper "
                                 "processor builds the decoder prompt itself and drops any text before "
                                 "<|startoftranscript|>", "prompt")
    if params.alignment_heads:
        return UnsupportedDecode("word timestamps need the decoder's cross-attention, which SGLang does not "
                                 "return", "timestamp_granularities")
    if params.beam_size > 1:
        return UnsupportedDecode("beam search is not available with the SGLang engine", "beam_size")
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


def constraint(params: DecodeParams) -> str:
    """The structural tag to send: the prompt's tokens after <|startoftranscript|> forced first,
    then the adapter's own constraint (which already carries Whisper's rules that a constraint
    can say: see adapters/whisper_grammar.py)."""
    forced = [{"type": "token", "token": t} for t in params.prompt_ids[1:]]
    rest = list(params.constraint.elements) if params.constraint is not None else [{"type": "any_tokens", "exclude_tokens": []}]
    return json.dumps({"type": "structural_tag", "format": {"type": "sequence", "elements": forced + rest}},
                      separators=(",", ":"))


def generate_body(rid: str, samples: np.ndarray, params: DecodeParams) -> dict:
    """The /generate request for one sequence over one audio window (always streamed)."""
    forced = len(params.prompt_ids) - 1
    sampling = {
        DETECT_LANGUAGE_KEY: True,
        "max_new_tokens": params.max_new_tokens + forced,
        "temperature": params.temperature,
        "structural_tag": constraint(params),
        # The text field is not used (the adapter parses token ids), but keep it faithful.
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    if params.temperature > 0:
        if params.top_k:
            sampling["top_k"] = params.top_k
        if params.top_p is not None:
            sampling["top_p"] = params.top_p
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
    body = {
        "rid": rid,
        # SGLang's request class refuses a body with no text, input_ids or input_embeds; its own
        # transcription endpoint sends an empty text, which its Whisper processor then replaces.
        "text": "",
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
                "and later check sampling_params against a fixed schema); run SGLang 0.5.11 to 0.5.21 "
                f"(see docs/scaling-out.md). Server said: {text[:300]}")
    return None


@dataclass
class StreamState:
    """What one streamed /generate call has delivered so far (cumulative or incremental events)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_position_logprobs: dict[int, float] | None = None  # token_ids_logprob rows at output 0
    finish: dict | None = None

    def update(self, event: dict) -> list[int]:
        """Take one event; returns the token ids it adds."""
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise GenerateError(str(message), error.get("code") if isinstance(error, dict) else None)
        ids = list(event.get("output_ids") or [])
        meta = event.get("meta_info") or {}
        total = meta.get("completion_tokens")
        cumulative = total is None or len(ids) == total
        new = ids[len(self.token_ids):] if cumulative else ids
        rows = meta.get("output_token_logprobs") or []
        rows = rows[len(self.logprobs):] if cumulative else rows
        positions = meta.get("output_token_ids_logprobs") or []
        if self.first_position_logprobs is None and positions and (cumulative or not self.token_ids):
            self.first_position_logprobs = {int(r[1]): _logprob(r[0]) for r in (positions[0] or [])}
        self.token_ids += new
        self.logprobs += [_logprob(r[0]) for r in rows[: len(new)]]
        if meta.get("finish_reason"):
            self.finish = meta["finish_reason"]
        return new


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


def parse_event_line(line: str) -> dict | None:
    """One SSE line -> its JSON event; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)
