"""Reading the chip's trace port (`mxu.hdl.trace`) out of the C++ harness's
buffer: which bits make an event, and the events as NumPy arrays
(docs/profiler.md)."""

import functools
from dataclasses import dataclass

import numpy as np

from mxu.hdl.isa import Engine
from mxu.hdl.trace import ChipTrace

__all__ = ["ChipTraceData", "trace_mask", "decode_trace", "ENGINES"]

ENGINES = tuple(e.name.lower() for e in Engine)


def _fields(layout, prefix="", base=0):
    """{dotted name: (bit offset, width)} of every leaf of a struct layout."""
    out = {}
    for name, field in layout:
        shape = field.shape
        if hasattr(shape, "__iter__") and not isinstance(shape, type):
            out.update(_fields(shape, f"{prefix}{name}.", base + field.offset))
        else:
            out[f"{prefix}{name}"] = (base + field.offset, field.width)
    return out


@functools.cache
def _layout():
    return _fields(ChipTrace)


@functools.cache
def trace_mask():
    """(event mask as 32-bit words, array_accept bit, running bit): an event is a
    cycle in which an engine takes or completes an instruction, or a LOADW's
    weights are in."""
    fields = _layout()
    width = -(-ChipTrace.size // 32)
    mask = [0] * width
    names = [f"{e}.{k}" for e in ENGINES for k in ("take", "complete")] + ["loadw_done"]
    for name in names:
        bit = fields[name][0]
        mask[bit // 32] |= 1 << (bit % 32)
    return tuple(mask), fields["array_accept"][0], fields["running"][0]


@dataclass
class ChipTraceData:
    """The raw events of one run: ``cycle`` (from the run's first cycle) and one
    array per trace field (``load.take``, ``compute.pc``, ``loadw_done`` ...), and
    the activation rows accepted by the array per ``bucket_cycles`` cycles."""
    cycle: np.ndarray
    fields: dict
    buckets: np.ndarray
    bucket_cycles: int

    def __len__(self):
        return self.cycle.size


def decode_trace(rows, buckets, bucket_cycles):
    """`ChipTraceData` of the harness's event rows (cycle lo, cycle hi, port words)."""
    rows = np.asarray(rows, np.uint64)
    cycle = rows[:, 0] | (rows[:, 1] << np.uint64(32)) if len(rows) else np.zeros(0, np.uint64)
    words = rows[:, 2:]
    fields = {}
    for name, (offset, width) in _layout().items():
        i, shift = offset // 32, offset % 32
        value = words[:, i] if len(rows) else np.zeros(0, np.uint64)
        if shift + width > 32 and len(rows):
            value = value | (words[:, i + 1] << np.uint64(32))
        fields[name] = ((value >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(np.int64)
    return ChipTraceData(cycle.astype(np.int64), fields, np.asarray(buckets, np.int64), bucket_cycles)
