"""The vector unit's datapath: element-wise fp32 operations and the functions of
`mxu.hdl.vecmath`, one accumulator row (``cols`` lanes) per cycle, pipelined
(docs/vpu.md).

* `PipelineOps` turns a `mxu.hdl.vecmath` sequence into a pipeline: one
  register stage after every fp32 operation, integer operations in between,
  and delay registers wherever an operand is older than its partner.
* `SharedPipelineOps`: the same, for several sequences of which one runs per
  element: they share the fp32 units stage by stage.
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

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from . import vecmath
from .blackbox import black_box
from .numerics import FP32_QNAN, Fp32Adder, Fp32Multiplier, Fp32ToBf16, leading_zeros
from .vmem import vmem_row_layout

__all__ = ["VpuOp", "PipelineOps", "SharedPipelineOps", "VectorLane", "VectorAlu", "LaneInput",
           "lane_latency", "alu_latency", "function_offsets", "tree_levels", "RowTranspose"]


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


class _FpOps:
    """The fp32 operations of the `mxu.hdl.vecmath` interface, each a call of
    ``self._fp_op(kind, a, b)``."""

    def fadd(self, a, b):
        return self._fp_op("fadd", a, b)

    def fmul(self, a, b):
        return self._fp_op("fmul", a, b)

    def fmax(self, a, b):
        return self._fp_op("fmax", a, b)

    def fmin(self, a, b):
        return self._fp_op("fmin", a, b)

    def fscale(self, a, p):
        return self._fp_op("fscale", a, p)


class _Value:
    """A word of a pipeline under construction and the stage it is valid in
    (None: a constant, valid in every stage)."""

    def __init__(self, value, stage):
        self.value, self.stage = value, stage


class PipelineOps(_FpOps):
    """The `mxu.hdl.vecmath` operation interface, building hardware in module `m`.

    Each fp32 operation (`Fp32Adder`, `Fp32Multiplier`, max, min) is followed by a
    register, so a sequence becomes a pipeline with one fp32 operation per stage.
    Every register loads only while `enable` is high (the pipeline stalls as a
    whole). Values are `_Value` objects; `lift` makes one from a signal.

    `unit_modules` maps "fadd", "fmul" and "fscale" (the power-of-two
    `Fp32Multiplier`) to Verilog module names: those units are then black-box
    instances of the modules (generated once, see `mxu.synth`), so that a
    hierarchical synthesis handles one of each.
    """

    def __init__(self, m, enable, prefix="", unit_modules=None):
        self.m, self.enable, self.prefix = m, enable, prefix
        self.unit_modules = unit_modules or {}
        self._delayed = {}
        self._count = 0
        self.registers = []       # (register, value) pairs, loaded under `enable`

    def lift(self, signal, stage=0):
        return _Value(signal, stage)

    def at(self, v, stage):
        """The word of `v` in `stage` (delay registers as needed)."""
        if v.stage is None or v.stage == stage:
            return v.value
        assert v.stage < stage, "a value is needed before it exists"
        key = (id(v.value), stage)
        if key not in self._delayed:
            prev = self.at(v, stage - 1)
            reg = self._signal(f"delay_s{stage}")
            self.registers.append((reg, prev))
            self._delayed[key] = reg
        return self._delayed[key]

    def _signal(self, name):
        self._count += 1
        return Signal(32, name=f"{self.prefix}{name}_{self._count}")

    def _operands(self, *values):
        stages = [v.stage for v in values if v.stage is not None]
        stage = max(stages) if stages else None
        return stage, [v.value if stage is None else self.at(v, stage) for v in values]

    def _comb(self, expr, *values):
        stage, ops = self._operands(*values)
        out = self._signal("w")
        self.m.d.comb += out.eq(expr(*ops))
        return _Value(out, stage)

    def _fp_unit(self, kind):
        """A new fp32 unit of `kind` ("fadd", "fmul", "fmax", "fmin"): its two
        input signals and its output."""
        if kind in ("fadd", "fmul", "fscale"):
            cls = Fp32Adder if kind == "fadd" else Fp32Multiplier
            self._count += 1
            name = f"{self.prefix}{kind}_{self._count}"
            module = self.unit_modules.get(kind)
            if module is None:
                make = (lambda: Fp32Multiplier(power_of_two=True)) if kind == "fscale" else cls
                self.m.submodules[name] = unit = make()
            else:
                unit = black_box(self.m, name, module, _signature_of(cls), clocked=False)
            out = unit.s if kind == "fadd" else unit.p
            return unit.a.as_value(), unit.b.as_value(), out.as_value()
        x, y = self._signal(f"{kind}_a"), self._signal(f"{kind}_b")
        return x, y, _min_max(x, y, larger=kind == "fmax")

    def _fp_op(self, kind, a, b):
        """`kind` applied to `a` and `b`, then a register."""
        stage, (x, y) = self._operands(a, b)
        in_a, in_b, out = self._fp_unit(kind)
        self.m.d.comb += [in_a.eq(x), in_b.eq(y)]
        reg = self._signal(kind)
        self.registers.append((reg, out))
        return _Value(reg, (stage or 0) + 1)

    def const(self, bits):
        return _Value(C(bits & 0xFFFFFFFF, 32), None)

    def iadd(self, a, b):
        return self._comb(lambda x, y: (x + y)[:32], a, b)

    def isub(self, a, b):
        return self._comb(lambda x, y: (x - y)[:32], a, b)

    def band(self, a, b):
        return self._comb(lambda x, y: x & y, a, b)

    def bor(self, a, b):
        return self._comb(lambda x, y: x | y, a, b)

    def bxor(self, a, b):
        return self._comb(lambda x, y: x ^ y, a, b)

    def shl(self, a, k):
        return self._comb(lambda x: (x << k)[:32], a)

    def shr(self, a, k):
        return self._comb(lambda x: x >> k, a)

    def sar(self, a, k):
        return self._comb(lambda x: (x.as_signed() >> k)[:32], a)

    def shlv(self, a, b):
        return self._comb(lambda x, y: (x << y[:5])[:32], a, b)

    def clz(self, a):
        return self._comb(leading_zeros, a)

    def ieq(self, a, b):
        return self._comb(lambda x, y: x == y, a, b)

    def select(self, c, a, b):
        return self._comb(lambda s, x, y: Mux(s != 0, x, y), c, a, b)


class SharedPipelineOps(PipelineOps):
    """`PipelineOps` for several sequences of which one runs per element (the ops
    of a `VectorLane`): an fp32 unit and its output register serve every
    sequence that needs a unit of that kind in that stage. Call `begin(select)`
    before each sequence, where ``select(stage)`` is high while that sequence's
    element is in `stage`; `finish()` then drives each shared unit's inputs from
    the sequence that owns the stage.
    """

    def __init__(self, m, enable, prefix="", unit_modules=None):
        super().__init__(m, enable, prefix, unit_modules)
        self._slots = {}          # (stage, kind, index) -> [in_a, in_b, register, users]
        self._select = None
        self._used = Counter()

    def begin(self, select):
        self._select, self._used = select, Counter()

    def _fp_op(self, kind, a, b):
        stage, (x, y) = self._operands(a, b)
        stage = stage or 0
        index = self._used[(stage, kind)]
        self._used[(stage, kind)] += 1
        slot = self._slots.get((stage, kind, index))
        if slot is None:
            in_a, in_b, out = self._fp_unit(kind)
            reg = self._signal(kind)
            self.registers.append((reg, out))
            slot = self._slots[(stage, kind, index)] = [in_a, in_b, reg, []]
        slot[3].append((self._select(stage), x, y))
        return _Value(slot[2], stage + 1)

    def finish(self):
        for in_a, in_b, _, users in self._slots.values():
            _, x, y = users[-1]
            for select, ux, uy in reversed(users[:-1]):
                x, y = Mux(select, ux, x), Mux(select, uy, y)
            self.m.d.comb += [in_a.eq(x), in_b.eq(y)]


_SIGNATURES = {}


def _signature_of(cls):
    """The signature of component class `cls` (from one instance that is never
    elaborated, and says so)."""
    if cls not in _SIGNATURES:
        unit = cls()
        unit._MustUse__silence = True
        _SIGNATURES[cls] = unit.signature
    return _SIGNATURES[cls]


def _is_nan(x):
    return x[:31] > 0x7F800000


def _min_max(x, y, larger):
    """fp32 max (or min) of two words: NaN if either is, otherwise by value with
    -0 < +0, through keys that order like the values as unsigned integers."""
    key_x = Mux(x[31], ~x, x | 0x80000000)
    key_y = Mux(y[31], ~y, y | 0x80000000)
    pick_x = (key_x >= key_y) if larger else (key_x <= key_y)
    return Mux(_is_nan(x) | _is_nan(y), C(FP32_QNAN, 32), Mux(pick_x, x, y))


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
    """Every `VpuOp` result of one lane as `_Value`s, by op, on the units of a
    `SharedPipelineOps`: each function starts at its offset (`function_offsets`),
    so that the three share most of their multipliers and adders."""
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
        start = _Value(ops.at(av, offset), offset) if offset else av
        results[code] = vecmath.FUNCTIONS[name](ops, start)
    ops.finish()
    return results


class _LatencyOps(_FpOps):
    """The `mxu.hdl.vecmath` interface on stages only (None: a constant), to know a
    pipeline's latency without building it."""

    @staticmethod
    def _stage(*stages):
        known = [s for s in stages if s is not None]
        return max(known) if known else None

    def const(self, bits):
        return None

    def _fp_op(self, kind, a, b):
        return (self._stage(a, b) or 0) + 1

    def _int(self, *values):
        return self._stage(*values)

    def _shift(self, a, k):
        return a

    iadd = isub = band = bor = bxor = shlv = ieq = select = clz = _int
    shl = shr = sar = _shift


class _UsageOps(_LatencyOps):
    """`_LatencyOps` that also counts the fp32 units a sequence uses, by stage."""

    def __init__(self):
        self.units = Counter()      # (input stage, kind) -> units

    def _fp_op(self, kind, a, b):
        stage = self._stage(a, b) or 0
        self.units[(stage, kind)] += 1
        return stage + 1


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
        ops = _UsageOps()
        latency = vecmath.FUNCTIONS[name](ops, 0)
        usage[name] = (latency, ops.units)
    alu = _UsageOps()
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
    ops = _LatencyOps()
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
    with m.If(enable):
        m.d.sync += [reg.eq(value) for reg, value in ops.registers]
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
        return black_box(m, name, module, _signature_of(VectorLane), clocked=True)

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
        with m.If(lane_enable):
            m.d.sync += [reg.eq(value) for reg, value in beside.registers]

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
        with m.If(enable):
            m.d.sync += [reg.eq(value) for reg, value in ops.registers]
        m.d.comb += [valid.eq(_valid_chain(m, enable, lanes[0].o.valid, levels)),
                     self.o.valid.eq(valid)]
        return m


def _reduce_tree(ops, row, kind, pad_bits):
    """The `tree_sum` order over `row` (a list of `_Value`) with the fp32 op `kind`."""
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
