"""What a realtime session tells its client, free of any wire protocol (realtime.protocol turns
each event into the dialect's JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpeechStarted:
    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class Committed:
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True)
class Cleared:
    pass


@dataclass(frozen=True)
class TextDelta:
    item_id: str
    text: str


@dataclass(frozen=True)
class Completed:
    item_id: str
    # The utterance's text: a file's decode of its audio. The item's deltas concatenate to it
    # unless that decode disagrees with words a preview already sent (stable_text.continuation).
    text: str
    language: str | None
    seconds: float
    prompt_tokens: int
    output_tokens: int
    redecodes: dict[str, int] = field(default_factory=dict)  # the final decode's (TranscriptionResult.redecodes)


@dataclass(frozen=True)
class Failed:
    item_id: str
    message: str
    code: str


@dataclass(frozen=True)
class SessionError:
    message: str
    code: str
    param: str | None = None


SessionEvent = SpeechStarted | SpeechStopped | Committed | Cleared | TextDelta | Completed | Failed | SessionError
