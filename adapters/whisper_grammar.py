"""Token-strict constraints for Whisper decodes, compiled with xgrammar structural tags.

A byte-level regex such as ``<\\|(en|fr)\\|>...`` lets the model spell the prefix with the
ordinary tokens ``<``, ``|``, ``fr``... and lets special tokens slip into the text. A structural
tag made of ``token`` elements (matched by id) and ``any_tokens`` with ``exclude_tokens``
works on token ids instead: at the first step only the language ids are legal.

The constraint is also where every Whisper rule that a constraint can say lives, so the
embedded engine and remote engines (SGLang, which applies no logit rules) get it from this one
source: the non-speech symbols the model was trained to avoid never appear in text, and with
timestamps the text opens with a timestamp of at most 1 s. The rules that depend on the
probabilities or on pairs of timestamps are logit rules (``asr_service.engine.logits``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

import xgrammar as xgr

from .decode_request import Constraint

from .whisper_tokenizer import WhisperTokenizer

log = logging.getLogger(__name__)

# Whisper's rule: the first timestamp of a window is at most 1.00 s (50 steps of 0.02 s).
MAX_INITIAL_TIMESTAMP_INDEX = 50


@dataclass(frozen=True)
class GrammarKey:
    """Which constraint: ``languages`` empty means the prefix is already in the prompt and only
    the text part is constrained; otherwise the decode must open with one of these languages
    (in token-id order, so equal sets give equal keys), then ``task``, then the mode token."""

    task: str
    timestamps: bool
    languages: tuple[str, ...] = ()


class WhisperGrammars:
    def __init__(self, tokenizer: WhisperTokenizer, suppress_ids: tuple[int, ...] = ()):
        self.tok = tokenizer
        self.suppress_ids = tuple(suppress_ids)
        info = xgr.TokenizerInfo(
            tokenizer.encoded_vocab(),
            xgr.VocabType.BYTE_LEVEL,
            vocab_size=tokenizer.vocab_size,
            stop_token_ids=[tokenizer.eot],
            add_prefix_space=False,
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict[GrammarKey, Constraint] = {}
        self._lock = threading.Lock()
        self.compile_counts: Counter[GrammarKey] = Counter()

    def key(self, task: str, timestamps: bool, languages: tuple[str, ...] | None) -> GrammarKey:
        if languages:
            languages = tuple(sorted(set(languages), key=self.tok.language_ids.__getitem__))
        return GrammarKey(task, timestamps, languages or ())

    def get(self, key: GrammarKey) -> Constraint:
        """The constraint for ``key``, compiled once (keys are few and deterministic)."""
        with self._lock:
            constraint = self._cache.get(key)
            if constraint is None:
                start = time.perf_counter()
                elements = self.elements(key)
                tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": list(elements)}}
                constraint = Constraint(elements, self._compiler.compile_structural_tag(tag))
                self._cache[key] = constraint
                self.compile_counts[key] += 1
                log.debug("compiled grammar %s in %.1f ms", key, 1e3 * (time.perf_counter() - start))
            return constraint

    def elements(self, key: GrammarKey) -> tuple[dict, ...]:
        tok = self.tok
        # Text may hold ordinary tokens and end-of-text; timestamps only in that variant.
        excluded = set(tok.special_ids - {tok.eot}) | set(self.suppress_ids)
        if not key.timestamps:
            excluded |= set(range(tok.timestamp_begin, tok.vocab_size))
        elements: list[dict] = []
        if key.languages:
            task_id = tok.transcribe if key.task == "transcribe" else tok.translate
            elements.append(_one_of([tok.language_ids[c] for c in key.languages]))
            elements.append({"type": "token", "token": task_id})
            if not key.timestamps:
                elements.append({"type": "token", "token": tok.no_timestamps})
        if key.timestamps:  # the text opens with its first timestamp
            first = tok.timestamp_begin
            elements.append(_one_of(list(range(first, first + MAX_INITIAL_TIMESTAMP_INDEX + 1))))
        elements.append({"type": "any_tokens", "exclude_tokens": sorted(excluded)})
        return tuple(elements)


    def canary(self) -> Constraint:
        """A constraint that allows two outputs: a language, then ``<|translate|><|notimestamps|>``
        (what the model does after a prompt ending in <|startoftranscript|>, except the task it
        would not pick), or plain text (what it does after a prompt that already holds the
        prefix). See WhisperAdapter.build_canary for what each outcome tells."""
        tok = self.tok
        prefix = {"type": "sequence", "elements": [_one_of(sorted(tok.language_ids.values())),
                                                   {"type": "token", "token": tok.translate},
                                                   {"type": "token", "token": tok.no_timestamps}]}
        text = {"type": "any_tokens", "exclude_tokens": sorted(tok.special_ids - {tok.eot})}
        elements = ({"type": "or", "elements": [prefix, text]},)
        tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": list(elements)}}
        return Constraint(elements, self._compiler.compile_structural_tag(tag))


def _one_of(ids: list[int]) -> dict:
    if len(ids) == 1:
        return {"type": "token", "token": ids[0]}
    return {"type": "or", "elements": [{"type": "token", "token": i} for i in ids]}
