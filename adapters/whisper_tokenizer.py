"""Whisper's vocabulary facts on top of a HF ``tokenizers`` file.

The packaged tokenizer.json has no timestamp tokens: ids from ``<|notimestamps|>`` + 1 to
the vocabulary end are ``<|0.00|>`` ... in 0.02 s steps, handled by id here.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")
TIME_PRECISION = 0.02


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte (the GPT-2 scheme Whisper's vocabulary is
    written in): printable bytes stand for themselves, the other 68 take the characters from
    U+0100 on, in byte order. Inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return alphabet


_BYTE_OF_CHARACTER = _byte_level_alphabet()


class WhisperTokenizer:
    def __init__(self, tokenizer_file: Path, vocab_size: int):
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self.vocab_size = vocab_size
        vocab = self._tok.get_vocab(with_added_tokens=True)

        def special(name: str) -> int:
            if name not in vocab:
                raise ValueError(f"{tokenizer_file} has no {name} token: not a Whisper tokenizer")
            return vocab[name]

        self.eot = special("<|endoftext|>")
        self.sot = special("<|startoftranscript|>")
        self.translate = special("<|translate|>")
        self.transcribe = special("<|transcribe|>")
        self.sot_lm = special("<|startoflm|>")
        self.sot_prev = special("<|startofprev|>")
        self.no_speech = vocab.get("<|nospeech|>", vocab.get("<|nocaptions|>"))
        self.no_timestamps = special("<|notimestamps|>")
        self.timestamp_begin = self.no_timestamps + 1
        # Language tokens sit between <|startoftranscript|> and <|translate|>, in id order.
        by_id = {i: s for s, i in vocab.items()}
        self.language_ids: dict[str, int] = {}
        for i in range(self.sot + 1, self.translate):
            m = _LANGUAGE_TOKEN.match(by_id.get(i, ""))
            if m:
                self.language_ids[m.group(1)] = i
        self.id_to_language = {i: c for c, i in self.language_ids.items()}
        self._by_id = by_id

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Every Whisper special id except timestamps: eot, sot, languages, tasks, markers."""
        return frozenset(range(self.eot, self.timestamp_begin))

    @cached_property
    def special_token_strings(self) -> tuple[str, ...]:
        """The literal spellings of the special tokens, longest first (for stripping text)."""
        names = {self._by_id[i] for i in self.special_ids if i in self._by_id}
        return tuple(sorted(names, key=len, reverse=True))

    @cached_property
    def longest_text_token(self) -> int:
        """The most bytes, so also the most characters, that one text token spells (the
        vocabulary's strings are byte-level: one character per byte)."""
        return max(len(self._by_id.get(i, "")) for i in range(self.eot))

    def token_string(self, token_id: int) -> str:
        if token_id >= self.timestamp_begin:
            return "<|%.2f|>" % self.timestamp_seconds(token_id)
        return self._by_id.get(token_id, "")

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes a text token spells (a character may span tokens, so a token's bytes
        need not decode on their own)."""
        if token_id >= self.eot:
            raise ValueError(f"token {token_id} is not a text token")
        return bytes(_BYTE_OF_CHARACTER[c] for c in self._by_id[token_id])

    def encoded_vocab(self) -> list[str]:
        """Vocabulary strings by id, timestamps included (for xgrammar's TokenizerInfo)."""
        return [self.token_string(i) for i in range(self.vocab_size)]

    def timestamp_seconds(self, token_id: int) -> float:
        return (token_id - self.timestamp_begin) * TIME_PRECISION

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ordinary tokens; special and timestamp ids are left out."""
        return self._tok.decode([i for i in ids if i < self.eot], skip_special_tokens=False)
