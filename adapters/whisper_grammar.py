"""Token-strict constraints for Whisper decodes, compiled with xgrammar structural tags.

A byte-level regex such as ``<\\|(en|fr)\\|>...`` lets the model spell the prefix with the
ordinary tokens ``<``, ``|``, ``fr``... and lets special tokens slip into the text. A structural
tag made of ``token`` elements (matched by id) and ``any_tokens`` with ``exclude_tokens``
works on token ids instead: at the first step only the language ids are legal.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass

import xgrammar as xgr

from .whisper_tokenizer import WhisperTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GrammarKey:
    """Which constraint: ``languages`` empty means the prefix is already in the prompt and only
    the text part is constrained; otherwise the decode must open with one of these languages
    (in token-id order, so equal sets give equal keys), then ``task``, then the mode token."""

    task: str
    timestamps: bool
    languages: tuple[str, ...] = ()


class WhisperGrammars:
    def __init__(self, tokenizer: WhisperTokenizer):
        self.tok = tokenizer
        info = xgr.TokenizerInfo(
            tokenizer.encoded_vocab(),
            xgr.VocabType.BYTE_LEVEL,
            vocab_size=tokenizer.vocab_size,
            stop_token_ids=[tokenizer.eot],
            add_prefix_space=False,
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict[GrammarKey, xgr.CompiledGrammar] = {}
        self._regexes: dict[GrammarKey, str] = {}
        self._tag_texts: dict[GrammarKey, str] = {}
        self._lock = threading.Lock()
        self.compile_counts: Counter[GrammarKey] = Counter()

    def key(self, task: str, timestamps: bool, languages: tuple[str, ...] | None) -> GrammarKey:
        if languages:
            languages = tuple(sorted(set(languages), key=self.tok.language_ids.__getitem__))
        return GrammarKey(task, timestamps, languages or ())

    def get(self, key: GrammarKey) -> xgr.CompiledGrammar:
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is None:
                start = time.perf_counter()
                compiled = self._compiler.compile_structural_tag(self.structural_tag(key))
                self._cache[key] = compiled
                self.compile_counts[key] += 1
                log.debug("compiled grammar %s in %.1f ms", key, 1e3 * (time.perf_counter() - start))
            return compiled

    def structural_tag(self, key: GrammarKey) -> dict:
        tok = self.tok
        timestamp_ids = range(tok.timestamp_begin, tok.vocab_size)
        # Text may hold ordinary tokens and end-of-text; timestamps only in that variant.
        excluded = sorted(tok.special_ids - {tok.eot})
        if not key.timestamps:
            excluded += list(timestamp_ids)
        elements: list[dict] = []
        if key.languages:
            task_id = tok.transcribe if key.task == "transcribe" else tok.translate
            elements.append(_one_of([tok.language_ids[c] for c in key.languages]))
            elements.append({"type": "token", "token": task_id})
            if key.timestamps:
                elements.append(_one_of(list(timestamp_ids)))
            else:
                elements.append({"type": "token", "token": tok.no_timestamps})
        elements.append({"type": "any_tokens", "exclude_tokens": excluded})
        return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}

    def structural_tag_text(self, key: GrammarKey) -> str:
        """The structural tag as JSON text, for engines that compile it themselves (SGLang)."""
        if key not in self._tag_texts:
            self._tag_texts[key] = json.dumps(self.structural_tag(key), separators=(",", ":"))
        return self._tag_texts[key]

    def regex(self, key: GrammarKey) -> str:
        """The same constraint as a byte-level regex (looser: see the module docstring)."""
        if key not in self._regexes:  # keys are few and deterministic: build each once
            self._regexes[key] = self._render_regex(key)
        return self._regexes[key]

    @staticmethod
    def _render_regex(key: GrammarKey) -> str:
        if not key.languages:
            return r"[\s\S]*"
        langs = "|".join(re.escape(c) for c in key.languages)
        mode = r"<\|\d+\.\d\d\|>" if key.timestamps else re.escape("<|notimestamps|>")
        return rf"<\|(?:{langs})\|>{re.escape(f'<|{key.task}|>')}{mode}[\s\S]*"


def _one_of(ids: list[int]) -> dict:
    if len(ids) == 1:
        return {"type": "token", "token": ids[0]}
    return {"type": "or", "elements": [{"type": "token", "token": i} for i in ids]}
