"""The metadata of a GGUF file without its tensors (docs/llm.md, "Models").

`gguf.GGUFReader` builds a NumPy view of every element of every array when it
opens a file: Gemma 3's 262,144-token vocabulary takes it tens of seconds.
`read_metadata` reads the key-value section alone, with one `struct` call per
string, in well under a second, so that a model's architecture, context and
tokenizer are known (and a prompt checked) before its weights are read. The
format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

import mmap
import os
import struct

import numpy as np

__all__ = ["read_metadata"]

_MAGIC = b"GGUF"
# GGUF value types -> (struct format, NumPy dtype) of the fixed-size ones.
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads little-endian values from `data` (bytes) at a moving offset."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, n):
        if self.at + n > len(self.data):
            raise EOFError(f"the file ends at byte {len(self.data)}, inside its metadata")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.unpack("<Q")).decode("utf-8")

    def value(self, kind):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind][0])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, n = self.unpack("<I"), self.unpack("<Q")
            if inner in _SCALARS:
                dtype = np.dtype(_SCALARS[inner][1]).newbyteorder("<")
                return np.frombuffer(self.take(n * dtype.itemsize), dtype).tolist()
            return [self.value(inner) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {kind}")


def _unreadable(path, why):
    return ValueError(f"{path!r} is not a readable GGUF file (truncated or corrupt?): {why}")


def read_metadata(path):
    """Every key-value pair of GGUF file `path` as a dict (arrays as lists);
    a file that is not GGUF, or is cut inside its metadata, is a ValueError
    naming it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file {path!r}")
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != _MAGIC:
            raise _unreadable(path, "it does not start with a GGUF header")
        version, _, count = struct.unpack("<IQQ", head[4:])
        if version not in (2, 3):
            raise _unreadable(path, f"GGUF version {version}; mxu reads versions 2 and 3")
        # Mapped, not read: the metadata is first, its length known once parsed.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data)
            cursor.at = 24
            meta = {}
            try:
                for _ in range(count):
                    key = cursor.string()
                    meta[key] = cursor.value(cursor.unpack("<I"))
            except (EOFError, UnicodeDecodeError, ValueError, struct.error,
                    MemoryError) as error:
                raise _unreadable(path, error) from None
    return meta

