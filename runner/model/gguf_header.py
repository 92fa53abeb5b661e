"""The layout of a GGUF file, read from its header without loading it: where the metadata and the
tensor table end, and where each tensor's data starts. Enough to identify a model quickly
(runner/model/identity.py); llama.cpp reads the rest.

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv × (key: string, type: u32, value)            metadata (tokenizer, hyper-parameters, ...)
    n_tensors × (name: string, n_dims: u32, dims: n_dims × u64, type: u32, offset: u64)
    padding to general.alignment (default 32)
    tensor data, each tensor at data_start + offset

Strings are a u64 length and UTF-8 bytes; everything is little-endian (GGUF v2 and v3).
"""

from __future__ import annotations

import copy
import functools
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Union

MAGIC = b"GGUF"
NO_MAGIC = "no GGUF magic at the start"  # why a file is not a GGUF, in every refusal of one
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9  # gguf_type values with a length of their own
# gguf_type -> size in bytes of one scalar value
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
UINT_FORMAT = {0: "<B", 2: "<H", 4: "<I", 10: "<Q"}  # the types general.alignment may have
# gguf_type -> struct format of one scalar (uint8, int8, uint16, int16, uint32, int32, float32,
# bool, uint64, int64, float64)
SCALAR_FORMAT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
HParam = Union[int, float, bool, str, list[Any]]


class GGUFFormatError(ValueError):
    """Not a GGUF file, or one whose header is cut short."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int  # ggml_type: 0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 12 Q4_K, 30 BF16, ...
    dims: tuple[int, ...]  # ne[0] (the row length) first


@dataclass(frozen=True)
class GGUFLayout:
    version: int
    header_end: int  # first byte after the tensor table: metadata + tensor table = [0, header_end)
    data_start: int  # first byte of tensor data
    tensor_offsets: tuple[int, ...]  # absolute file offsets of each tensor's data, in table order
    file_size: int
    tensors: tuple[TensorInfo, ...] = ()  # the tensor table, in table order

    def tensor_bytes(self) -> list[int]:
        """Each tensor's bytes in the file, in table order: to where the next one starts (its
        alignment padding included) or the file ends."""
        starts = sorted(set(self.tensor_offsets))
        end_of = dict(zip(starts, starts[1:] + [self.file_size]))
        return [end_of[o] - o for o in self.tensor_offsets]


class _Cursor:
    """Reads the header from the file as far as it goes, in growing chunks: a header is a few MiB at
    most (a 150,000-token vocabulary), where mapping a multi-GB file would take its whole size of
    address space (under `ulimit -v` that alone fails)."""

    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.size = size
        self.buf = bytearray()
        self.pos = 0

    def _have(self, end: int) -> None:
        """Read until the buffer holds bytes [0, end), or fail if the file is shorter."""
        if end > self.size:
            raise GGUFFormatError(f"the header ends early (byte {self.pos} of {self.size} needs {end - self.pos} more)")
        while len(self.buf) < end:
            self.buf += self.f.read(max(self.CHUNK, end - len(self.buf), len(self.buf)))

    def take(self, n: int) -> bytes:
        self._have(self.pos + n)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            self.skip(self.u64())
        elif kind == ARRAY:
            item, count = self.u32(), self.u64()
            if item in SCALAR_SIZE:
                self.skip(count * SCALAR_SIZE[item])
            elif item == STRING:
                self._skip_strings(count)
            else:  # nested arrays: each has a length of its own
                for _ in range(count):
                    self.skip_value(item)
        elif kind in SCALAR_SIZE:
            self.skip(SCALAR_SIZE[kind])
        else:
            raise GGUFFormatError(f"unknown metadata value type {kind} at byte {self.pos}")

    def _skip_strings(self, count: int) -> None:
        # A vocabulary is one array of 150,000+ strings: the tight loop keeps that at ~30 ms.
        pos, unpack = self.pos, struct.unpack_from
        for _ in range(count):
            if pos + 8 > len(self.buf):
                self._have(pos + 8)
            pos += 8 + unpack("<Q", self.buf, pos)[0]
        self._have(pos)
        self.pos = pos

    def skip(self, n: int) -> None:
        self._have(self.pos + n)
        self.pos += n


# A large vocabulary makes a header slow to walk (a 151,936-token one: about 50 ms, its strings
# skipped one by one), and a run's start reads one file's header several times (identity, the
# layout's repacked bytes, the hybrid check, the memory plan): each file's is read once while it
# stays the same file (FileKey).
FileKey = tuple[int, int, int, int]  # device, inode, size, mtime in ns: a file rewritten or replaced is another


def _file_key(path: str) -> FileKey:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_layout(path: str) -> GGUFLayout:
    """The header layout of the GGUF file at `path` (only the header is read)."""
    return _layout(_file_key(path), path)


@functools.lru_cache(maxsize=16)
def _layout(file: FileKey, path: str) -> GGUFLayout:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        if size < 24:
            raise GGUFFormatError(f"{size} bytes: too short for a GGUF header")
        return _parse(_Cursor(f, size))


def _parse(cur: _Cursor) -> GGUFLayout:
    if cur.take(4) != MAGIC:
        raise GGUFFormatError(NO_MAGIC)
    version = cur.u32()
    if version < 2:
        raise GGUFFormatError(f"GGUF version {version} is too old (v2 and later are read)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key, kind = cur.string(), cur.u32()
        if key == b"general.alignment" and kind in UINT_FORMAT:
            alignment = struct.unpack(UINT_FORMAT[kind], cur.take(struct.calcsize(UINT_FORMAT[kind])))[0]
        else:
            cur.skip_value(kind)
    relative, tensors = [], []
    for _ in range(n_tensors):
        name = cur.string().decode("utf-8", "replace")
        n_dims = cur.u32()
        dims = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims))
        tensors.append(TensorInfo(name, cur.u32(), dims))
        relative.append(cur.u64())
    header_end = cur.pos
    data_start = -(-header_end // alignment) * alignment
    return GGUFLayout(version, header_end, data_start, tuple(data_start + o for o in relative), cur.size,
                      tuple(tensors))


def read_hparams(path: str) -> dict[str, HParam]:
    """The metadata of the GGUF file at `path` other than the tokenizer's: scalars as Python
    values, arrays of numbers or booleans as lists (per-layer values, such as head_count_kv of a
    hybrid, whose layers without attention have 0 KV heads, which llama.cpp's metadata text
    leaves out). Arrays of strings are skipped. A copy: the caller may change it."""
    return copy.deepcopy(_hparams(_file_key(path), path))


@functools.lru_cache(maxsize=16)
def _hparams(file: FileKey, path: str) -> dict[str, HParam]:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        cur = _Cursor(f, size)
        if size < 24 or cur.take(4) != MAGIC or cur.u32() < 2:
            raise GGUFFormatError(f"{path}: not a GGUF v2+ file")
        _, n_kv = cur.u64(), cur.u64()
        out: dict[str, HParam] = {}
        for _ in range(n_kv):
            key, kind = cur.string().decode("utf-8", "replace"), cur.u32()
            if key.startswith("tokenizer."):
                cur.skip_value(kind)
            elif (value := _value(cur, kind)) is not None:
                out[key] = value
        return out


def _value(cur: _Cursor, kind: int) -> HParam | None:
    """The value at the cursor (consumed either way); None for what read_hparams skips."""
    if kind in SCALAR_FORMAT:
        scalar: HParam = struct.unpack("<" + SCALAR_FORMAT[kind], cur.take(SCALAR_SIZE[kind]))[0]
        return scalar
    if kind == STRING:
        return cur.string().decode("utf-8", "replace")
    if kind == ARRAY:
        item, count = cur.u32(), cur.u64()
        if item in SCALAR_FORMAT:
            return list(struct.unpack(f"<{count}{SCALAR_FORMAT[item]}", cur.take(count * SCALAR_SIZE[item])))
        cur.pos -= 12  # back to the array's header, skipped whole
    cur.skip_value(kind)
    return None
