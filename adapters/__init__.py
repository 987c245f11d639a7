"""Model-family adapters for asr-service (this project's own ``adapters`` package)."""

from .base import ParsedOutput, ParsedSegment, SpeechToTextConfig, TranscriptionAdapter, UnsupportedLanguageError
from .whisper import WhisperAdapter

__all__ = [
    "ParsedOutput",
    "ParsedSegment",
    "SpeechToTextConfig",
    "TranscriptionAdapter",
    "UnsupportedLanguageError",
    "WhisperAdapter",
]
