"""A GGUF file read quickly (docs/llm.md, "Models"): `read_metadata` (its
key-value pairs alone) and `GgufFile` (those and its tensors).

`gguf.GGUFReader` builds a NumPy view of every element of every array when it
opens a file: SmolLM2's 49,152 tokens and merges take it about 10 s, Gemma 3's
262,144 tokens and scores over 30 s. Here the key-value section is read with
one `struct` call per string (well under a second), and the tensors are
`gguf`'s own `ReaderTensor`s over one memory map, as `GGUFReader` makes them.
The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

import mmap
import os
import struct

import numpy as np
from gguf import GGUFReader

__all__ = ["read_metadata", "GgufFile"]

_MAGIC = b"GGUF"
# GGUF value types -> (struct format, NumPy dtype) of the fixed-size ones.
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
_ALIGNMENT = 32          # of the tensor data, unless general.alignment says otherwise


class _Cursor:
    """Reads little-endian values from `data` (bytes or a map) at a moving offset."""

    def __init__(self, data, at=0):
        self.data, self.at = data, at

    def take(self, n):
        if self.at + n > len(self.data):
            raise EOFError(f"the file ends at byte {len(self.data)}, inside its header")
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


def _parse(path, data, tensors):
    """(metadata dict, tensor infos, end offset) of the mapped file `data`;
    the tensor infos (name, dims, type, offset) only if `tensors`."""
    if len(data) < 24 or data[:4] != _MAGIC:
        raise _unreadable(path, "it does not start with a GGUF header")
    version, n_tensors, count = struct.unpack("<IQQ", data[4:24])
    if version not in (2, 3):
        raise _unreadable(path, f"GGUF version {version}; mxu reads versions 2 and 3")
    cursor, meta, infos = _Cursor(data, 24), {}, []
    try:
        for _ in range(count):
            key = cursor.string()
            meta[key] = cursor.value(cursor.unpack("<I"))
        for _ in range(n_tensors if tensors else 0):
            name = cursor.string()
            dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
            infos.append((name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
    except (EOFError, UnicodeDecodeError, ValueError, struct.error, MemoryError) as error:
        raise _unreadable(path, error) from None
    return meta, infos, cursor.at


def _open(path):
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file {path!r}")
    if os.path.getsize(path) < 24:
        raise _unreadable(path, "it does not start with a GGUF header")
    return path


def read_metadata(path):
    """Every key-value pair of GGUF file `path` as a dict (arrays as lists);
    a file that is not GGUF, or is cut inside its metadata, is a ValueError
    naming it."""
    path = _open(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _parse(path, data, tensors=False)[0]


class _Field:
    """A key-value pair, as much of `gguf.ReaderField` as mxu's readers use."""

    def __init__(self, name, value):
        self.name, self.value = name, value

    def contents(self):
        return self.value


class GgufFile(GGUFReader):
    """A GGUF file: ``fields`` (key -> an object whose ``contents()`` is the
    value) and ``tensors`` (`gguf.gguf_reader.ReaderTensor`s over a
    read-only memory map, shaped as `gguf.GGUFReader` shapes them), what the
    family readers of `registry.ARCHITECTURES` take. A `gguf.GGUFReader`
    (without its per-element views of the arrays), so that readers that ask
    ``isinstance(reader, gguf.GGUFReader)`` take it as one. A file that is
    not GGUF, or is cut anywhere (header, metadata, tensor data), is a
    ValueError naming it."""

    def __init__(self, path):           # GGUFReader.__init__ is the slow part: not called
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian
        from gguf.gguf_reader import ReaderTensor
        from gguf.quants import quant_shape_to_byte_shape

        path = _open(path)
        self.path = path
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as raw:
            meta, infos, end = _parse(path, raw, tensors=True)
        self.data = np.memmap(path, mode="r")
        self.byte_order, self.endianess = "I", GGUFEndian.LITTLE
        self.fields = {key: _Field(key, value) for key, value in meta.items()}
        align = meta.get("general.alignment", _ALIGNMENT)
        self.alignment = align
        start = -(-end // align) * align
        self.data_offset = start
        self.tensors = []
        for name, dims, kind, offset in infos:
            try:
                qtype = GGMLQuantizationType(kind)
                block, size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise _unreadable(path, f"tensor {name!r} has unknown type {kind}") from None
            n = int(np.prod(dims, dtype=np.int64))
            nbytes = n * size // block
            at = start + offset
            if at + nbytes > len(self.data):
                raise _unreadable(path, f"tensor {name!r} ends at byte {at + nbytes}, past the "
                                        f"end of the file ({len(self.data)} bytes)")
            shape = tuple(reversed(dims))
            dtype = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                     GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                     GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                     GGMLQuantizationType.I64: np.int64}.get(qtype)
            if dtype is None:              # quantized: its bytes, a row of blocks per row
                data = self.data[at:at + nbytes].reshape(quant_shape_to_byte_shape(shape, qtype))
            else:
                data = self.data[at:at + nbytes].view(dtype).reshape(shape)
            self.tensors.append(ReaderTensor(name=name, tensor_type=qtype,
                                             shape=np.array(dims, np.uint64), n_elements=n,
                                             n_bytes=nbytes, data_offset=at, data=data,
                                             field=None))
