"""The vector unit's datapath: element-wise fp32 operations and the functions of
`mxu.hdl.vecmath`, one accumulator row (``cols`` lanes) per cycle, pipelined
(docs/vpu.md).

The pipelines come from `mxu.hdl.pipeline` (`PipelineOps`,
`SharedPipelineOps`), which runs the sequences of `mxu.hdl.vecmath`.

* `VectorLane`: one element, any `VpuOp`, a fixed latency; its ops share
  their units, the functions starting at `function_offsets()`.
* `VectorAlu`: ``cols`` lanes in lockstep on whole rows, then a
  `ReductionTree` for RSUM and RMAX.
* `RowTranspose`: accumulator rows to VMEM columns, in bf16.
* `VectorUnit`: the vector engine of the chip, which runs VECTOR instructions
  on a `VectorAlu`.

Every fp32 unit of the lanes and the tree takes `ChipConfig.vpu_stages`
pipeline stages (docs/vpu.md, "Pipeline depth"): the same bits at every
depth, a row a cycle, latencies from `lane_latency` and `alu_latency`.

For synthesis (`mxu synth --unit vpu`), the fp32 adder, the multiplier and the
lane can each be generated once and instantiated by name
(``BuildHooks.vpu_modules``), as the array does with its PE.
"""

import itertools
from collections import Counter
from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Shape, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import vecmath
from .blackbox import black_box, signature_of
from .fifo import BufferedFifo, Fifo
from .hooks import BuildHooks
from .accmem import acc_row_layout
from .isa import BINARY_VPU_OPS, BMode, ErrorCode, Opcode, Pushes, VectorInstr, VpuOp
from .numerics import Fp32ToBf16
from .pipeline import LatencyOps, PipelineOps, SharedPipelineOps, UsageOps, Value
from .vmem import ReadPortSignature, WritePortSignature, _addr_shape, vmem_row_layout

__all__ = ["VpuOp", "VectorUnit", "VectorLane", "VectorAlu", "ReductionTree", "LaneInput",
           "RowTranspose", "lane_latency", "lane_row_signature", "tree_signature",
           "alu_latency", "tree_latency", "function_offsets", "function_start", "tree_levels"]


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
    (`function_offsets`, `function_start`), so that the three share most of
    their multipliers and adders."""
    av, bv = ops.lift(a), ops.lift(b)

    def owner(code):
        # Decoded as the op enters and carried as a flag, so that a shared
        # unit's input select starts from a register, not from a compare
        # (on the ECP5 the compare and the select cost the multipliers
        # behind them 0.45 ns at 50 MHz, docs/synth.md).
        flag = Signal(name=f"{ops.prefix}is_{code.name.lower()}")
        ops.m.d.comb += flag.eq(op == code.value)
        flag_v = ops.lift(flag)
        return lambda stage: ops.at(flag_v, stage)

    results = {VpuOp.PASS: av}
    for code, alu in _ALU_OPS.items():
        ops.begin(owner(code))
        results[code] = alu(ops, av, bv)
    for code, name in _FUNCTION_OF.items():
        start = function_start(name, ops.stages)
        ops.begin(owner(code))
        results[code] = vecmath.FUNCTIONS[name](ops, Value(ops.at(av, start), start)
                                                if start else av)
    return results


def function_start(name, stages=1):
    """The stage at which function `name` takes its input: its offset
    (`function_offsets`), less the stages of its ``cut``s (`mxu.hdl.vecmath`),
    so that its fp32 operations fall in the stages the offsets chose."""
    fn = vecmath.FUNCTIONS[name]
    lead = fn(LatencyOps(stages), 0) - stages * fn(LatencyOps(), 0)
    start = function_offsets(stages)[name] - lead
    if start < 0:
        raise ValueError(f"{name} starts at stage {function_offsets(stages)[name]}, before "
                         f"the {lead} stages of its cuts")
    return start


# Relative cost of the units, for choosing the offsets (generic cells, docs/vpu.md).
_UNIT_COST = {"fmul": 4671, "fscale": 700, "fadd": 1333, "fmax": 300, "fmin": 300}
_OFFSETS = {}


def function_offsets(stages=1):
    """The stage at which each function of `mxu.hdl.vecmath` starts in a lane
    whose fp32 units take `stages` stages: the offsets (within the longest
    function's latency) that minimise the units the functions and the ALU ops
    need when they share them by stage. Every stage of a lane is `stages`
    times its stage with one-stage units (the integer steps take none), so
    the offsets are too."""
    if stages != 1:
        return {name: stages * offset for name, offset in function_offsets().items()}
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


def lane_latency(stages=1):
    """Cycles from a `VectorLane` input to its output (every op takes as long)
    when each fp32 unit takes `stages` stages."""
    ops = LatencyOps(stages)
    ends = [ops.fadd(0, 0)]
    for name in _FUNCTION_OF.values():
        ends.append(vecmath.FUNCTIONS[name](ops, function_start(name, stages)))
    return max(ends)


def _lane_datapath(m, enable, inp, prefix="", unit_modules=None, stages=1):
    """Build one lane in `m`; (result word, latency)."""
    ops = SharedPipelineOps(m, enable, prefix, unit_modules, stages=stages)
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
    (not RSUM/RMAX), after a fixed latency (`lane_latency(stages)` cycles). The ops
    share their fp32 units (`SharedPipelineOps`).

    Parameters
    ----------
    unit_modules : dict or None
        See `PipelineOps`.
    stages : int
        Pipeline stages of each fp32 unit (`ChipConfig.vpu_stages`): same
        bits at every depth, one element a cycle.

    Interface
    ---------
    i : In(stream.Signature(LaneInput))
    o : Out(stream.Signature(32))
        fp32 bit pattern. The pipeline stalls as a whole while ``o`` is not taken.
    """

    i: In(stream.Signature(LaneInput))
    o: Out(stream.Signature(32))

    def __init__(self, unit_modules=None, stages=1):
        self.unit_modules = unit_modules
        self.stages = stages
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        enable = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(enable)
        y, latency = _lane_datapath(m, enable, self.i.payload, unit_modules=self.unit_modules,
                                    stages=self.stages)
        m.d.comb += [self.o.valid.eq(_valid_chain(m, enable, self.i.valid, latency)),
                     self.o.payload.eq(y)]
        return m


def tree_levels(cols):
    """Levels of the reduction tree over `cols` lanes (the row padded to a power
    of two)."""
    return max(0, (cols - 1).bit_length())


def tree_latency(config):
    """Cycles through the `ReductionTree` of `config`: its levels, each an
    fp32 unit of `ChipConfig.vpu_stages` stages."""
    return tree_levels(config.cols) * config.vpu_stages


def alu_latency(config):
    """Cycles from a `VectorAlu` input row to its output row (every op)."""
    return lane_latency(config.vpu_stages) + tree_latency(config)


def vector_alu_signature(config):
    """`VectorAlu`'s ports: ``i`` (op and rows a, b of ``cols`` fp32 words) and
    ``o`` (the result row)."""
    row = data.ArrayLayout(32, config.cols)
    return wiring.Signature({
        "i": In(stream.Signature(data.StructLayout({"op": VpuOp, "a": row, "b": row}))),
        "o": Out(stream.Signature(row)),
    })


def lane_row_signature(cols):
    """The ports of a row of `cols` lanes in lockstep (one valid, one ready):
    ``i`` carries the op and the rows ``a`` and ``b``, ``o`` the result row."""
    return wiring.Signature({
        "i": In(stream.Signature(data.StructLayout({
            "op": VpuOp, "a": data.ArrayLayout(32, cols), "b": data.ArrayLayout(32, cols)}))),
        "o": Out(stream.Signature(data.ArrayLayout(32, cols))),
    })


def tree_signature(config):
    """`ReductionTree`'s ports: ``i`` (the op and a row of ``cols`` fp32
    words) and ``o`` (the result row)."""
    row = data.ArrayLayout(32, config.cols)
    return wiring.Signature({
        "i": In(stream.Signature(data.StructLayout({"op": VpuOp, "row": row}))),
        "o": Out(stream.Signature(row)),
    })


class ReductionTree(wiring.Component):
    """The row reductions of a `VectorAlu` behind its lanes: for RSUM and RMAX
    the row is reduced in the order of ``tree_sum`` (docs/vpu.md): padded
    with +0 (or -inf) to a power of two, the upper half added onto the lower
    half until one element is left, which goes to every lane. Other ops go
    around the tree through delay registers. A row a cycle, `tree_latency`
    cycles each (`tree_levels` levels of fp32 units of
    `ChipConfig.vpu_stages` stages); the pipeline stalls as a whole while
    ``o`` is not taken.

    Parameters
    ----------
    config : ChipConfig
        ``cols`` and ``vpu_stages``.
    unit_modules : mapping or None
        See `PipelineOps` (the simulation's fast adders and max units).

    Interface
    ---------
    i : In(stream.Signature(StructLayout({"op": VpuOp, "row": ArrayLayout(32, cols)})))
    o : Out(stream.Signature(ArrayLayout(32, cols)))
    """

    def __init__(self, config, unit_modules=None):
        self.config = config
        self.unit_modules = unit_modules or {}
        super().__init__(tree_signature(config))

    def elaborate(self, platform):
        m = Module()
        c = self.config
        cols = c.cols
        valid = Signal()
        enable = ~valid | self.o.ready
        m.d.comb += self.i.ready.eq(enable)
        op_width = len(self.i.payload.op.as_value())
        tree_op = Value(self.i.payload.op.as_value(), 0)

        # A tree's sums are used only for a row of its op: the stand-ins that
        # `unit_modules["used"]` names compute nothing for the other rows.
        def op_in(stage):
            return ops.at(tree_op, stage)[:op_width]
        reduction_of = {kind: code for code, (kind, _) in _REDUCTIONS.items()}
        ops = PipelineOps(m, enable, "tree_", self.unit_modules,
                          used=lambda stage, kind: op_in(stage) == reduction_of[kind],
                          stages=c.vpu_stages)
        row = [ops.lift(self.i.payload.row[k]) for k in range(cols)]
        latency = tree_latency(c)
        trees = {code: _reduce_tree(ops, row, kind, pad)
                 for code, (kind, pad) in _REDUCTIONS.items()}
        final_op = Signal(VpuOp)
        m.d.comb += final_op.eq(op_in(latency))
        for k in range(cols):
            out = ops.at(row[k], latency)
            for code, total in trees.items():
                out = Mux(final_op == code, ops.at(total, latency), out)
            m.d.comb += self.o.payload[k].eq(out)
        ops.finish()
        m.d.comb += [valid.eq(_valid_chain(m, enable, self.i.valid, latency)),
                     self.o.valid.eq(valid)]
        return m


class VectorAlu(wiring.Component):
    """``cols`` `VectorLane` s in lockstep, then a `ReductionTree`: one row
    operation per cycle, `alu_latency` cycles each.

    Every lane sees the same valid, ready and op, and all have the same latency,
    so they never drift apart; lane 0's handshake stands for all. For RSUM and
    RMAX the lanes pass ``a`` through, and the tree reduces the row.

    Parameters
    ----------
    config : ChipConfig
        ``cols`` lanes, fp32 units of ``vpu_stages`` stages.
    hooks : BuildHooks or None
        Its ``vpu_modules``: see `PipelineOps`; with a "lane" entry, the lanes
        themselves are black-box instances of that module (a `VectorLane`
        generated once, of the same stages); with a "lanes" entry, the whole row of lanes is one
        instance of that module, with the ports of `lane_row_signature` (the
        simulation's stand-in: the lanes run in lockstep).

    Interface
    ---------
    i : In(stream.Signature(StructLayout({"op": VpuOp, "a": row, "b": row})))
        ``op``, and rows ``a`` and ``b`` of ``cols`` fp32 words.
    o : Out(stream.Signature(ArrayLayout(32, cols)))
        The result row.
    """

    def __init__(self, config, *, hooks=None):
        self.config = config
        hooks = BuildHooks() if hooks is None else hooks
        self.unit_modules = hooks.vpu_modules or {}
        super().__init__(vector_alu_signature(config))

    def _lanes(self, m, cols):
        """The lanes' interfaces (``i``, ``o``), one per column: lanes of their
        own, or views of one row instance (``unit_modules["lanes"]``)."""
        module = self.unit_modules.get("lanes")
        if module is None:
            return [self._lane(m, f"lane{k}") for k in range(cols)]
        row = black_box(m, "lanes", module, lane_row_signature(cols), clocked=True)
        return [SimpleNamespace(
            i=SimpleNamespace(valid=row.i.valid, ready=row.i.ready, payload=SimpleNamespace(
                op=row.i.payload.op, a=row.i.payload.a[k], b=row.i.payload.b[k])),
            o=SimpleNamespace(valid=row.o.valid, ready=row.o.ready, payload=row.o.payload[k]))
            for k in range(cols)]

    def _lane(self, m, name):
        module = self.unit_modules.get("lane")
        if module is None:
            m.submodules[name] = lane = VectorLane(self.unit_modules, self.config.vpu_stages)
            return lane
        return black_box(m, name, module, signature_of(VectorLane), clocked=True)

    def elaborate(self, platform):
        m = Module()
        cols = self.config.cols
        op = self.i.payload.op
        reduce = (op == VpuOp.RSUM) | (op == VpuOp.RMAX)
        lanes = self._lanes(m, cols)
        m.submodules.tree = tree = ReductionTree(self.config, self.unit_modules)
        # One stallable pipeline: the tree's stages load under its own
        # enable, the lanes' under their handshake with the tree (bubbles collapse).
        for k, lane in enumerate(lanes):
            m.d.comb += [
                lane.i.valid.eq(self.i.valid), lane.o.ready.eq(tree.i.ready),
                lane.i.payload.op.eq(Mux(reduce, VpuOp.PASS, op)),
                lane.i.payload.a.eq(self.i.payload.a[k]), lane.i.payload.b.eq(self.i.payload.b[k]),
                tree.i.payload.row[k].eq(lane.o.payload),
            ]
        m.d.comb += [self.i.ready.eq(lanes[0].i.ready), tree.i.valid.eq(lanes[0].o.valid)]

        # The op travels beside the lanes, under their enable, to pick the tree.
        lane_enable = ~lanes[0].o.valid | lanes[0].o.ready
        beside = PipelineOps(m, lane_enable, "op_")
        op_width = len(op.as_value())
        m.d.comb += tree.i.payload.op.eq(
            beside.at(beside.lift(op.as_value()), lane_latency(self.config.vpu_stages))[:op_width])
        beside.finish()
        wiring.connect(m, tree.o, wiring.flipped(self.o))
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
    storage : "registers" or "memory"
        How the block is held. ``"registers"`` (the default, what synthesis
        builds): one register per element. ``"memory"``: a memory of
        ``vmem_row_elems`` rows written one row per taken input and read at
        every row at once, for simulation: Verilator evaluates every
        register's next state every cycle, and a memory write only when it
        happens. Same ports, cycles and bits: a block row is read only below
        ``filled``, and every such row was written in this block, so the rows a
        reset does not clear are never read (`tests/test_hdl_vpu.py` runs both).

    Interface
    ---------
    i : In(stream.Signature(StructLayout({"row": ArrayLayout(32, cols), "last": 1})))
    o : Out(stream.Signature(vmem_row_layout(config)))
        One block's ``cols`` rows, after its last input row.
    """

    def __init__(self, config, storage="registers"):
        if storage not in ("registers", "memory"):
            raise ValueError(f"storage must be 'registers' or 'memory', not {storage!r}")
        self.config = config
        self.storage = storage
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "row": data.ArrayLayout(32, config.cols), "last": 1}))),
            "o": Out(stream.Signature(vmem_row_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        height, cols = c.vmem_row_elems, c.cols
        filled = Signal(range(height + 1))
        column = Signal(range(cols))
        converted = []
        for j in range(cols):
            m.submodules[f"to_bf16_{j}"] = conv = Fp32ToBf16()
            m.d.comb += conv.x.eq(self.i.payload.row[j])
            converted.append(conv.y.as_value())
        # block(i, j): bf16 of element j of block row i; write_row(): the
        # statements that store `converted` as block row `filled`.
        if self.storage == "registers":
            regs = [[Signal(16, name=f"block_{i}_{j}") for j in range(cols)] for i in range(height)]

            def block(i, j):
                return regs[i][j]

            def write_row():
                with m.Switch(filled):
                    for i in range(height):
                        with m.Case(i):
                            m.d.sync += [regs[i][j].eq(converted[j]) for j in range(cols)]
        else:
            m.submodules.block = memory = Memory(shape=16 * cols, depth=height, init=[])
            write = memory.write_port()
            rows = [memory.read_port(domain="comb") for _ in range(height)]
            m.d.comb += [port.addr.eq(i) for i, port in enumerate(rows)]
            m.d.comb += [write.addr.eq(filled), write.data.eq(Cat(*converted))]

            def block(i, j):
                return rows[i].data[16 * j:16 * (j + 1)]

            def write_row():
                m.d.comb += write.en.eq(1)
        with m.FSM():
            with m.State("FILL"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    write_row()
                    m.d.sync += filled.eq(filled + 1)
                    with m.If(self.i.payload.last | (filled == height - 1)):
                        m.d.sync += column.eq(0)
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.o.valid.eq(1)
                with m.Switch(column):
                    for j in range(cols):
                        with m.Case(j):
                            m.d.comb += [self.o.payload[i].eq(Mux(i < filled, block(i, j), 0))
                                         for i in range(height)]
                with m.If(self.o.ready):
                    m.d.sync += column.eq(column + 1)
                    with m.If(column == cols - 1):
                        m.d.sync += filled.eq(0)
                        m.next = "FILL"
        return m


def _pow2_at_least(n):
    return 1 << max(1, (n - 1).bit_length())


class _WriteRanges(wiring.Component):
    """The accumulator rows that VECTOR instructions in flight will write, in
    order, and whether a new instruction's reads overlap any of them (its
    read-after-write interlock: the pipeline is `alu_latency` deep, so an
    instruction's reads would otherwise overtake the writes before it).

    Interface: ``add``: In(stream of {lo, hi, acc}) (hi exclusive; ``acc`` 0
    for an instruction that writes VMEM, which only holds its place);
    ``retire``: In(1), the oldest instruction completed; ``probe_a``,
    ``probe_b``: In({lo, hi, on}) read ranges; ``hit``: Out(1).
    """

    def __init__(self, depth, addr_bits):
        self.depth = depth
        self._entry = data.StructLayout({"lo": addr_bits + 1, "hi": addr_bits + 1, "acc": 1})
        probe = data.StructLayout({"lo": addr_bits + 1, "hi": addr_bits + 1, "on": 1})
        super().__init__({"add": In(stream.Signature(self._entry)), "retire": In(1),
                          "probe_a": In(probe), "probe_b": In(probe), "hit": Out(1)})

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        entries = [Signal(self._entry, name=f"range{i}") for i in range(n)]
        valid = Signal(n)
        wp, rp = Signal(range(n)), Signal(range(n))
        count = Signal(range(n + 1))
        m.d.comb += self.add.ready.eq(count != n)
        add = self.add.valid & self.add.ready
        with m.If(add):
            with m.Switch(wp):
                for i in range(n):
                    with m.Case(i):
                        m.d.sync += entries[i].eq(self.add.payload)
            m.d.sync += wp.eq(Mux(wp == n - 1, 0, wp + 1))
        with m.If(self.retire):
            m.d.sync += rp.eq(Mux(rp == n - 1, 0, rp + 1))
        m.d.sync += count.eq(count + add - self.retire)
        keep = Cat(*((rp != i) | ~self.retire for i in range(n)))
        added = Cat(*(add & (wp == i) for i in range(n)))
        m.d.sync += valid.eq((valid & keep) | added)
        hits = []
        for i, e in enumerate(entries):
            for p in (self.probe_a, self.probe_b):
                hits.append(valid[i] & e.acc & p.on & (p.lo < e.hi) & (e.lo < p.hi))
        m.d.comb += self.hit.eq(Cat(*hits).any())
        return m


def _swap_pairs(row):
    """Lanes (2i, 2i+1) of a row of fp32 words as (-row[2i+1], row[2i]): RoPE's
    rotation of each pair (a lane without a partner, on an odd row, keeps its
    word; the decoder refuses ``swap`` there)."""
    lanes = []
    for k in range(len(row)):
        if k % 2 == 0 and k + 1 < len(row):
            lanes.append(row[k + 1] ^ 0x80000000)
        elif k % 2:
            lanes.append(row[k - 1])
        else:
            lanes.append(row[k])
    return Cat(*lanes)


def _row_meta_layout(config):
    """What travels with each operand row to the ALU and beside it to the writer."""
    c = config
    # `dst` after the flags: in the operand buffer it is a register too (below).
    return data.StructLayout({
        "op": VpuOp, "b_source": 2,          # 0 none, 1 operand buffer, 2 imm
        "imm": 32,
        "to_vmem": 1, "transpose": 1, "swap": 1, "last": 1, "push": Pushes,
        "dst": max(_addr_shape(c.acc_rows).width, _addr_shape(c.vmem_rows).width),
    })


def _meta_memory_bits(config):
    """The bits of a row's meta below its flags (`to_vmem`, `transpose`,
    `swap`, `last`, the pushes): what the operand buffer ``a`` keeps in
    memory; the flags stay in registers, which the proofs' lemmas name
    (docs/formal.md), and so do the pushes and `dst` (a few entries; the
    meta queue beside the ALU splits its 128 otherwise: `_BesideSplit`)."""
    return _row_meta_layout(config)["to_vmem"].offset


class _BesideSplit:
    """How the meta queue beside the ALU (`BufferedFifo`) splits a row's meta
    between its memory and its registers.

    In registers: the flags from `to_vmem` to `last`, which the proofs'
    lemmas name as the first bits of each entry (docs/formal.md), and
    ``dst``'s bank bits, on which the writer's readiness depends (the bank it
    writes: out of a block RAM it was the fpga-llm chip's worst path,
    docs/synth.md, "The fpga-llm chip"). In memory: the rest (op, ``b_source``,
    ``imm``, the pushes, ``dst``'s row within its bank), read only into write
    addresses and registers. A register part of 128 entries is a wide
    multiplexer and thousands of flip-flops: on the fpga-llm chip the queue
    was the largest share of router2's overused wires while ``dst`` and the
    pushes were registers.

    Attributes
    ----------
    memory_bits : int
        The queue's ``memory_bits``: the word's low bits.
    """

    def __init__(self, config):
        layout = _row_meta_layout(config)
        lg = (max(config.acc_banks, config.vmem_banks) - 1).bit_length()
        flags, push, dst = layout["to_vmem"].offset, layout["push"], layout["dst"]
        dst_width = Shape.cast(dst.shape).width
        memory = [(0, flags), (push.offset, Shape.cast(push.shape).width),
                  (dst.offset + lg, dst_width - lg)]
        registers = [(flags, push.offset - flags), (dst.offset, lg)]
        # (offset in the meta, width) in the word's order, low bits first.
        self._slices = [(o, w) for o, w in memory + registers if w]
        self.memory_bits = sum(w for o, w in memory)
        self.layout = layout

    def pack(self, meta):
        """The queue's word for `meta` (a value of the meta layout)."""
        bits = Cat(meta)
        return Cat(*(bits[o:o + w] for o, w in self._slices))

    def unpack(self, word):
        """The meta (a view of its layout) that `word` holds."""
        at, pieces = 0, []
        for o, w in self._slices:
            pieces.append((o, word[at:at + w]))
            at += w
        return self.layout(Cat(*(p for o, p in sorted(pieces, key=lambda x: x[0]))))


class _OperandReader(wiring.Component):
    """The issue stage of `VectorUnit`: reads a VECTOR's operand rows, each
    port at its own pace, into small buffers (so that a bank conflict between
    ``a`` and ``b`` costs a cycle, not a deadlock).

    Parameters
    ----------
    config : ChipConfig
    depth : int
        Rows each buffer holds; a port reads only with a credit for its buffer.

    Interface
    ---------
    instr : In(stream.Signature(VectorInstr))
        The next VECTOR (its interlock already passed); taken once the one
        before has issued its last read.
    read_a, read_b : Out(ReadPortSignature(acc addr, acc row))
    a : Out(stream.Signature({row, meta}))
        Operand ``a``'s rows, with the meta of the row (op, ``b`` source,
        destination row, flags, and the pushes on the last row).
    b : Out(stream.Signature(row))
        Operand ``b``'s rows (binary ops that read a row).
    busy : Out(1)
        An instruction is issuing, a read is in flight, or a buffer holds a row.
    """

    def __init__(self, config, depth):
        self.config, self.depth = config, depth
        c = config
        row = data.ArrayLayout(32, c.cols)
        aaddr = _addr_shape(c.acc_rows)
        super().__init__({
            "instr": In(stream.Signature(VectorInstr)),
            "read_a": Out(ReadPortSignature(aaddr, acc_row_layout(c))),
            "read_b": Out(ReadPortSignature(aaddr, acc_row_layout(c))),
            "a": Out(stream.Signature(data.StructLayout({"row": row,
                                                         "meta": _row_meta_layout(c)}))),
            "b": Out(stream.Signature(row)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c, depth = self.config, self.depth
        meta = _row_meta_layout(c)
        row_bits = 32 * c.cols
        # (A `Fifo`, `SyncFIFO`'s cycles: the rows and most of their meta in a
        # memory, the flags from `to_vmem` on in registers that the proofs'
        # lemmas name.)
        self.buf_a = buf_a = Fifo(row_bits + meta.size, depth,
                                  memory_bits=row_bits + _meta_memory_bits(c))
        m.submodules.buf_a = buf_a
        m.submodules.buf_b = buf_b = fifo.SyncFIFO(width=row_bits, depth=depth)
        cur = Signal(VectorInstr)
        cur_valid = Signal()
        issue_done = Signal()
        m.d.comb += self.instr.ready.eq(~cur_valid | issue_done)
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += [cur.eq(self.instr.payload), cur_valid.eq(1)]
        with m.Elif(issue_done):
            m.d.sync += cur_valid.eq(0)

        ia, ib = Signal(16), Signal(16)
        binary = Cat(*(cur.op == op for op in BINARY_VPU_OPS)).any()
        scalar = cur.flags.b_mode == BMode.SCALAR
        reads_b = binary & ~scalar
        credits_a = Signal(range(depth + 1), init=depth)
        credits_b = Signal(range(depth + 1), init=depth)
        a_left, b_left = ia != cur.rows, reads_b & (ib != cur.rows)
        m.d.comb += [
            self.read_a.req.valid.eq(cur_valid & a_left & (credits_a != 0)),
            self.read_a.req.payload.eq(cur.a_row + ia),
            self.read_b.req.valid.eq(cur_valid & b_left & (credits_b != 0)),
            self.read_b.req.payload.eq(
                cur.b_row + Mux(cur.flags.b_mode == BMode.ROW, ib, 0)),
        ]
        fire_a = self.read_a.req.valid & self.read_a.req.ready
        fire_b = self.read_b.req.valid & self.read_b.req.ready
        last = ia == cur.rows - 1
        # `issue_done` ends the instruction in the stage a cycle after its last
        # read; the counters are back at zero for the next one.
        m.d.comb += issue_done.eq(cur_valid & ~a_left & ~b_left)
        with m.If(issue_done):
            m.d.sync += [ia.eq(0), ib.eq(0)]
        with m.If(fire_a):
            m.d.sync += ia.eq(ia + 1)
        with m.If(fire_b):
            m.d.sync += ib.eq(ib + 1)

        row_meta = Signal(meta)
        m.d.comb += [
            row_meta.op.eq(cur.op),
            row_meta.b_source.eq(Mux(binary, Mux(scalar, 2, 1), 0)),
            row_meta.imm.eq(cur.imm),
            row_meta.dst.eq(cur.dst_row + Mux(cur.flags.transpose, 0, ia)),
            row_meta.to_vmem.eq(cur.flags.to_vmem),
            row_meta.transpose.eq(cur.flags.transpose),
            row_meta.swap.eq(cur.flags.swap),
            row_meta.last.eq(last),
            row_meta.push.deps.eq(cur.deps),
        ]
        # Responses come a cycle after the request: the row's meta waits a cycle too.
        inflight_a, inflight_b = Signal(), Signal()
        meta_q = Signal(meta)
        m.d.sync += [inflight_a.eq(fire_a), inflight_b.eq(fire_b),
                     credits_a.eq(credits_a - fire_a + buf_a.r_en),
                     credits_b.eq(credits_b - fire_b + buf_b.r_en)]
        with m.If(fire_a):
            m.d.sync += meta_q.eq(row_meta)
        m.d.comb += [
            buf_a.w_en.eq(inflight_a),
            buf_a.w_data.eq(Cat(self.read_a.resp.payload, meta_q)),
            buf_b.w_en.eq(inflight_b),
            buf_b.w_data.eq(self.read_b.resp.payload),
            self.a.valid.eq(buf_a.r_rdy), self.a.payload.eq(buf_a.r_data),
            buf_a.r_en.eq(self.a.valid & self.a.ready),
            self.b.valid.eq(buf_b.r_rdy), self.b.payload.eq(buf_b.r_data),
            buf_b.r_en.eq(self.b.valid & self.b.ready),
            self.busy.eq(cur_valid | (buf_a.level != 0) | (buf_b.level != 0)
                         | inflight_a | inflight_b),
        ]
        return m


class _ResultWriter(wiring.Component):
    """The write stage of `VectorUnit`: result rows to the accumulator, to
    VMEM in bf16, or through `RowTranspose` to VMEM columns.

    Interface
    ---------
    result : In(stream.Signature(ArrayLayout(32, cols)))
        The ALU's rows.
    meta : In(stream.Signature(row meta))
        Each row's meta, beside it (taken with it).
    acc_write : Out(WritePortSignature(acc addr, acc row))
    vmem_write : Out(WritePortSignature(vmem addr, vmem row))
    retire : Out(1)
        An instruction completed: its last row is written (after its last
        block has drained, with ``transpose``). In program order.
    push : Out(Pushes)
        The completed instruction's pushes.
    draining : Out(1)
        A transposed block goes to VMEM (no row is taken meanwhile).
    """

    def __init__(self, config, transpose_storage="registers"):
        self.config = config
        self.transpose_storage = transpose_storage
        c = config
        aaddr, vaddr = _addr_shape(c.acc_rows), _addr_shape(c.vmem_rows)
        super().__init__({
            "result": In(stream.Signature(data.ArrayLayout(32, c.cols))),
            "meta": In(stream.Signature(_row_meta_layout(c))),
            "acc_write": Out(WritePortSignature(aaddr, acc_row_layout(c))),
            "vmem_write": Out(WritePortSignature(vaddr, vmem_row_layout(c))),
            "retire": Out(1), "push": Out(Pushes), "draining": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.transpose = tr = RowTranspose(c, self.transpose_storage)
        rm, result = self.meta.payload, self.result
        draining = self.draining
        m.d.comb += draining.eq(tr.o.valid)
        out = result.valid & self.meta.valid & ~draining
        to_acc = ~rm.to_vmem
        direct_vmem = rm.to_vmem & ~rm.transpose
        bf16 = []
        for j in range(c.cols):
            m.submodules[f"to_bf16_{j}"] = conv = Fp32ToBf16()
            m.d.comb += conv.x.eq(result.payload[j])
            bf16.append(conv.y.as_value())
        m.d.comb += [
            self.acc_write.payload.addr.eq(rm.dst),
            self.acc_write.payload.data.eq(result.payload),
            tr.i.payload.row.eq(result.payload),
            tr.i.payload.last.eq(rm.last),
        ]
        taken = Signal()
        with m.If(to_acc):
            m.d.comb += [self.acc_write.valid.eq(out), taken.eq(out & self.acc_write.ready)]
        with m.Elif(direct_vmem):
            m.d.comb += taken.eq(out & self.vmem_write.ready)
        with m.Else():
            m.d.comb += [tr.i.valid.eq(out), taken.eq(out & tr.i.ready)]
        m.d.comb += [result.ready.eq(taken), self.meta.ready.eq(taken)]

        # The transposed block's VMEM rows: base and pushes latched with its last row.
        t_base = Signal(len(rm.dst))
        t_col = Signal(range(c.cols))
        t_push = Signal(Pushes)
        with m.If(taken & rm.transpose & rm.last):
            m.d.sync += [t_base.eq(rm.dst), t_col.eq(0), t_push.eq(rm.push)]
        t_fire = tr.o.valid & self.vmem_write.ready
        with m.If(t_fire):
            m.d.sync += t_col.eq(t_col + 1)
        with m.If(draining):
            m.d.comb += [self.vmem_write.valid.eq(1),
                         self.vmem_write.payload.addr.eq(t_base + t_col),
                         self.vmem_write.payload.data.eq(tr.o.payload),
                         tr.o.ready.eq(self.vmem_write.ready)]
        with m.Else():
            m.d.comb += [self.vmem_write.valid.eq(out & direct_vmem),
                         self.vmem_write.payload.addr.eq(rm.dst),
                         self.vmem_write.payload.data.eq(Cat(*bf16))]
        m.d.comb += [
            self.retire.eq((taken & rm.last & ~rm.transpose) | (t_fire & (t_col == c.cols - 1))),
            self.push.eq(Mux(draining, t_push, rm.push)),
        ]
        return m


class VectorUnit(wiring.Component):
    """The vector engine: runs VECTOR (and SYNC) instructions, one accumulator
    row per cycle through a `VectorAlu` (docs/vpu.md).

    For row i of a VECTOR, operand ``a`` is accumulator row ``a_row + i`` and
    ``b`` (binary ops) accumulator row ``b_row + i`` (`BMode.ROW`), row
    ``b_row`` (`BMode.BROADCAST`, read again for every row) or ``imm`` in
    every lane (`BMode.SCALAR`). The result goes to accumulator row
    ``dst_row + i``, or, with ``to_vmem``, rounded to bf16 into the first
    ``cols`` elements of VMEM row ``dst_row + i`` (the rest +0); with
    ``transpose`` as well (at most ``vmem_row_elems`` rows), the rows go
    through `RowTranspose` and become the columns of VMEM rows ``dst_row ..
    dst_row + cols - 1``. With ``swap``, ``a``'s lanes enter the ALU in
    rotated pairs (-a[2i+1], a[2i]) (RoPE, docs/llm.md). The decoder has checked the operands (docs/isa.md);
    this engine never fails.

    Operand reads run ahead of the ALU into small buffers, each port on its
    own, so a bank conflict between ``a`` and ``b`` costs a cycle, not a
    deadlock (`_OperandReader`); `_ResultWriter` writes the results. An instruction starts once no instruction in flight writes an
    accumulator row it reads (`_WriteRanges`); results leave in order, and an
    instruction completes when its last row is written (after its last block
    has drained, with ``transpose``), so completions are in program order.
    With pipelined fp32 units (``vpu_stages`` > 1) a queue of VECTORs in
    front of the interlock, an input stage and an output queue put the
    handshakes through registers (`_registered`, docs/vpu.md "Pipeline
    depth").

    Parameters
    ----------
    config : ChipConfig
    hooks : BuildHooks or None
        See `VectorAlu`; a ``"transpose"`` entry in its ``vpu_modules`` is the
        `RowTranspose`'s ``storage`` (``"memory"`` in the simulation's fast
        builds).

    Interface
    ---------
    cmd : In(stream.Signature(VectorInstr))
        VECTOR or SYNC, tokens already popped; a SYNC is taken once the engine is idle.
    complete : Out(stream.Signature(Pushes), always ready)
        A register: the cycle after the instruction's last row is written
        (a SYNC: after it is taken).
    error : Out(ErrorCode)
        Always NONE (for uniformity with the other engines).
    idle : Out(1)
        Nothing in flight, the last completion out.
    read_a, read_b : Out(ReadPortSignature(acc addr, acc row))
    acc_write : Out(WritePortSignature(acc addr, acc row))
    vmem_write : Out(WritePortSignature(vmem addr, vmem row))
    active : Out(1)
        A row entered the ALU this cycle (the ``vector_active`` counter).
    """

    BUFFER_DEPTH = 4
    RANGES = 4

    def __init__(self, config, *, hooks=None):
        self.config = config
        self.hooks = BuildHooks() if hooks is None else hooks
        c = config
        aaddr, vaddr = _addr_shape(c.acc_rows), _addr_shape(c.vmem_rows)
        super().__init__({
            "cmd": In(stream.Signature(VectorInstr)),
            "complete": Out(stream.Signature(Pushes, always_ready=True)),
            "error": Out(ErrorCode),
            "idle": Out(1),
            "read_a": Out(ReadPortSignature(aaddr, acc_row_layout(c))),
            "read_b": Out(ReadPortSignature(aaddr, acc_row_layout(c))),
            "acc_write": Out(WritePortSignature(aaddr, acc_row_layout(c))),
            "vmem_write": Out(WritePortSignature(vaddr, vmem_row_layout(c))),
            "active": Out(1),
        })
        # The sections are attributes, so that formal checkers reach their ports.
        self.alu = self._make_alu()
        self.reader = _OperandReader(c, self.BUFFER_DEPTH)
        self.writer = _ResultWriter(c, (self.hooks.vpu_modules or {}).get("transpose", "registers"))

    def _make_alu(self):
        """The `VectorAlu` (a formal harness replaces it by a stand-in with
        the same handshake, docs/formal.md)."""
        return VectorAlu(self.config, hooks=self.hooks)

    def _alu_latency(self):
        return alu_latency(self.config)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.alu = alu = self.alu
        m.submodules.ranges = ranges = _WriteRanges(self.RANGES, _addr_shape(c.acc_rows).width)
        m.submodules.reader = reader = self.reader
        m.submodules.writer = writer = self.writer
        # The rows' meta beside the ALU: `SyncFIFOBuffered`'s cycles
        # (`BufferedFifo`), in registers only what `_BesideSplit` keeps there.
        self.beside_split = split = _BesideSplit(c)
        self.beside = beside = BufferedFifo(
            _row_meta_layout(c).size,
            _pow2_at_least(self._alu_latency() + self._registered() + self._output_depth() + 4),
            memory_bits=split.memory_bits)
        m.submodules.beside = beside
        wiring.connect(m, reader.read_a, wiring.flipped(self.read_a))
        wiring.connect(m, reader.read_b, wiring.flipped(self.read_b))
        wiring.connect(m, writer.acc_write, wiring.flipped(self.acc_write))
        wiring.connect(m, writer.vmem_write, wiring.flipped(self.vmem_write))
        self._output(m, alu, writer)
        m.d.comb += [writer.meta.valid.eq(beside.r_rdy),
                     writer.meta.payload.eq(split.unpack(beside.r_data)),
                     beside.r_en.eq(writer.meta.ready)]
        sync, queued = self._intake(m, ranges, reader)
        self._feed(m, alu, reader, beside)
        # The completion reaches the controller through a register: its
        # token counters and error record are deep logic, and the writer's
        # retire comes from the rows' meta, late out of a block RAM (in the
        # fpga-llm netlist, 16 LUT levels from the meta queue's memory to the
        # controller's error pc). The engine is idle once it is out.
        m.d.sync += [
            self.complete.valid.eq(writer.retire | sync),
            self.complete.payload.eq(Mux(writer.retire, writer.push,
                                         self.cmd.payload.deps.as_value())),
        ]
        m.d.comb += [
            ranges.retire.eq(writer.retire),
            self.error.eq(ErrorCode.NONE),
            self.idle.eq(~reader.busy & (beside.level == 0) & ~writer.draining
                         & ~self.complete.valid & ~queued),
        ]
        return m

    def _registered(self):
        """The ALU's handshakes go through registers when its fp32 units are
        pipelined for a clock (``vpu_stages`` > 1): an input stage and an
        output queue (`_feed`, `_output`). With one-stage units the lanes
        set the clock (docs/synth.md), and the chips keep their cycles."""
        return self.config.vpu_stages > 1

    def _output_depth(self):
        """Rows of the queue between the ALU and the writer (`_output`)."""
        return 3 if self._registered() else 0

    def _output(self, m, alu, writer):
        """ALU -> writer. With pipelined fp32 units, through a queue whose
        ``w_rdy`` is a register, so that the ALU's stall (every lane
        register's enable, then the operand reads) no longer hangs on the
        writer's bank readiness and the row's meta: that chain was the
        fpga-llm chip's worst path (docs/synth.md, "The fpga-llm chip"). Its
        3 rows keep a row a cycle (an output register and two behind it)."""
        depth = self._output_depth()
        if not depth:
            wiring.connect(m, alu.o, writer.result)
            return
        m.submodules.out = self.out = out = BufferedFifo(32 * self.config.cols, depth)
        m.d.comb += [
            out.w_en.eq(alu.o.valid), out.w_data.eq(alu.o.payload), alu.o.ready.eq(out.w_rdy),
            writer.result.valid.eq(out.r_rdy), writer.result.payload.eq(out.r_data),
            out.r_en.eq(writer.result.ready),
        ]

    def _queue(self, m):
        """VECTORs -> the interlock. With pipelined fp32 units, through a
        queue whose ``w_rdy`` is a register, so that ``cmd.ready`` (the
        controller's token pops and pushes, its pcs and error record) no
        longer waits for the interlock's range compares: that chain was the
        fpga-llm chip's worst path at seed 2 (docs/synth.md, "The fpga-llm
        chip"). Its 3 entries keep an instruction a cycle. Returns the
        head's (valid, payload, ready, "any queued"), ready for the caller
        to drive."""
        is_sync = self.cmd.payload.opcode == Opcode.SYNC
        vector = self.cmd.valid & ~is_sync
        if not self._registered():
            ready = Signal()
            m.d.comb += self.cmd.ready.eq(ready & ~is_sync)
            return vector, self.cmd.payload, ready, 0
        m.submodules.queue = self.queue = q = BufferedFifo(Shape.cast(VectorInstr).width, 3)
        m.d.comb += [q.w_en.eq(vector), q.w_data.eq(self.cmd.payload),
                     self.cmd.ready.eq(q.w_rdy & ~is_sync)]
        return q.r_rdy, VectorInstr(q.r_data), q.r_en, q.level != 0

    def _intake(self, m, ranges, reader):
        """The interlock; a VECTOR then moves into the issue stage. Returns
        "a SYNC is taken" (once the engine is idle) and "a VECTOR is queued
        in front of the interlock" (`_queue`)."""
        valid, ins, ready, queued = self._queue(m)
        is_sync = self.cmd.payload.opcode == Opcode.SYNC
        binary = Cat(*(ins.op == op for op in BINARY_VPU_OPS)).any()
        reads_b = binary & (ins.flags.b_mode != BMode.SCALAR)
        m.d.comb += [
            ranges.probe_a.lo.eq(ins.a_row), ranges.probe_a.hi.eq(ins.a_row + ins.rows),
            ranges.probe_a.on.eq(1),
            ranges.probe_b.lo.eq(ins.b_row),
            ranges.probe_b.hi.eq(ins.b_row + Mux(ins.flags.b_mode == BMode.ROW, ins.rows, 1)),
            ranges.probe_b.on.eq(reads_b),
            ranges.add.payload.lo.eq(ins.dst_row), ranges.add.payload.hi.eq(ins.dst_row + ins.rows),
            ranges.add.payload.acc.eq(~ins.flags.to_vmem),
            reader.instr.payload.eq(ins),
            reader.instr.valid.eq(valid & ~ranges.hit & ranges.add.ready),
        ]
        start = reader.instr.valid & reader.instr.ready
        sync = self.cmd.valid & is_sync & self.idle
        with m.If(sync):
            m.d.comb += self.cmd.ready.eq(1)
        m.d.comb += [ready.eq(start), ranges.add.valid.eq(start)]
        return sync, queued

    def _feed(self, m, alu, reader, beside):
        """Buffered operands -> ALU, the row's meta beside it."""
        c = self.config
        rm = reader.a.payload.meta
        needs_b = rm.b_source == 1
        go = reader.a.valid & (~needs_b | reader.b.valid) & beside.w_rdy
        a = reader.a.payload.row
        row = Signal.like(alu.i.payload)
        m.d.comb += [
            row.op.eq(rm.op),
            row.a.eq(Mux(rm.swap, _swap_pairs(a), a.as_value())),
            row.b.eq(Mux(rm.b_source == 2, Cat(*([rm.imm] * c.cols)),
                         Mux(needs_b, reader.b.payload.as_value(), 0))),
        ]
        if self._registered():
            # An input stage: the operand buffers' memory read and the swap
            # and ``b`` muxes end at a register, not in the lanes' first
            # fp32 stage (in the fpga-llm netlist, 1 ns over at 50 MHz).
            staged, staged_valid = Signal.like(alu.i.payload), Signal()
            take = ~staged_valid | alu.i.ready
            with m.If(take):
                m.d.sync += [staged_valid.eq(go), staged.eq(row)]
            m.d.comb += [alu.i.valid.eq(staged_valid), alu.i.payload.eq(staged)]
            fire = go & take
        else:
            m.d.comb += [alu.i.valid.eq(go), alu.i.payload.eq(row)]
            fire = alu.i.valid & alu.i.ready
        m.d.comb += [
            reader.a.ready.eq(fire), reader.b.ready.eq(fire & needs_b),
            beside.w_en.eq(fire), beside.w_data.eq(self.beside_split.pack(rm)),
            self.active.eq(fire),
        ]
