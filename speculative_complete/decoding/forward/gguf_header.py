"""A GGUF file's header: its metadata values and where each tensor lies, without its large arrays.

Written by hand because ``gguf.GGUFReader`` (the format's own package, still used for what it
does well: the type tables, quantization) builds a numpy view for every part of every field,
several per element of the tokenizer's arrays: for a 150k-token vocabulary with its merges that
was most of a model's load, longer than llama.cpp takes to load the whole file
(``benchmarks/README.md``, design measurements). Here arrays of numbers are read with one
``numpy.frombuffer`` and arrays of strings are stepped over (their lengths read, their text not
decoded) unless asked for; the tokenizer is read by transformers once and cached
(``speculative_complete/decoding/models/loading.py``).

The layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), versions 2 and 3, in
either byte order: magic, version, tensor count, metadata count; each metadata key, value type
and value; each tensor's name, dimensions (innermost first), type and offset from the aligned
start of the data.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Scalar value types by GGUF's numbering: struct format and numpy dtype.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("B", "u1"),
    1: ("b", "i1"),
    2: ("H", "u2"),
    3: ("h", "i2"),
    4: ("I", "u4"),
    5: ("i", "i4"),
    6: ("f", "f4"),
    7: ("?", "?"),
    10: ("Q", "u8"),
    11: ("q", "i8"),
    12: ("d", "f8"),
}
_STRING, _ARRAY = 8, 9


class GgufHeaderError(ValueError):
    """The file is not a GGUF this reader understands (magic, version, or a truncated header)."""


@dataclass(frozen=True)
class GgufTensor:
    """Where one tensor's bytes lie in a GGUF file, and how to read them."""

    kind: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (out, in) for a weight
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class StringArray:
    """A metadata array of strings, stepped over: only its length is known."""

    count: int


@dataclass(frozen=True)
class GgufHeader:
    """Metadata values (numbers, strings, arrays of numbers as numpy arrays; arrays of strings as
    lists where asked for, else ``StringArray``) and the tensors by name, in file order.
    ``data_offset``: where the tensors' data starts, so the header is the file's bytes before it."""

    fields: dict[str, Any]
    tensors: dict[str, GgufTensor] = field(default_factory=dict)
    data_offset: int = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class _Cursor:
    """Reads the header's values in order from a buffer, in the file's byte order."""

    def __init__(self, buffer: memoryview | bytes | mmap.mmap, order: str) -> None:
        self.buffer, self.order, self.at = buffer, order, 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buffer):
            raise GgufHeaderError("the header ends early")
        (value,) = struct.unpack_from(self.order + fmt, self.buffer, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        start, self.at = self.at, self.at + length
        if self.at > len(self.buffer):
            raise GgufHeaderError("a string runs past the end of the file")
        return bytes(self.buffer[start : self.at]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Steps over ``count`` strings, reading only their lengths (the hot loop of a header)."""
        length, buffer, at = struct.Struct(self.order + "Q").unpack_from, self.buffer, self.at
        try:
            for _ in range(count):
                at += 8 + length(buffer, at)[0]
        except struct.error as exc:
            raise GgufHeaderError("the header ends early") from exc
        if at > len(buffer):
            raise GgufHeaderError("a string runs past the end of the file")
        self.at = at

    def value(self, kind: int, strings: bool) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind][0])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(strings)
        raise GgufHeaderError(f"unknown metadata value type {kind}")

    def array(self, strings: bool) -> Any:
        kind, count = self.unpack("I"), self.unpack("Q")
        if kind in _SCALARS:
            dtype = np.dtype(_SCALARS[kind][1]).newbyteorder(self.order)
            end = self.at + count * dtype.itemsize
            if end > len(self.buffer):
                raise GgufHeaderError("an array runs past the end of the file")
            values = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.at).copy()
            self.at = end
            return values
        if kind == _STRING:
            if strings:
                return [self.string() for _ in range(count)]
            self.skip_strings(count)
            return StringArray(count)
        return [self.value(kind, strings) for _ in range(count)]  # arrays of arrays: rare and small


def read_header(path: str | Path, strings: bool = False) -> GgufHeader:
    """The header of the GGUF at ``path`` (``strings``: decode arrays of strings too);
    ``GgufHeaderError`` where it is not one, ``OSError`` where it cannot be read. The last few
    are kept, by the file's inode, size and modification time: a load reads the header three times (its
    cache's key, its config, its tensors), and a 150k-token vocabulary makes each read count. Read
    it, never change it."""
    status = os.stat(path)
    stamp = (status.st_ino, status.st_size, status.st_mtime_ns)
    return _read_header(str(Path(path).resolve()), stamp, strings)


@functools.lru_cache(maxsize=4)
def _read_header(path: str, stamp: tuple[int, int, int], strings: bool) -> GgufHeader:
    with open(path, "rb") as file:
        if not file.seek(0, 2):
            raise GgufHeaderError("an empty file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(data, strings)


def _parse(data: mmap.mmap, strings: bool) -> GgufHeader:
    if len(data) < 24 or data[:4] != MAGIC:
        raise GgufHeaderError("not a GGUF file (bad magic)")
    order = "<"
    (version,) = struct.unpack_from("<I", data, 4)
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if version not in (2, 3):
        raise GgufHeaderError(f"GGUF version {version} (read: 2 and 3)")
    cursor = _Cursor(data, order)
    cursor.at = 8
    n_tensors, n_fields = cursor.unpack("Q"), cursor.unpack("Q")
    fields = {}
    for _ in range(n_fields):
        key = cursor.string()
        fields[key] = cursor.value(cursor.unpack("I"), strings)
    infos = [_tensor_info(cursor) for _ in range(n_tensors)]
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    start = -(-cursor.at // alignment) * alignment
    tensors = {}
    for name, kind, shape, offset in infos:
        tensor = GgufTensor(kind, shape, start + offset, _nbytes(kind, shape))
        if tensor.offset + tensor.nbytes > len(data):
            raise GgufHeaderError(f"tensor {name} runs past the end of the file")
        tensors[name] = tensor
    return GgufHeader(fields, tensors, start)


def _tensor_info(cursor: _Cursor) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
    name = cursor.string()
    dims = [cursor.unpack("Q") for _ in range(cursor.unpack("I"))]
    try:
        kind = GGMLQuantizationType(cursor.unpack("I"))
    except ValueError as exc:
        raise GgufHeaderError(f"tensor {name}: {exc}") from exc
    return name, kind, tuple(reversed(dims)), cursor.unpack("Q")


def _nbytes(kind: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return int(np.prod(shape, dtype=np.int64)) // block * size
