"""Reader for CTranslate2 ``model.bin`` files (numpy + struct, no ctranslate2 runtime).

The layout is the one written by ctranslate2's ``specs/model_spec.py``:
u32 version; (version >= 2) spec name + u32 revision; u32 variable count; per variable
name, rank, shape, dtype, byte count, raw data; then u32 alias count and alias pairs.

Besides the arrays (copies), the reader says where each variable's bytes lie in the files
(``FileRegion``), so a caller can map a large table from the file instead of holding a copy.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterable

import numpy as np

from .errors import ModelLoadError

_DTYPES = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
    # bfloat16 has no numpy dtype: keep the raw bits as uint16, converted by the caller.
    5: np.uint16,
}
BFLOAT16_CODE = 5


class _ChainedReader(io.RawIOBase):
    """Reads several files one after the other as if they were one (model.bin.part1 + part2)."""

    def __init__(self, paths: Iterable[str]):
        self._files = [open(p, "rb") for p in paths]
        self._index = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._index < len(self._files):
            n = self._files[self._index].readinto(buffer)
            if n:
                return n
            self._index += 1
        return 0

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


@dataclass(frozen=True)
class FileRegion:
    """Where a variable's bytes lie: ``path`` from byte ``offset`` on (all in that one file)."""
    path: str
    offset: int


class _CountingReader:
    """Exact reads from a stream, counting the bytes read so far."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self.position = 0

    def read_exact(self, n: int) -> bytes:
        data = self._stream.read(n)
        if data is None or len(data) != n:
            raise ModelLoadError("CTranslate2 model.bin is truncated")
        self.position += n
        return data


def _read_u(reader: _CountingReader, fmt: str) -> int:
    return struct.unpack("<" + fmt, reader.read_exact(struct.calcsize(fmt)))[0]


def _read_name(reader: _CountingReader) -> str:
    length = _read_u(reader, "H")
    return reader.read_exact(length).rstrip(b"\0").decode("utf-8")


def _region(paths: list[str], sizes: list[int], start: int, nbytes: int) -> FileRegion | None:
    """The file region of bytes ``start`` .. ``start + nbytes`` of the parts read as one, or None
    where they straddle two parts."""
    for path, size in zip(paths, sizes):
        if start + nbytes <= size:
            return FileRegion(path, start) if start >= 0 else None
        start -= size
    return None


def read_ctranslate2_variables(paths: list[str]) -> tuple[dict[str, np.ndarray], set[str], dict[str, FileRegion]]:
    """Return ``(variables, bfloat16_names, regions)`` from a model.bin split over ``paths``;
    ``regions`` has each variable that lies whole in one file.

    Aliases are resolved to the array (and region) they point to.
    """
    sizes = [os.path.getsize(p) for p in paths]
    stream = io.BufferedReader(_ChainedReader(paths), buffer_size=1 << 20)
    reader = _CountingReader(stream)
    try:
        version = _read_u(reader, "I")
        if version > 10:
            raise ModelLoadError(f"unsupported CTranslate2 model.bin version {version}")
        if version >= 2:
            _read_name(reader)  # spec name, e.g. "WhisperSpec"
            _read_u(reader, "I")  # spec revision
        count = _read_u(reader, "I")
        variables: dict[str, np.ndarray] = {}
        bf16: set[str] = set()
        regions: dict[str, FileRegion] = {}
        for _ in range(count):
            name = _read_name(reader)
            rank = _read_u(reader, "B")
            shape = tuple(_read_u(reader, "I") for _ in range(rank))
            dtype_code = _read_u(reader, "B")
            nbytes = _read_u(reader, "I")
            if dtype_code not in _DTYPES:
                raise ModelLoadError(f"unknown dtype code {dtype_code} for {name}")
            region = _region(paths, sizes, reader.position, nbytes)
            if region is not None:
                regions[name] = region
            array = np.frombuffer(bytearray(reader.read_exact(nbytes)), dtype=_DTYPES[dtype_code])
            variables[name] = array.reshape(shape)
            if dtype_code == BFLOAT16_CODE:
                bf16.add(name)
        if version >= 3:
            for _ in range(_read_u(reader, "I")):
                alias, target = _read_name(reader), _read_name(reader)
                if target in variables:
                    variables[alias] = variables[target]
                    if target in regions:
                        regions[alias] = regions[target]
                    if target in bf16:
                        bf16.add(alias)
        return variables, bf16, regions
    finally:
        stream.close()
