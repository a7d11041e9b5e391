"""The context length a GGUF file's own metadata gives, read from its header only.

GGUF layout (ggml's ``docs/gguf.md``, little-endian): magic ``b"GGUF"``, ``uint32`` version
(2 or 3 here; 1 used 32-bit counts and is not read), ``uint64`` tensor count, ``uint64``
key/value count, then that many pairs of a key (a GGUF string: ``uint64`` length + UTF-8
bytes), a ``uint32`` value type and the value. The tensors' infos and data follow and are
never read. The key wanted is ``<general.architecture>.context_length`` (e.g.
``gemma3.context_length``), an integer.

The file may come from anywhere (``file:``, ``hf:``): every length is bounded before it is
used, values not needed are skipped with a seek, reading stops as soon as the answer is
known, and anything odd gives None rather than an exception or a large allocation.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
VERSIONS = (2, 3)

#: Bounds on what a header may claim (a real one: tens of keys; a tokenizer array of a few
#: hundred thousand strings, a few MB in all).
MAX_KV_COUNT = 65_536
MAX_KEY_BYTES = 65_535
MAX_STRING_BYTES = 16 * 1024 * 1024
MAX_ARRAY_ITEMS = 16 * 1024 * 1024
#: Bytes of header read (or skipped) before giving up.
MAX_HEADER_BYTES = 256 * 1024 * 1024
#: Values up to this many bytes are skipped by reading them (one call, and truncation shows).
_READ_TO_SKIP = 1024 * 1024
#: Strings kept in memory are only keys and the architecture's name.
MAX_KEPT_STRING_BYTES = 256

# Value types (gguf_type): fixed sizes of the scalars, and struct formats of the integers.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SIZES = {UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, UINT32: 4, INT32: 4, FLOAT32: 4, BOOL: 1, UINT64: 8, INT64: 8,
          FLOAT64: 8}
_INT_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", UINT64: "<Q",
                INT64: "<q"}


class _Odd(Exception):
    """The header is not one this reader believes."""


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.used = 0

    def _budget(self, n: int) -> None:
        self.used += n
        if n < 0 or self.used > MAX_HEADER_BYTES:
            raise _Odd("header too long")

    def read(self, n: int) -> bytes:
        self._budget(n)
        data = self.f.read(n)
        if len(data) != n:
            raise _Odd("truncated")
        return data

    def skip(self, n: int) -> None:
        if n <= _READ_TO_SKIP:
            self.read(n)
            return
        self._budget(n)
        here = self.f.tell()
        self.f.seek(n, 1)
        # Seeking past the end succeeds: make sure the bytes were there.
        if self.f.tell() != here + n or (n and not self._exists(here + n - 1)):
            raise _Odd("truncated")

    def _exists(self, offset: int) -> bool:
        here = self.f.tell()
        self.f.seek(offset)
        ok = len(self.f.read(1)) == 1
        self.f.seek(here)
        return ok

    def u32(self) -> int:
        return struct.unpack("<I", self.read(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.read(8))[0]

    def string_length(self, top: int) -> int:
        n = self.u64()
        if n > top:
            raise _Odd("string too long")
        return n

    def kept_string(self, top: int) -> str | None:
        """A string up to ``top`` bytes as text; a longer (valid) one is skipped → None."""
        n = self.string_length(MAX_STRING_BYTES)
        if n > top:
            self.skip(n)
            return None
        try:
            return self.read(n).decode("utf-8")
        except UnicodeDecodeError:
            raise _Odd("not UTF-8") from None

    def skip_value(self, kind: int) -> None:
        if kind in _SIZES:
            self.skip(_SIZES[kind])
        elif kind == STRING:
            self.skip(self.string_length(MAX_STRING_BYTES))
        elif kind == ARRAY:
            item, count = self.u32(), self.u64()
            if count > MAX_ARRAY_ITEMS:
                raise _Odd("array too long")
            if item in _SIZES:
                self.skip(_SIZES[item] * count)
            elif item == STRING:
                for _ in range(count):
                    self.skip(self.string_length(MAX_STRING_BYTES))
            else:  # arrays of arrays are allowed by the spec, never used for metadata we skip
                raise _Odd("nested array")
        else:
            raise _Odd(f"unknown value type {kind}")

    def integer(self, kind: int) -> int | None:
        if kind in _INT_FORMATS:
            return struct.unpack(_INT_FORMATS[kind], self.read(_SIZES[kind]))[0]
        self.skip_value(kind)
        return None


def read_gguf_context_length(path: str | Path) -> int | None:
    """The integer of ``<general.architecture>.context_length`` in the GGUF file at
    ``path`` (tokens), or None: not a GGUF file (or a directory, or missing), a version
    other than 2/3, no such key, a value that is not a positive integer, or a header that
    breaks a bound (see the module's constants). Reads only the header, at most
    :data:`MAX_HEADER_BYTES`; never raises for a bad file."""
    try:
        with open(path, "rb") as f:
            return _context_length(_Reader(f))
    except (OSError, _Odd, struct.error, OverflowError, ValueError):
        return None


def _context_length(r: _Reader) -> int | None:
    if r.read(4) != MAGIC or r.u32() not in VERSIONS:
        return None
    r.u64()  # tensor count: not needed
    kv_count = r.u64()
    if kv_count > MAX_KV_COUNT:
        return None
    architecture: str | None = None
    lengths: dict[str, int] = {}  # "<arch>" → its context_length, in case it comes first
    suffix = ".context_length"
    for _ in range(kv_count):
        key = r.kept_string(MAX_KEY_BYTES)
        kind = r.u32()
        if key == "general.architecture" and kind == STRING:
            architecture = r.kept_string(MAX_KEPT_STRING_BYTES)
        elif key is not None and key.endswith(suffix) and key.count(".") == 1:
            value = r.integer(kind)
            if value is not None and len(lengths) < 64:
                lengths[key[: -len(suffix)]] = value
        else:
            r.skip_value(kind)
        if architecture is not None and architecture in lengths:
            break
    if architecture is None:
        return None
    value = lengths.get(architecture)
    return value if value is not None and value > 0 else None
