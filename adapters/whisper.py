"""WhisperAdapter: prompts, token-strict grammars and fail-strict parsing for Whisper."""

from __future__ import annotations

import logging
import re

from .decode_request import CanaryDecode, DecodeParams

from .base import ParsedOutput, ParsedSegment, SpeechToTextConfig, TranscriptionAdapter
from .whisper_grammar import GrammarKey, WhisperGrammars
from .whisper_tokenizer import WhisperTokenizer

log = logging.getLogger(__name__)

# Scripts written without spaces between words: chunk texts join with "".
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "yue", "th", "lo", "my", "bo", "km"})
# Punctuation that belongs to the word before it, or to the word after it (openai/whisper's sets).
_CLOSING_PUNCTUATION = frozenset("\"'.。,，!！?？:：”)]}、")
_OPENING_PUNCTUATION = frozenset("\"'“¿([{-")
_TIMESTAMP_TEXT = re.compile(r"<\|\d+\.\d\d\|>")
# openai/whisper's rule: multilingual checkpoints have at least this many tokens; English-only
# (.en) ones have one fewer text token, and are never prompted with a language or task.
MULTILINGUAL_VOCAB_SIZE = 51865


class WhisperAdapter(TranscriptionAdapter):
    supported_tasks = ("transcribe", "translate")
    supports_language_detection = True
    supports_timestamps = True
    supports_word_timestamps = True

    def __init__(self, tokenizer: WhisperTokenizer, suppress_ids: list[int] = (), n_text_ctx: int = 448,
                 alignment_heads: tuple[tuple[int, int], ...] = ()):
        self.tok = tokenizer
        self.alignment_heads = tuple(alignment_heads)
        # Non-speech symbols the model was trained to avoid (the grammar keeps them out of text).
        self.grammars = WhisperGrammars(tokenizer, tuple(sorted(i for i in suppress_ids if 0 <= i < tokenizer.eot)))
        self.n_text_ctx = n_text_ctx
        self.supported_languages = tuple(tokenizer.language_ids)
        self.config = SpeechToTextConfig(no_space_languages=NO_SPACE_LANGUAGES & set(self.supported_languages))
        self._blank = tuple(tokenizer.encode(" ")) + (tokenizer.eot,)
        no_speech = (tokenizer.no_speech,) if tokenizer.no_speech is not None else ()
        self._probe_ids = tuple(tokenizer.language_ids.values()) + no_speech

    @staticmethod
    def from_loaded(loaded) -> "WhisperAdapter":
        """The adapter for a loaded model: multilingual, or English-only by its vocabulary size.
        Every id comes from the model's own tokenizer and config."""
        tok = WhisperTokenizer(loaded.tokenizer_file, loaded.dims.n_vocab)
        heads = loaded.alignment_heads
        if not heads:  # the model names none: every head of the upper half of the decoder
            d = loaded.dims
            heads = [(layer, h) for layer in range(d.n_text_layer // 2, d.n_text_layer) for h in range(d.n_text_head)]
        family = WhisperAdapter if loaded.dims.n_vocab >= MULTILINGUAL_VOCAB_SIZE else EnglishOnlyWhisperAdapter
        return family(tok, loaded.suppress_ids, loaded.dims.n_text_ctx, tuple(tuple(h) for h in heads))

    # ---- prompts ----
    def _context(self, previous_text: str | None) -> list[int]:
        """``<|startofprev|>`` + previous text, truncated from the left to half the context."""
        if not previous_text or not previous_text.strip():
            return []
        budget = self.n_text_ctx // 2 - 1
        # Only the end of a long text is kept, so it is cut by characters before tokenizing: the
        # last budget x longest-token characters hold at least ``budget`` tokens, and a prompt of
        # megabytes costs what one that fits costs (this runs on the event loop, per decode).
        text = previous_text.strip()[-budget * self.tok.longest_text_token :]
        return [self.tok.sot_prev] + self.tok.encode(" " + text)[-budget:]

    def _text_start_after(self, timestamps: bool) -> frozenset[int]:
        """The token after which text begins: the task token (timestamps) or <|notimestamps|>."""
        tok = self.tok
        return frozenset({tok.transcribe, tok.translate} if timestamps else {tok.no_timestamps})

    def _params(self, prompt: list[int], key: GrammarKey, probe_index: int, extra_prefix: int) -> DecodeParams:
        tok = self.tok
        return DecodeParams(
            prompt_ids=tuple(prompt),
            eot_id=tok.eot,
            constraint=self.grammars.get(key),
            text_start_after_ids=self._text_start_after(key.timestamps),
            blank_ids=self._blank,
            timestamp_begin=tok.timestamp_begin if key.timestamps else None,
            probe_index=probe_index,
            probe_ids=self._probe_ids,
            max_new_tokens=min(self.n_text_ctx // 2 + extra_prefix, self.n_text_ctx - len(prompt)),
        )

    def _check_task(self, task: str) -> None:
        if task not in self.supported_tasks:
            raise ValueError(f"unsupported task {task!r}; supported: {', '.join(self.supported_tasks)}")

    def build_prompt(self, language, task="transcribe", timestamps=False, previous_text=None) -> DecodeParams:
        self._check_task(task)
        code = self.validate_language(language)
        if code is None:
            raise ValueError("build_prompt needs a language; use build_fused_autodetect_params to detect it")
        ctx = self._context(previous_text)
        tok = self.tok
        prompt = ctx + [tok.sot, tok.language_ids[code], tok.transcribe if task == "transcribe" else tok.translate]
        if not timestamps:
            prompt.append(tok.no_timestamps)
        return self._params(prompt, self.grammars.key(task, timestamps, None), len(ctx), 0)

    def build_fused_autodetect_params(self, task="transcribe", timestamps=False, candidate_languages=None,
                                      previous_text=None) -> DecodeParams:
        self._check_task(task)
        candidates = tuple(self.validate_language(c) for c in candidate_languages) if candidate_languages else None
        ctx = self._context(previous_text)
        key = self.grammars.key(task, timestamps, candidates or self.supported_languages)
        # The prefix <|lang|><|task|><|mode|> is generated: allow for it in the token budget.
        return self._params(ctx + [self.tok.sot], key, len(ctx), 3)

    def build_canary(self, previous_text: str | None = None) -> CanaryDecode:
        """The decode a remote engine's server must pass before it gets traffic (see
        asr_service.engine.sglang): on silence, prompt ``[<|startofprev|> previous text]
        <|startoftranscript|>``, and the canary constraint (WhisperGrammars.canary).

        - A server that applies both answers a language, ``<|translate|><|notimestamps|>``, and
          the end of text: after <|startoftranscript|> the model always names a language, and the
          constraint then forces the task it would not pick.
        - One that ignores the prompt and decodes SGLang's default English transcription prompt
          (SGLang 0.5.22+ without the plugin, or 0.5.21 without the plugin given input_ids)
          answers plain text or the end of text at once: after <|notimestamps|> the model does not
          name a language.
        - One that drops the constraint (an SGLang router) answers <|transcribe|> or
          <|nospeech|> after a language, or special tokens the constraint forbids.
        """
        tok = self.tok
        prompt = self._context(previous_text) + [tok.sot]
        params = DecodeParams(prompt_ids=tuple(prompt), eot_id=tok.eot, constraint=self.grammars.canary(),
                              max_new_tokens=8)
        return CanaryDecode(params, self._canary_failure)

    def _canary_failure(self, token_ids: list[int]) -> str | None:
        tok = self.tok
        ids = token_ids[:-1] if token_ids[-1:] == [tok.eot] else list(token_ids)
        if len(ids) == 3 and ids[0] in tok.id_to_language and ids[1:] == [tok.translate, tok.no_timestamps]:
            return None
        if all(t < tok.eot for t in ids):
            return ("it ignores the decoder prompt it is sent (it answered as if prompted with SGLang's default "
                    f"English transcription prompt: {self.tok.decode(ids)!r})")
        names = [tok.token_string(t) for t in token_ids]
        return (f"it does not apply the constraint it is sent (an SGLang router drops structural_tag): the canary "
                f"decode gave {names}, where the constraint forces a language, <|translate|>, <|notimestamps|>")

    # ---- parsing ----
    def _prefix_in_prompt(self, params: DecodeParams) -> bool:
        return params.prompt_ids[-1] != self.tok.sot

    def parse_fused_output(self, token_ids: list[int]) -> tuple[str | None, str | None]:
        out = self._parse_fused(token_ids)
        return (out.language, out.text) if out.failure is None else (None, None)

    def _parse_fused(self, token_ids: list[int]) -> ParsedOutput:
        tok = self.tok
        ids = list(token_ids)
        if len(ids) < 3:
            return self._failed(f"output ended after {len(ids)} tokens, before the <|lang|><|task|><|mode|> prefix")
        language = tok.id_to_language.get(ids[0])
        if language is None:
            return self._failed(f"first token {ids[0]} ({tok.token_string(ids[0])!r}) is not a language token")
        if ids[1] not in (tok.transcribe, tok.translate):
            return self._failed(f"second token {tok.token_string(ids[1])!r} is not a task token")
        if ids[2] == tok.no_timestamps:
            prefix_length = 3
        elif ids[2] >= tok.timestamp_begin:
            prefix_length = 2  # the opening timestamp belongs to the text
        else:
            return self._failed(f"third token {tok.token_string(ids[2])!r} is neither <|notimestamps|> nor a timestamp")
        parsed = self._parse_body(language, ids[prefix_length:])
        parsed.prefix_length = prefix_length
        return parsed

    @staticmethod
    def _failed(why: str) -> ParsedOutput:
        log.warning("fused prefix did not parse: %s", why)
        return ParsedOutput(None, None, failure=why)

    def parse_output(self, token_ids: list[int], params: DecodeParams) -> ParsedOutput:
        if not self._prefix_in_prompt(params):
            return self._parse_fused(token_ids)
        language = next((self.tok.id_to_language[i] for i in params.prompt_ids if i in self.tok.id_to_language), None)
        return self._parse_body(language, list(token_ids))

    def _parse_body(self, language: str | None, body: list[int]) -> ParsedOutput:
        tok = self.tok
        if tok.eot in body:
            body = body[: body.index(tok.eot)]
        segments: list[ParsedSegment] = []
        start: float | None = None
        current: list[int] = []
        for t in body:
            if t >= tok.timestamp_begin:
                time_s = tok.timestamp_seconds(t)
                if start is None:
                    start = time_s  # opening timestamp
                else:
                    if current:
                        segments.append(ParsedSegment(start, time_s, tok.decode(current), current))
                    start, current = None, []
            else:
                current.append(t)
        if current:
            # Text with no closing timestamp (or no timestamps at all): end unknown here.
            segments.append(ParsedSegment(start, None, tok.decode(current), current))
        text = "".join(s.text for s in segments).strip()
        continues_at = start if start is not None and not current else None
        return ParsedOutput(language, text, segments, continues_at=continues_at)

    def split_words(self, token_ids: list[int], language: str | None) -> list[tuple[str, int]]:
        """(word, number of tokens) covering ``token_ids`` in order. Tokens are first grouped
        into whole characters (a character can span tokens); in languages written with spaces
        a word starts at a leading space, and punctuation joins the word it touches."""
        pieces: list[tuple[str, int]] = []
        pending: list[int] = []
        for t in token_ids:
            pending.append(t)
            text = self.tok.decode(pending)
            if "\ufffd" not in text:
                pieces.append((text, len(pending)))
                pending = []
        if pending:
            pieces.append((self.tok.decode(pending), len(pending)))
        if language in self.config.no_space_languages:
            return pieces
        words: list[list] = []
        for text, n in pieces:
            glue_back = words and (not text.startswith(" ") or text.strip() in _CLOSING_PUNCTUATION)
            glue_forward = words and words[-1][0].strip() in _OPENING_PUNCTUATION
            if glue_back or glue_forward:
                words[-1][0] += text
                words[-1][1] += n
            else:
                words.append([text, n])
        return [(w, n) for w, n in words]

    def forced_prefix_tokens(self, params: DecodeParams) -> int:
        return 0 if self._prefix_in_prompt(params) else 3

    def draft_body(self, params: DecodeParams, token_ids: list[int]) -> tuple[int, ...]:
        # A generated prefix is the language and the task, then the mode token: <|notimestamps|>,
        # or a timed decode's opening timestamp, which belongs to its body.
        body = list(token_ids[0 if self._prefix_in_prompt(params) else 2 if params.timed else 3:])
        return tuple(body[:-1] if body and body[-1] == self.tok.eot else body)

    def draft_ids(self, params: DecodeParams, task: str, language: str, body: list[int]) -> tuple[int, ...]:
        if self._prefix_in_prompt(params):
            return tuple(body)
        tok = self.tok
        task_id = tok.transcribe if task == "transcribe" else tok.translate
        mode = () if params.timed else (tok.no_timestamps,)
        return (tok.language_ids[language], task_id, *mode, *body)

    def tokens_before_text(self, params: DecodeParams) -> int:
        # The fused prefix ends with the mode token (<|notimestamps|> or the opening timestamp);
        # with the prefix in the prompt, a timed decode still generates its opening timestamp.
        if not self._prefix_in_prompt(params):
            return 3
        return 1 if params.timed else 0

    def decode_text(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tok.token_bytes(token_id)

    def strip_special_tokens(self, text: str) -> str:
        """Remove Whisper's own tokens only; a spoken "<|foo|>" stays."""
        for name in self.tok.special_token_strings:
            text = text.replace(name, "")
        return _TIMESTAMP_TEXT.sub("", text)

    def language_probabilities(self, probe_probs, candidate_languages=None) -> dict[str, float]:
        codes = candidate_languages or self.supported_languages
        raw = {c: probe_probs.get(self.tok.language_ids[c], 0.0) for c in codes}
        total = sum(raw.values())
        return {c: p / total for c, p in raw.items()} if total > 0 else {}

    def no_speech_probability(self, probe_probs: dict[int, float]) -> float | None:
        return probe_probs.get(self.tok.no_speech) if self.tok.no_speech is not None else None


class EnglishOnlyWhisperAdapter(WhisperAdapter):
    """Whisper's English-only checkpoints (tiny.en ... medium.en, distil .en): trained on
    ``<|startoftranscript|>`` then the text (``<|notimestamps|>`` first when without timestamps),
    with no language or task token. Their tokenizer still lists the language tokens, at ids one
    lower than the multilingual ones; the model never emits them. So there is nothing to
    detect: every request is English, and translation does not exist."""

    supported_tasks = ("transcribe",)
    supports_language_detection = False

    def __init__(self, tokenizer: WhisperTokenizer, suppress_ids: list[int] = (), n_text_ctx: int = 448,
                 alignment_heads: tuple[tuple[int, int], ...] = ()):
        super().__init__(tokenizer, suppress_ids, n_text_ctx, alignment_heads)
        self.supported_languages = ("en",)
        self.config = SpeechToTextConfig()
        self._probe_ids = (tokenizer.no_speech,) if tokenizer.no_speech is not None else ()

    def _text_start_after(self, timestamps: bool) -> frozenset[int]:
        return frozenset({self.tok.sot} if timestamps else {self.tok.no_timestamps})

    def build_prompt(self, language, task="transcribe", timestamps=False, previous_text=None) -> DecodeParams:
        self._check_task(task)
        if self.validate_language(language) is None:
            raise ValueError("build_prompt needs a language: 'en' for an English-only model")
        ctx = self._context(previous_text)
        prompt = ctx + [self.tok.sot] + ([] if timestamps else [self.tok.no_timestamps])
        return self._params(prompt, self.grammars.key(task, timestamps, None), len(ctx), 0)

    def build_fused_autodetect_params(self, task="transcribe", timestamps=False, candidate_languages=None,
                                      previous_text=None) -> DecodeParams:
        raise NotImplementedError("an English-only Whisper detects no language: every request is English")

    def build_canary(self, previous_text: str | None = None) -> CanaryDecode:
        # The canary tells servers apart by the language and task tokens these models never emit.
        raise ValueError("English-only Whisper models are served by the embedded engine, not through SGLang")

    def _prefix_in_prompt(self, params: DecodeParams) -> bool:
        return True  # there is no prefix to generate

    def parse_output(self, token_ids: list[int], params: DecodeParams) -> ParsedOutput:
        return self._parse_body("en", list(token_ids))

    def language_probabilities(self, probe_probs, candidate_languages=None) -> dict[str, float]:
        return {"en": 1.0}
