"""Public API for studying the numeric units: whole arrays of operands through the
RTL in one simulator run.

>>> out = simulate_mac(a_bits, w_bits, acc_bits)          # uint32 fp32 patterns
"""

import numpy as np

from mxu.hdl.config import ChipConfig
from mxu.hdl.mac import MacUnit
from amaranth.hdl import C, Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mxu.hdl.numerics import Bf16Multiplier, Fp32Adder, Fp32Multiplier, Fp32ToBf16
from mxu.hdl.vpu import VectorAlu, VectorLane, VpuOp

from .harness import StreamedUnit
from .stream import run_stream

__all__ = ["simulate_mac", "simulate_bf16_mul", "simulate_fp32_add", "simulate_fp32_mul",
           "simulate_fp32_to_bf16", "simulate_vpu_lane", "simulate_vector_alu"]


def _operands(**arrays):
    """Validate 1-D bit-pattern arrays of one length; return them contiguous."""
    out, length = [], None
    for name, (value, dtype) in arrays.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{name} must be a numpy array of {np.dtype(dtype).name}, "
                            f"not {type(value).__name__}")
        if value.dtype != dtype:
            raise TypeError(f"{name} must have dtype {np.dtype(dtype).name} "
                            f"(bit patterns), not {value.dtype}")
        if value.ndim != 1:
            raise ValueError(f"{name} must be 1-D, not of shape {value.shape}")
        if length is not None and value.size != length:
            sizes = ", ".join(f"{k}={v[0].size}" for k, v in arrays.items())
            raise ValueError(f"operands must have the same length, got {sizes}")
        length = value.size
        out.append(np.ascontiguousarray(value))
    return out


def _stages(stages):
    if stages is None:
        return ChipConfig().mac_stages
    ChipConfig(mac_stages=stages)   # validates with the config's own message
    return stages


def simulate_mac(a, w, acc, *, stages=None, simulator="verilator"):
    """``acc + a*w`` through the RTL `MacUnit`, every vector in one simulator run.

    a, w : uint16 arrays of bf16 bit patterns; acc : uint32 array of fp32 bit
    patterns; all 1-D and of the same length. Returns the uint32 fp32 results.
    `stages` defaults to ``ChipConfig().mac_stages``; `simulator` is "verilator",
    "icarus" or "amaranth".
    """
    a, w, acc = _operands(a=(a, np.uint16), w=(w, np.uint16), acc=(acc, np.uint32))
    stages = _stages(stages)
    payload = a.astype(np.uint64) | (w.astype(np.uint64) << 16) | (acc.astype(np.uint64) << 32)
    if payload.size == 0:
        return np.zeros(0, np.uint32)
    out, _ = run_stream(lambda: MacUnit(stages), payload, simulator=simulator, name=f"mac{stages}")
    return out.astype(np.uint32)


def _depth(stages):
    """The build name's suffix for a unit of `stages` pipeline stages."""
    return f"_s{stages}" if stages > 1 else ""


def _run_unit(make_unit, payload, name, simulator, dtype):
    """Stream packed operands through a combinational unit; results as `dtype`."""
    if payload.size == 0:
        return np.zeros(0, dtype)
    out, _ = run_stream(make_unit, payload, simulator=simulator, name=name)
    return out.astype(dtype)


def simulate_bf16_mul(a, b, *, simulator="verilator"):
    """bf16 x bf16 -> fp32 through the RTL `Bf16Multiplier` (uint16 in, uint32 out)."""
    a, b = _operands(a=(a, np.uint16), b=(b, np.uint16))
    return _run_unit(lambda: StreamedUnit(Bf16Multiplier(), ("a", "b"), "p"),
                     a.astype(np.uint64) | (b.astype(np.uint64) << 16), "bf16mul", simulator,
                     np.uint32)


def simulate_fp32_add(x, y, *, stages=1, simulator="verilator"):
    """fp32 + fp32 through the RTL `Fp32Adder` of `stages` stages (uint32 in,
    uint32 out)."""
    x, y = _operands(x=(x, np.uint32), y=(y, np.uint32))
    return _run_unit(lambda: StreamedUnit(Fp32Adder(stages), ("a", "b"), "s"),
                     x.astype(np.uint64) | (y.astype(np.uint64) << 32), "fp32add" + _depth(stages),
                     simulator, np.uint32)


def simulate_fp32_mul(x, y, *, power_of_two=False, stages=1, simulator="verilator"):
    """fp32 * fp32 through the RTL `Fp32Multiplier` of `stages` stages (uint32
    in, uint32 out); with ``power_of_two=True`` its variant without a
    multiplier, for which every y must be a power of two (a normal number with
    a zero fraction)."""
    x, y = _operands(x=(x, np.uint32), y=(y, np.uint32))
    if power_of_two and np.any((y & 0x807FFFFF) | ((y >> 23) == 0) | ((y >> 23) == 255)):
        raise ValueError("power_of_two: every y must be a positive normal power of two")
    name = ("fp32scale" if power_of_two else "fp32mul") + _depth(stages)
    return _run_unit(lambda: StreamedUnit(Fp32Multiplier(power_of_two=power_of_two,
                                                         stages=stages), ("a", "b"), "p"),
                     x.astype(np.uint64) | (y.astype(np.uint64) << 32), name, simulator,
                     np.uint32)


class _PackedLane(wiring.Component):
    """A `VectorLane` of fp32 units of `stages` stages behind a 64-bit
    payload: ``a`` (bits 0-31), the top 28 bits of ``b`` (32-59; its 4 low
    bits are zero) and ``op`` (60-63)."""

    i: In(stream.Signature(64))
    o: Out(stream.Signature(32))

    def __init__(self, stages=1):
        self.stages = stages
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.lane = lane = VectorLane(stages=self.stages)
        payload = self.i.payload
        m.d.comb += [
            lane.i.valid.eq(self.i.valid), self.i.ready.eq(lane.i.ready),
            lane.i.payload.a.eq(payload[:32]),
            lane.i.payload.b.eq(Cat(C(0, _B_LOW_BITS), payload[32:60])),
            lane.i.payload.op.eq(payload[60:]),
        ]
        wiring.connect(m, wiring.flipped(self.o), lane.o)
        return m


# The harness payload is 64 bits: a, op and what is left of b.
_B_LOW_BITS = 4


def _vpu_ops(op, n):
    """`op` (a `VpuOp`, its name, or an array of VpuOp values) as a uint64 array."""
    if isinstance(op, np.ndarray):
        if op.shape != (n,) or not np.all(np.isin(op, [o.value for o in VpuOp])):
            raise ValueError(f"op must be one VpuOp or an array of {n} VpuOp values")
        return op.astype(np.uint64)
    if isinstance(op, str):
        try:
            op = VpuOp[op.upper()]
        except KeyError:
            raise ValueError(f"unknown vector op {op!r}; choose one of "
                             f"{[o.name.lower() for o in VpuOp]}") from None
    return np.full(n, VpuOp(op).value, np.uint64)


def simulate_vpu_lane(op, a, b=None, *, stages=1, simulator="verilator"):
    """``op(a, b)`` through the RTL `VectorLane` whose fp32 units take
    `stages` stages (docs/vpu.md), every element in one simulator run.

    op : a `VpuOp`, its name ("exp", "add", ...), or an array of VpuOp values (one
        per element). a, b : uint32 arrays of fp32 bit patterns; b may be omitted
        when every op takes one operand. The harness carries 64 bits per element,
        so the 4 low bits of b must be zero. Returns the uint32 results.
    """
    if b is None:
        b = np.zeros_like(a) if isinstance(a, np.ndarray) else a
    a, b = _operands(a=(a, np.uint32), b=(b, np.uint32))
    if np.any(b & ((1 << _B_LOW_BITS) - 1)):
        raise ValueError(f"the {_B_LOW_BITS} low bits of b must be zero "
                         f"(the lane harness carries a, the op and the top 28 bits of b)")
    ops = _vpu_ops(op, a.size)
    if np.any(ops >= VpuOp.RSUM.value):
        raise ValueError("RSUM and RMAX reduce a row: simulate them with simulate_vector_alu")
    payload = a.astype(np.uint64) | ((b.astype(np.uint64) >> _B_LOW_BITS) << 32) | (ops << 60)
    return _run_unit(lambda: _PackedLane(stages), payload, "vpu_lane" + _depth(stages), simulator,
                     np.uint32)


def simulate_vector_alu(config, op, a, b, *, ready_percent=100, seed=1):
    """Rows ``op[i](a[i], b[i])`` through the RTL `VectorAlu` of `config` on
    Amaranth's simulator (its payload is wider than the Verilator harness's 64
    bits; meant for a few hundred rows). op : (n,) VpuOp values; a, b : (n, cols)
    uint32 arrays of fp32 bit patterns. Returns the (n, cols) uint32 results."""
    from .runner import InStream, OutStream, run_amaranth
    cols = config.cols
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, np.ndarray) or value.dtype != np.uint32:
            raise TypeError(f"{name} must be a uint32 numpy array of fp32 bit patterns")
        if value.ndim != 2 or value.shape[1] != cols or value.shape[0] != len(op):
            raise ValueError(f"{name} must have shape ({len(op)}, {cols}), not {value.shape}")
    ops = _vpu_ops(np.asarray(op), len(op))
    words = [int(ops[i]) | sum(int(a[i, k]) << (4 + 32 * k) for k in range(cols))
             | sum(int(b[i, k]) << (4 + 32 * (cols + k)) for k in range(cols))
             for i in range(len(op))]
    run = run_amaranth(VectorAlu(config), (InStream("i", 4 + 64 * cols, tuple(words)),),
                       (OutStream("o", 32 * cols, len(words), ready_percent),), seed=seed,
                       max_cycles=200 * len(words) + 1000, name="vector_alu")
    return np.array([[(v >> (32 * k)) & 0xFFFFFFFF for k in range(cols)]
                     for v in run.outputs["o"]], np.uint32).reshape(len(words), cols)


def simulate_fp32_to_bf16(x, *, simulator="verilator"):
    """fp32 -> bf16 (round to nearest-even) through the RTL `Fp32ToBf16`.

    x : uint32 array of fp32 bit patterns. Returns uint16 bf16 bit patterns.
    """
    (x,) = _operands(x=(x, np.uint32))
    return _run_unit(lambda: StreamedUnit(Fp32ToBf16(), ("x",), "y"), x.astype(np.uint64),
                     "fp32tobf16", simulator, np.uint16)
