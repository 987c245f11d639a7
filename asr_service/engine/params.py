"""What the engine gives back per sequence, where it waits, and how a decode fails. Plain data,
no behaviour. What a sequence asks for (its prompt, constraint and settings) is the adapters'
`decode_request` module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Priority:
    """Where a sequence waits for the engine: live work (a person waits for its words as they
    speak: realtime) apart from bulk work, in a lane the engine serves first (the embedded
    engine: engine/lane.py); within each, the oldest work first: ``planned_at`` is
    time.monotonic() when the window it belongs to was planned, so a window's continuations and
    retries go ahead of windows planned after it (live work: since when a person has waited for
    its text)."""

    planned_at: float
    live: bool = False


@dataclass(frozen=True)
class StepEvent:
    token_id: int
    logprob: float


@dataclass
class SequenceResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    probe_probs: dict[int, float] = field(default_factory=dict)
    # alignment_heads' cross-attention when each generated token was predicted:
    # [heads, generated tokens, audio frames] (None unless asked for).
    cross_attention: Any = None
    # "stop" (end of text), "length", "grammar", "cancelled", "error", or "unavailable" (a remote
    # engine had no server that could finish it)
    finish_reason: str = ""
    error: str | None = None


class UnsupportedDecode(ValueError):
    """An engine cannot decode what the params ask for; ``param`` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class EngineUnavailable(RuntimeError):
    """The decode could not be finished for want of a working engine server (try again later)."""


class DecodeFailed(RuntimeError):
    """The engine failed while decoding (an exception in its step, a reply it could not use):
    this request gets the reason; the engine goes on serving the others."""


def raise_if_failed(result: SequenceResult) -> None:
    """A decode that did not end by itself (stop, length or grammar) raises here."""
    if result.finish_reason == "unavailable":
        raise EngineUnavailable(result.error or "no engine server available")
    if result.finish_reason in ("error", "cancelled"):
        raise DecodeFailed(f"the decode ended with {result.finish_reason}: {result.error or 'no result'}")
