"""The vector unit's datapath: element-wise fp32 operations and the functions of
`mxu.hdl.vecmath`, one accumulator row (``cols`` lanes) per cycle, pipelined
(docs/vpu.md).

* `PipelineOps` turns a `mxu.hdl.vecmath` sequence into a pipeline: one
  register stage after every fp32 operation, integer operations in between,
  and delay registers wherever an operand is older than its partner.
* `VectorLane`: one element, any `VpuOp`, a fixed latency.
* `VectorAlu`: ``cols`` lanes in lockstep on whole rows.

For synthesis (`mxu synth --unit vpu`), the fp32 adder, the multiplier and the
lane can each be generated once and instantiated by name (``unit_modules``), as
the array does with its PE.
"""

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from . import vecmath
from .blackbox import black_box
from .numerics import FP32_QNAN, Fp32Adder, Fp32Multiplier, leading_zeros

__all__ = ["VpuOp", "PipelineOps", "VectorLane", "VectorAlu", "LaneInput", "lane_latency"]


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


class _Value:
    """A word of a pipeline under construction and the stage it is valid in
    (None: a constant, valid in every stage)."""

    def __init__(self, value, stage):
        self.value, self.stage = value, stage


class PipelineOps:
    """The `mxu.hdl.vecmath` operation interface, building hardware in module `m`.

    Each fp32 operation (`Fp32Adder`, `Fp32Multiplier`, max, min) is followed by a
    register, so a sequence becomes a pipeline with one fp32 operation per stage.
    Every register loads only while `enable` is high (the pipeline stalls as a
    whole). Values are `_Value` objects; `lift` makes one from a signal.

    `unit_modules` maps "fadd" and "fmul" to Verilog module names: the adders and
    multipliers are then black-box instances of those modules (generated once,
    see `mxu.synth`), so that a hierarchical synthesis handles one of each.
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

    def _registered(self, name, expr, *values):
        stage, ops = self._operands(*values)
        result = self._signal(f"{name}_c")
        self.m.d.comb += result.eq(expr(*ops))
        reg = self._signal(name)
        self.registers.append((reg, result))
        return _Value(reg, (stage or 0) + 1)

    def _unit(self, kind, cls):
        """A `cls` (kind "fadd" or "fmul") as a submodule, or as a named instance;
        returns an object with its ports."""
        self._count += 1
        name = f"{self.prefix}{cls.__name__.lower()}_{self._count}"
        module = self.unit_modules.get(kind)
        if module is None:
            self.m.submodules[name] = unit = cls()
            return unit
        return black_box(self.m, name, module, _signature_of(cls), clocked=False)

    def const(self, bits):
        return _Value(C(bits & 0xFFFFFFFF, 32), None)

    def fadd(self, a, b):
        def expr(x, y):
            adder = self._unit("fadd", Fp32Adder)
            self.m.d.comb += [adder.a.eq(x), adder.b.eq(y)]
            return adder.s.as_value()
        return self._registered("fadd", expr, a, b)

    def fmul(self, a, b):
        def expr(x, y):
            mul = self._unit("fmul", Fp32Multiplier)
            self.m.d.comb += [mul.a.eq(x), mul.b.eq(y)]
            return mul.p.as_value()
        return self._registered("fmul", expr, a, b)

    def fmax(self, a, b):
        return self._registered("fmax", lambda x, y: _min_max(x, y, larger=True), a, b)

    def fmin(self, a, b):
        return self._registered("fmin", lambda x, y: _min_max(x, y, larger=False), a, b)

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


def _build_lane(m, ops, op, a, b):
    """Every `VpuOp` result of one lane as `_Value`s, by op."""
    av, bv = ops.lift(a), ops.lift(b)
    results = {
        VpuOp.ADD: ops.fadd(av, bv),
        VpuOp.SUB: ops.fadd(av, ops.bxor(bv, ops.const(0x80000000))),
        VpuOp.MUL: ops.fmul(av, bv),
        VpuOp.MAX: ops.fmax(av, bv),
        VpuOp.MIN: ops.fmin(av, bv),
        VpuOp.PASS: av,
    }
    for code, name in _FUNCTION_OF.items():
        results[code] = vecmath.FUNCTIONS[name](ops, av)
    return results


class _LatencyOps:
    """The `mxu.hdl.vecmath` interface on stages only (None: a constant), to know a
    pipeline's latency without building it."""

    @staticmethod
    def _stage(*stages):
        known = [s for s in stages if s is not None]
        return max(known) if known else None

    def const(self, bits):
        return None

    def _fp(self, a, b):
        return (self._stage(a, b) or 0) + 1

    def _int(self, *values):
        return self._stage(*values)

    def _shift(self, a, k):
        return a

    fadd = fmul = fmax = fmin = _fp
    iadd = isub = band = bor = bxor = shlv = ieq = select = clz = _int
    shl = shr = sar = _shift


def lane_latency():
    """Cycles from a `VectorLane` input to its output (every op takes as long)."""
    ops = _LatencyOps()
    stages = [ops.fadd(0, 0), *(vecmath.FUNCTIONS[name](ops, 0) for name in _FUNCTION_OF.values())]
    return max(stages)


def _lane_datapath(m, enable, inp, prefix="", unit_modules=None):
    """Build one lane in `m`; (result word, latency)."""
    ops = PipelineOps(m, enable, prefix, unit_modules)
    results = _build_lane(m, ops, inp.op, inp.a, inp.b)
    latency = max(v.stage or 0 for v in results.values())
    op_out = ops.at(ops.lift(inp.op.as_value()), latency)[:len(inp.op.as_value())]
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
    """One element of the vector unit: ``y = op(a, b)`` for any `VpuOp`, every op
    computed and the one asked for selected after a fixed latency
    (`lane_latency()` cycles).

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
