"""The extension point for speech-to-text model families.

An adapter turns a request (task, language or none, timestamps, previous text) into the
engine's DecodeParams, and the engine's token ids back into language, text and segments.
The serving layer never branches on the model; it asks the adapter. Capabilities are class
attributes so a reader sees what a model can do without running it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from .decode_request import DecodeParams


class UnsupportedLanguageError(ValueError):
    def __init__(self, language: str, supported: tuple[str, ...]):
        self.language = language
        self.supported = supported
        shown = language[:40] + "..." if isinstance(language, str) and len(language) > 40 else language
        super().__init__(
            f"Unsupported language {shown!r}. Supported ISO-639-1 codes: {', '.join(supported)}"
        )


@dataclass(frozen=True)
class SpeechToTextConfig:
    sample_rate: int = 16000
    max_clip_seconds: float = 30.0
    chunking: bool = True
    # Languages written without spaces between words: chunk texts join with "".
    no_space_languages: frozenset[str] = frozenset()


@dataclass
class ParsedSegment:
    """A piece of text with times relative to the start of its audio window (None: no timestamps)."""

    start: float | None
    end: float | None
    text: str
    token_ids: list[int] = field(default_factory=list)


@dataclass
class ParsedOutput:
    language: str | None
    text: str | None
    segments: list[ParsedSegment] = field(default_factory=list)
    # Where the output came apart: None when it parsed.
    failure: str | None = None
    # How many generated tokens were the forced prefix (not text): 0 when the prompt held it.
    prefix_length: int = 0
    # The output ended on an opening timestamp with no text after it: Whisper's sign that speech
    # goes on past what it transcribed, from this time (seconds into the window) on.
    continues_at: float | None = None


class TranscriptionAdapter(ABC):
    supported_languages: tuple[str, ...] = ()
    supported_tasks: tuple[str, ...] = ("transcribe",)
    supports_language_detection: bool = False
    supports_timestamps: bool = False
    supports_word_timestamps: bool = False
    # (decoder layer, head) pairs whose cross-attention follows the audio (for word timing).
    alignment_heads: tuple[tuple[int, int], ...] = ()
    config: SpeechToTextConfig = SpeechToTextConfig()

    def validate_language(self, language: str | None) -> str | None:
        """Normalise an ISO-639-1 code; None stays None (detect). Raises UnsupportedLanguageError."""
        if language is None or language == "":
            return None
        if not isinstance(language, str):
            raise UnsupportedLanguageError(language, self.supported_languages)
        code = language.strip().lower()
        if code not in self.supported_languages:
            raise UnsupportedLanguageError(language, self.supported_languages)
        return code

    def validate_language_choices(self, languages: list[str] | None) -> tuple[str, ...] | None:
        """Normalise a list of codes detection may choose from; None or [] is no restriction.
        Unlike a single language, an empty item is not "detect": it is refused, as is anything
        that is not a supported code (UnsupportedLanguageError)."""
        if not languages:
            return None
        codes = []
        for language in languages:
            if not isinstance(language, str) or not language.strip():
                raise UnsupportedLanguageError(language, self.supported_languages)
            codes.append(self.validate_language(language))
        return tuple(dict.fromkeys(codes))

    @abstractmethod
    def build_prompt(self, language: str, task: str = "transcribe", timestamps: bool = False,
                     previous_text: str | None = None) -> DecodeParams:
        """DecodeParams for a known language: the prompt carries it, nothing is detected."""

    def build_fused_autodetect_params(self, task: str = "transcribe", timestamps: bool = False,
                                      candidate_languages: tuple[str, ...] | None = None,
                                      previous_text: str | None = None) -> DecodeParams:
        """DecodeParams whose one decode emits the language, the task, the mode and the text."""
        raise NotImplementedError(f"{type(self).__name__} cannot detect the language")

    @abstractmethod
    def parse_fused_output(self, token_ids: list[int]) -> tuple[str | None, str | None]:
        """(language, text) from a fused decode, or (None, None) when the prefix is not there."""

    @abstractmethod
    def parse_output(self, token_ids: list[int], params: DecodeParams) -> ParsedOutput:
        """Language, text and segments from the generated ids of a decode built by this adapter."""

    @abstractmethod
    def forced_prefix_tokens(self, params: DecodeParams) -> int:
        """How many generated tokens must arrive before parse_output can tell whether the
        forced prefix is there (0 when the prompt already holds it)."""

    @abstractmethod
    def draft_body(self, params: DecodeParams, token_ids: list[int]) -> tuple[int, ...]:
        """What a decode under ``params`` generated after its prefix, without its end of text:
        its text, and in a timed decode its timestamps (the first one included)."""

    @abstractmethod
    def draft_ids(self, params: DecodeParams, task: str, language: str, body: list[int]) -> tuple[int, ...]:
        """The tokens a decode under ``params`` generates if it says ``body`` (draft_body's, from
        a decode in the same mode) in ``language`` (engine DecodeParams.draft_ids): the prefix
        it generates, then the body."""

    @abstractmethod
    def tokens_before_text(self, params: DecodeParams) -> int:
        """How many generated tokens come before the text's own (a text token budget, such as
        max_completion_tokens, does not count them)."""

    @abstractmethod
    def decode_text(self, token_ids: list[int]) -> str:
        """Visible text of generated text tokens (special and timestamp tokens left out)."""

    @abstractmethod
    def strip_special_tokens(self, text: str) -> str:
        """Remove the model's own special tokens from text, and nothing else."""

    def language_probabilities(self, probe_probs: dict[int, float],
                               candidate_languages: tuple[str, ...] | None = None) -> dict[str, float]:
        """Softmax over the allowed language tokens, from the engine's probe at the first step."""
        return {}

    def no_speech_probability(self, probe_probs: dict[int, float]) -> float | None:
        """Probability that the window holds no speech, from the same probe (None: unknown)."""
        return None

    def split_words(self, token_ids: list[int], language: str | None) -> list[tuple[str, int]]:
        """(word, number of tokens) covering text ``token_ids`` in order (word timestamps)."""
        raise NotImplementedError(f"{type(self).__name__} cannot time words")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a generated text token spells (include[]=logprobs)."""
        raise NotImplementedError(f"{type(self).__name__} cannot spell single tokens")

    def joiner(self, language: str | None) -> str:
        return "" if language in self.config.no_space_languages else " "
