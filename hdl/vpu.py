"""The vector unit's datapath: element-wise fp32 operations and the functions of
`mxu.hdl.vecmath`, one accumulator row (``cols`` lanes) per cycle, pipelined
(docs/vpu.md).

The pipelines come from `mxu.hdl.pipeline` (`PipelineOps`,
`SharedPipelineOps`), which runs the sequences of `mxu.hdl.vecmath`.

* `VectorLane`: one element, any `VpuOp`, a fixed latency; its ops share
  their units, the functions starting at `function_offsets()`.
* `VectorAlu`: ``cols`` lanes in lockstep on whole rows.
* `RowTranspose`: accumulator rows to VMEM columns, in bf16.

For synthesis (`mxu synth --unit vpu`), the fp32 adder, the multiplier and the
lane can each be generated once and instantiated by name (``unit_modules``), as
the array does with its PE.
"""

import itertools
from collections import Counter

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from . import vecmath
from .blackbox import black_box, signature_of
from .numerics import Fp32ToBf16
from .pipeline import LatencyOps, PipelineOps, SharedPipelineOps, UsageOps, Value
from .vmem import vmem_row_layout

__all__ = ["VpuOp", "VectorLane", "VectorAlu", "LaneInput", "RowTranspose", "lane_latency",
           "alu_latency", "function_offsets", "tree_levels"]


class VpuOp(enum.Enum, shape=4):
    """Element operations of the vector unit: ``y = op(a, b)`` (docs/vpu.md)."""
    ADD = 0      # a + b
    SUB = 1      # a - b
    MUL = 2      # a * b
    MAX = 3      # max(a, b), NaN if either is, -0 < +0
    MIN = 4      # min(a, b), likewise
    EXP = 5      # vecmath.exp(a)
    RECIP = 6    # vecmath.reciprocal(a)
    RSQRT = 7    # vecmath.rsqrt(a)
    PASS = 8     # a (a copy, e.g. for fp32 -> bf16 stores)
    RSUM = 9     # the sum of row a's elements in tree order, in every lane (VectorAlu only)
    RMAX = 10    # the maximum of row a's elements, likewise


_REDUCTIONS = {VpuOp.RSUM: ("fadd", 0x00000000), VpuOp.RMAX: ("fmax", 0xFF800000)}
_FUNCTION_OF = {VpuOp.EXP: "exp", VpuOp.RECIP: "reciprocal", VpuOp.RSQRT: "rsqrt"}


class LaneInput(data.Struct):
    op: VpuOp
    a: 32
    b: 32


# The lane's element ops other than the functions: one fp32 operation each.
_ALU_OPS = {
    VpuOp.ADD: lambda ops, a, b: ops.fadd(a, b),
    VpuOp.SUB: lambda ops, a, b: ops.fadd(a, ops.bxor(b, ops.const(0x80000000))),
    VpuOp.MUL: lambda ops, a, b: ops.fmul(a, b),
    VpuOp.MAX: lambda ops, a, b: ops.fmax(a, b),
    VpuOp.MIN: lambda ops, a, b: ops.fmin(a, b),
}


def _build_lane(ops, op, a, b):
    """Every `VpuOp` result of one lane as `Value`s, by op, on the units of a
    `SharedPipelineOps` (not yet finished): each function starts at its offset
    (`function_offsets`), so that the three share most of their multipliers and
    adders."""
    av, bv = ops.lift(a), ops.lift(b)
    op_v = ops.lift(op)

    def owner(code):
        return lambda stage: ops.at(op_v, stage)[:len(op)] == code.value

    results = {VpuOp.PASS: av}
    for code, alu in _ALU_OPS.items():
        ops.begin(owner(code))
        results[code] = alu(ops, av, bv)
    for code, name in _FUNCTION_OF.items():
        offset = function_offsets()[name]
        ops.begin(owner(code))
        start = Value(ops.at(av, offset), offset) if offset else av
        results[code] = vecmath.FUNCTIONS[name](ops, start)
    return results


# Relative cost of the units, for choosing the offsets (generic cells, docs/vpu.md).
_UNIT_COST = {"fmul": 4671, "fscale": 700, "fadd": 1333, "fmax": 300, "fmin": 300}
_OFFSETS = {}


def function_offsets():
    """The stage at which each function of `mxu.hdl.vecmath` starts in a lane:
    the offsets (within the longest function's latency) that minimise the
    units the functions and the ALU ops need when they share them by stage."""
    if _OFFSETS:
        return _OFFSETS
    usage = {}
    for name in _FUNCTION_OF.values():
        ops = UsageOps()
        latency = vecmath.FUNCTIONS[name](ops, 0)
        usage[name] = (latency, ops.units)
    alu = UsageOps()
    for fn in _ALU_OPS.values():
        fn(alu, 0, 0)
    alu_units = Counter({key: 1 for key in alu.units})     # the ALU ops share theirs too
    longest = max(latency for latency, _ in usage.values())
    names = list(usage)
    best = None
    for offsets in itertools.product(*(range(longest - usage[n][0] + 1) for n in names)):
        need = Counter(alu_units)
        for name, offset in zip(names, offsets):
            for (stage, kind), count in usage[name][1].items():
                need[(stage + offset, kind)] = max(need[(stage + offset, kind)], count)
        cost = sum(_UNIT_COST[kind] * count for (_, kind), count in need.items())
        if best is None or cost < best[0]:
            best = (cost, dict(zip(names, offsets)))
    _OFFSETS.update(best[1])
    return _OFFSETS


def lane_latency():
    """Cycles from a `VectorLane` input to its output (every op takes as long)."""
    ops = LatencyOps()
    stages = [ops.fadd(0, 0)]
    for name in _FUNCTION_OF.values():
        stages.append(vecmath.FUNCTIONS[name](ops, 0) + function_offsets()[name])
    return max(stages)


def _lane_datapath(m, enable, inp, prefix="", unit_modules=None):
    """Build one lane in `m`; (result word, latency)."""
    ops = SharedPipelineOps(m, enable, prefix, unit_modules)
    op = inp.op.as_value()
    results = _build_lane(ops, op, inp.a, inp.b)
    latency = max(v.stage or 0 for v in results.values())
    op_out = ops.at(ops.lift(op), latency)[:len(op)]
    y = Signal(32, name=f"{prefix}y")
    with m.Switch(op_out):
        for code, v in results.items():
            with m.Case(code.value):
                m.d.comb += y.eq(ops.at(v, latency))
    ops.finish()
    return y, latency


def _valid_chain(m, enable, valid, latency):
    """`valid` delayed by `latency` stages of the stallable pipeline."""
    for stage in range(latency):
        nxt = Signal(name=f"valid_s{stage + 1}")
        with m.If(enable):
            m.d.sync += nxt.eq(valid)
        valid = nxt
    return valid


class VectorLane(wiring.Component):
    """One element of the vector unit: ``y = op(a, b)`` for any element `VpuOp`
    (not RSUM/RMAX), after a fixed latency (`lane_latency()` cycles). The ops
    share their fp32 units (`SharedPipelineOps`).

    Parameters
    ----------
    unit_modules : dict or None
        See `PipelineOps`.

    Interface
    ---------
    i : In(stream.Signature(LaneInput))
    o : Out(stream.Signature(32))
        fp32 bit pattern. The pipeline stalls as a whole while ``o`` is not taken.
    """

    i: In(stream.Signature(LaneInput))
    o: Out(stream.Signature(32))

    def __init__(self, unit_modules=None):
        self.unit_modules = unit_modules
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        enable = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(enable)
        y, latency = _lane_datapath(m, enable, self.i.payload, unit_modules=self.unit_modules)
        m.d.comb += [self.o.valid.eq(_valid_chain(m, enable, self.i.valid, latency)),
                     self.o.payload.eq(y)]
        return m


def tree_levels(cols):
    """Levels of the reduction tree over `cols` lanes (the row padded to a power
    of two)."""
    return max(0, (cols - 1).bit_length())


def alu_latency(config):
    """Cycles from a `VectorAlu` input row to its output row (every op)."""
    return lane_latency() + tree_levels(config.cols)


class VectorAlu(wiring.Component):
    """``cols`` `VectorLane` s in lockstep, then a reduction tree: one row
    operation per cycle, `alu_latency` cycles each.

    Every lane sees the same valid, ready and op, and all have the same latency,
    so they never drift apart; lane 0's handshake stands for all. For RSUM and
    RMAX the lanes pass ``a`` through, and the tree reduces the row in the order
    of ``tree_sum`` (docs/vpu.md): padded with +0 (or -inf) to a power of two,
    the upper half added onto the lower half until one element is left, which
    goes to every lane. Other ops go around the tree through delay registers.

    Parameters
    ----------
    config : ChipConfig
        ``cols`` lanes.
    unit_modules : dict or None
        See `PipelineOps`; with a "lane" entry, the lanes themselves are
        black-box instances of that module (a `VectorLane` generated once).

    Interface
    ---------
    i : In(stream.Signature(StructLayout({"op": VpuOp, "a": row, "b": row})))
        ``op``, and rows ``a`` and ``b`` of ``cols`` fp32 words.
    o : Out(stream.Signature(ArrayLayout(32, cols)))
        The result row.
    """

    def __init__(self, config, unit_modules=None):
        self.config = config
        self.unit_modules = unit_modules or {}
        row = data.ArrayLayout(32, config.cols)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"op": VpuOp, "a": row, "b": row}))),
            "o": Out(stream.Signature(row)),
        })

    def _lane(self, m, name):
        module = self.unit_modules.get("lane")
        if module is None:
            m.submodules[name] = lane = VectorLane(self.unit_modules)
            return lane
        return black_box(m, name, module, signature_of(VectorLane), clocked=True)

    def elaborate(self, platform):
        m = Module()
        cols = self.config.cols
        op = self.i.payload.op
        reduce = (op == VpuOp.RSUM) | (op == VpuOp.RMAX)
        lanes = [self._lane(m, f"lane{k}") for k in range(cols)]
        # One stallable pipeline: the tree's stages load under `enable`, the
        # lanes' under their own handshake with the tree (bubbles collapse).
        valid = Signal()
        enable = ~valid | self.o.ready
        for k, lane in enumerate(lanes):
            m.d.comb += [
                lane.i.valid.eq(self.i.valid), lane.o.ready.eq(enable),
                lane.i.payload.op.eq(Mux(reduce, VpuOp.PASS, op)),
                lane.i.payload.a.eq(self.i.payload.a[k]), lane.i.payload.b.eq(self.i.payload.b[k]),
            ]
        m.d.comb += self.i.ready.eq(lanes[0].i.ready)

        # The op travels beside the lanes, under their enable, to pick the tree.
        lane_enable = ~lanes[0].o.valid | lanes[0].o.ready
        beside = PipelineOps(m, lane_enable, "op_")
        op_width = len(op.as_value())
        op_at_tree = beside.at(beside.lift(op.as_value()), lane_latency())[:op_width]
        beside.finish()

        ops = PipelineOps(m, enable, "tree_", self.unit_modules)
        row = [ops.lift(lane.o.payload) for lane in lanes]
        levels = tree_levels(cols)
        trees = {code: _reduce_tree(ops, row, kind, pad)
                 for code, (kind, pad) in _REDUCTIONS.items()}
        final_op = Signal(VpuOp)
        m.d.comb += final_op.eq(ops.at(ops.lift(op_at_tree), levels)[:op_width])
        for k in range(cols):
            out = ops.at(row[k], levels)
            for code, total in trees.items():
                out = Mux(final_op == code, ops.at(total, levels), out)
            m.d.comb += self.o.payload[k].eq(out)
        ops.finish()
        m.d.comb += [valid.eq(_valid_chain(m, enable, lanes[0].o.valid, levels)),
                     self.o.valid.eq(valid)]
        return m


def _reduce_tree(ops, row, kind, pad_bits):
    """The `tree_sum` order over `row` (a list of `Value`) with the fp32 op `kind`."""
    width = 1 << tree_levels(len(row))
    values = row + [ops.const(pad_bits)] * (width - len(row))
    while width > 1:
        width //= 2
        values = [getattr(ops, kind)(values[j], values[j + width]) for j in range(width)]
    return values[0]


class RowTranspose(wiring.Component):
    """The transpose path: a block of accumulator rows written as VMEM columns
    (so that ``K^T`` for attention scores never leaves the chip).

    Takes up to ``vmem_row_elems`` accumulator rows of ``cols`` fp32 (the last
    one flagged ``last``), converts each element to bf16 (round to nearest
    even, `Fp32ToBf16`) as it arrives, and then sends ``cols`` VMEM rows: row
    ``j`` holds element ``j`` of every block row, block row ``i`` in element
    ``i``; elements past the block's height are +0. A block that reaches
    ``vmem_row_elems`` rows ends there whatever ``last`` says.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    i : In(stream.Signature(StructLayout({"row": ArrayLayout(32, cols), "last": 1})))
    o : Out(stream.Signature(vmem_row_layout(config)))
        One block's ``cols`` rows, after its last input row.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "row": data.ArrayLayout(32, config.cols), "last": 1}))),
            "o": Out(stream.Signature(vmem_row_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        height, cols = c.vmem_row_elems, c.cols
        # block[i][j]: bf16 of element j of block row i.
        block = [[Signal(16, name=f"block_{i}_{j}") for j in range(cols)] for i in range(height)]
        filled = Signal(range(height + 1))
        column = Signal(range(cols))
        converted = []
        for j in range(cols):
            m.submodules[f"to_bf16_{j}"] = conv = Fp32ToBf16()
            m.d.comb += conv.x.eq(self.i.payload.row[j])
            converted.append(conv.y.as_value())
        with m.FSM():
            with m.State("FILL"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    with m.Switch(filled):
                        for i in range(height):
                            with m.Case(i):
                                m.d.sync += [block[i][j].eq(converted[j]) for j in range(cols)]
                    m.d.sync += filled.eq(filled + 1)
                    with m.If(self.i.payload.last | (filled == height - 1)):
                        m.d.sync += column.eq(0)
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.o.valid.eq(1)
                with m.Switch(column):
                    for j in range(cols):
                        with m.Case(j):
                            m.d.comb += [self.o.payload[i].eq(Mux(i < filled, block[i][j], 0))
                                         for i in range(height)]
                with m.If(self.o.ready):
                    m.d.sync += column.eq(column + 1)
                    with m.If(column == cols - 1):
                        m.d.sync += filled.eq(0)
                        m.next = "FILL"
        return m
