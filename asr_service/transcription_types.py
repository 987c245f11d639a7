"""The pipeline's data: what a request asks of the decode (TranscriptionOptions), what it gets
back (TranscriptionResult with its Segments, words and token logprobs), and the events a run
yields (ChunkDone, Finished). Plain dataclasses, imported by every stage and importing none:
request options build them, the pipeline fills them, the response writers read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fallback import QualityThresholds
from .speech_gate import VadSettings
from .word_timing import Word


@dataclass(frozen=True)
class TranscriptionOptions:
    task: str = "transcribe"
    language: str | None = None  # None: fused detection in the same decode
    timestamps: bool = False
    previous_text: str | None = None  # the request's prompt: conditions every chunk
    candidate_languages: tuple[str, ...] | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float = 0.0
    seed: int | None = None
    max_new_tokens: int | None = None
    # vLLM's penalties (engine/params.py DecodeParams), neutral by default; fallback retries keep them.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # "fused" (one decode per chunk) or "two-stage" (the baseline of two_stage.py).
    detection: str = "fused"
    # At temperature 0, a chunk that fails the thresholds is decoded again at these.
    fallback_temperatures: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    thresholds: QualityThresholds = QualityThresholds()
    # Each chunk keeps the language it detected (code-switching audio) instead of the vote.
    detect_language_per_chunk: bool = False
    # Condition each chunk on the text of the one before (chunks then decode one by one).
    condition_on_previous_text: bool = False
    hotwords: str | None = None  # words to favour, given to the model as context
    # Windows in which the speech gate (Silero VAD) hears no speech are not decoded at all.
    vad_filter: bool = True
    vad: VadSettings = VadSettings()  # where long audio is cut (the request's chunking_strategy)
    word_timestamps: bool = False  # words with times, from the alignment heads' attention
    beam_size: int = 1  # above 1: beam search for the temperature-0 decode (fallback retries sample)
    length_penalty: float | None = None
    # The kept decodes' text tokens with their log-probabilities in the result (include[]=logprobs).
    token_logprobs: bool = False
    # Audio with no speech gets its most probable language (one encoder pass, one decoder step)
    # rather than none; realtime partial decodes, which only compare texts, skip it.
    name_language_of_silence: bool = True
    # A realtime preview's cheaper encoder pass (engine DecodeParams.audio_sized_encoder): only
    # where a whole-window decode gives the text that counts, and only on an engine that has it.
    audio_sized_encoder: bool = False
    # What a decode of the start of the same audio said (a realtime preview's last decode): its
    # window's first greedy decode checks it in one pass instead of stepping through it
    # (engine DecodeParams.draft_ids).
    draft: Draft | None = None


@dataclass(frozen=True)
class Draft:
    """What a greedy decode of some audio generated after its prefix (its text, and in a timed
    decode its timestamps: adapters' draft_body), offered to the next decode of the same audio
    grown longer, in the same mode (``timed``)."""

    language: str
    timed: bool
    tokens: tuple[int, ...]


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    language: str | None
    speaker: str | None = None  # with diarization (diarization/attribution.py): who said it


@dataclass(frozen=True)
class TokenLogprob:
    """A generated text token, in OpenAI's logprobs shape: its text, its UTF-8 bytes (a
    character may span tokens: then ``token`` holds U+FFFD for the part it lacks) and its
    log-probability under the decode that was kept."""

    token: str
    logprob: float
    bytes: list[int]


@dataclass
class TranscriptionResult:
    task: str
    text: str
    language: str | None
    language_probability: float | None
    duration: float
    segments: list[Segment] = field(default_factory=list)
    words: list[Word] | None = None  # with word_timestamps: every word, times from the audio start
    # Why language detection failed on some chunk (None when it did not).
    detection_failure: str | None = None
    prompt_tokens: int = 0  # over the kept decodes of all chunks
    output_tokens: int = 0
    # "length" when the token cap (max_completion_tokens, or the model's) cut a kept decode's
    # text, else "stop": what vLLM and SGLang report as finish_reason.
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None  # with token_logprobs: every text token, in order
    # Times part of a window was decoded again, by the rule that asked for it (fallback.py's,
    # window_decode.py's, transcription.LANGUAGE_OUTLIER): /metrics counts them.
    redecodes: dict[str, int] = field(default_factory=dict)
    # Where the audio was decoded as one greedy piece: what it generated, for a realtime preview
    # of the same audio grown longer to check in one pass (TranscriptionOptions.draft).
    draft: Draft | None = None


# ---- what a run yields ----

@dataclass(frozen=True)
class ChunkDone:
    """Window ``index`` is final: ``text`` is exactly what it adds to the result's text (with
    the joiner before it when text came before), and the tokens its kept decodes used."""

    index: int
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Finished:
    result: TranscriptionResult


PipelineEvent = ChunkDone | Finished
