"""Pipelines built from operation sequences (docs/vpu.md, "Hardware").

The functions of `mxu.hdl.vecmath` are written against an abstract `ops`
interface. The classes here implement it for the hardware and for planning:

* `PipelineOps` builds a pipeline: a register after every fp32 operation,
  integer operations in between, delays wherever an operand is older than its
  partner (registers, or a memory ring when long: `MEMORY_DELAY_MIN`);
* `SharedPipelineOps` builds several sequences of which one runs per element,
  sharing their fp32 units stage by stage;
* `LatencyOps` and `UsageOps` only count: a sequence's latency, and the units
  it needs in each stage.
"""

from collections import Counter

from amaranth.hdl import C, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .blackbox import black_box, signature_of
from .delay import MEMORY_DELAY_MIN, memory_rings
from .numerics import FP32_QNAN, Fp32Adder, Fp32Multiplier, leading_zeros

__all__ = ["Value", "PipelineOps", "SharedPipelineOps", "LatencyOps", "UsageOps",
           "min_max_signature", "MEMORY_DELAY_MIN"]

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


class Value:
    """A word of a pipeline under construction and the stage it is valid in
    (None: a constant, valid in every stage)."""

    def __init__(self, value, stage):
        self.value, self.stage = value, stage


class PipelineOps(_FpOps):
    """The `mxu.hdl.vecmath` operation interface, building hardware in module `m`.

    Each fp32 operation (`Fp32Adder`, `Fp32Multiplier`, max, min) takes
    `stages` pipeline stages (1 to 5, `FP_STAGES`): the adder and the
    multipliers are built with ``stages - 1`` register boundaries inside and
    a register after them, max and min (and combinational black boxes) are
    followed by ``stages`` registers. A sequence becomes a pipeline in which
    every fp32 operation takes `stages` stages and the integer steps none
    (docs/vpu.md, "Pipeline depth").
    Every register loads only while `enable` is high (the pipeline stalls as a
    whole), and takes no reset: a word in the pipeline is used only beside its
    row's valid bit, which the caller keeps (with a reset) in a chain of its
    own; on the FPGA, a reset on every data register is a net of thousands
    of pins (docs/synth.md, "Controls on the global network"). Values are
    `Value` objects; `lift` makes one from a signal.

    `unit_modules` maps "fadd", "fmul" and "fscale" (the power-of-two
    `Fp32Multiplier`) to Verilog module names: those units are then black-box
    instances of the modules (generated once, see `mxu.synth`), so that a
    hierarchical synthesis handles one of each.

    `unit_modules` may map "fmax" and "fmin" too, to modules with ports
    ``a``, ``b`` and ``s`` (`min_max_signature`). A black-box unit is
    combinational unless `unit_modules["staged"]` lists its kind: then it is
    a module of the unit with `stages` stages (ports ``en``, ``clk`` and
    ``rst`` as well; `mxu.synth`).

    `used`, if given, is a function of a stage and a unit's kind: a 1-bit value
    that is high when the results of that kind computed in that stage will be
    used. The black-box units whose kind `unit_modules["used"]` lists get it
    on an input port ``used``, and may give any result while it is low: the
    simulation's C stand-ins (`mxu.sim.backends.fast_vpu`) then skip their call.
    """

    def __init__(self, m, enable, prefix="", unit_modules=None, used=None, stages=1):
        self.m, self.enable, self.prefix = m, enable, prefix
        self.stages = stages
        self.unit_modules = unit_modules or {}
        self.used = used
        self._delayed = {}        # id of a value -> (the Value, {stage: its word there})
        self._count = 0
        self.registers = []       # (register, value) pairs, loaded under `enable`

    def finish(self):
        """Build the delays and load every register under `enable`; call once,
        after the last `at`."""
        self._build_delays()
        with self.m.If(self.enable):
            self.m.d.sync += [reg.eq(value) for reg, value in self.registers]

    def lift(self, signal, stage=0):
        return Value(signal, stage)

    def at(self, v, stage):
        """The word of `v` in `stage` (its delay is built by `finish`)."""
        if v.stage is None or v.stage == stage:
            return v.value
        assert v.stage < stage, "a value is needed before it exists"
        _, taps = self._delayed.setdefault(id(v.value), (v, {}))
        if stage not in taps:
            self._count += 1
            taps[stage] = Signal(len(v.value), name=f"{self.prefix}delay_s{stage}_{self._count}",
                                 reset_less=True)
        return taps[stage]

    def _build_delays(self):
        """Each delayed value's stages where it is used, from its own stage:
        registers between two uses closer than `MEMORY_DELAY_MIN` stages, a
        memory ring between two further apart."""
        rings = []
        for v, taps in self._delayed.values():
            prev, at = v.value, v.stage
            for stage in sorted(taps):
                if stage - at >= MEMORY_DELAY_MIN:
                    rings.append((prev, taps[stage], stage - at))
                else:
                    for _ in range(at + 1, stage):
                        self._count += 1
                        reg = Signal(len(prev), name=f"{self.prefix}delay_r{self._count}",
                                     reset_less=True)
                        self.registers.append((reg, prev))
                        prev = reg
                    self.registers.append((taps[stage], prev))
                prev, at = taps[stage], stage
        memory_rings(self.m, self.enable, rings, self.prefix)

    def _signal(self, name):
        self._count += 1
        return Signal(32, name=f"{self.prefix}{name}_{self._count}", reset_less=True)

    def _operands(self, *values):
        stages = [v.stage for v in values if v.stage is not None]
        stage = max(stages) if stages else None
        return stage, [v.value if stage is None else self.at(v, stage) for v in values]

    def _comb(self, expr, *values):
        stage, ops = self._operands(*values)
        out = self._signal("w")
        self.m.d.comb += out.eq(expr(*ops))
        return Value(out, stage)

    def _fp_unit(self, kind, stage):
        """A new fp32 unit of `kind` ("fadd", "fmul", "fscale", "fmax", "fmin")
        working in `stage`: its two input signals, its output, and the
        register boundaries it has inside."""
        inside = self.stages - 1
        if kind in ("fadd", "fmul", "fscale"):
            cls = Fp32Adder if kind == "fadd" else Fp32Multiplier
            self._count += 1
            name = f"{self.prefix}{kind}_{self._count}"
            module = self.unit_modules.get(kind)
            if module is None:
                if kind == "fadd":
                    unit = Fp32Adder(stages=self.stages)
                else:
                    unit = Fp32Multiplier(power_of_two=kind == "fscale", stages=self.stages)
                self.m.submodules[name] = unit
                if inside:
                    self.m.d.comb += unit.en.eq(self.enable)
            elif inside and kind in self.unit_modules.get("staged", ()):
                unit = black_box(self.m, name, module, _staged_signature(cls, self.stages),
                                 clocked=True)
                self.m.d.comb += unit.en.eq(self.enable)
            else:
                unit = self._black_box(kind, name, module, signature_of(cls), stage)
                inside = 0
            out = unit.s if kind == "fadd" else unit.p
            return unit.a.as_value(), unit.b.as_value(), out.as_value(), inside
        module = self.unit_modules.get(kind)
        if module is not None:
            self._count += 1
            unit = self._black_box(kind, f"{self.prefix}{kind}_{self._count}", module,
                                   min_max_signature(), stage)
            return unit.a, unit.b, unit.s, 0
        x, y = self._signal(f"{kind}_a"), self._signal(f"{kind}_b")
        return x, y, _min_max(x, y, larger=kind == "fmax"), 0

    def _fp_result(self, kind, stage):
        """A unit of `kind` in `stage` and the registers after it, up to
        ``stage + stages``: (input a, input b, the result's register)."""
        in_a, in_b, out, inside = self._fp_unit(kind, stage)
        for _ in range(self.stages - 1 - inside):
            reg = self._signal(f"{kind}_pipe")
            self.registers.append((reg, out))
            out = reg
        reg = self._signal(kind)
        self.registers.append((reg, out))
        return in_a, in_b, reg

    def _black_box(self, kind, name, module, signature, stage):
        """An instance of `module` for a unit of `kind`, with the ``used`` input
        if `unit_modules["used"]` lists the kind."""
        if self.used is None or kind not in self.unit_modules.get("used", ()):
            return black_box(self.m, name, module, signature, clocked=False)
        unit = black_box(self.m, name, module,
                         wiring.Signature({**signature.members, "used": In(1)}), clocked=False)
        self.m.d.comb += unit.used.eq(self.used(stage, kind))
        return unit

    def _fp_op(self, kind, a, b):
        """`kind` applied to `a` and `b`, `stages` stages."""
        stage, (x, y) = self._operands(a, b)
        in_a, in_b, reg = self._fp_result(kind, stage or 0)
        self.m.d.comb += [in_a.eq(x), in_b.eq(y)]
        return Value(reg, (stage or 0) + self.stages)

    def const(self, bits):
        return Value(C(bits & 0xFFFFFFFF, 32), None)

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
        return self._comb(lambda x: leading_zeros(x, m=self.m), a)

    def ieq(self, a, b):
        return self._comb(lambda x, y: x == y, a, b)

    def select(self, c, a, b):
        return self._comb(lambda s, x, y: Mux(s != 0, x, y), c, a, b)

    def cut(self, a):
        if self.stages == 1 or a.stage is None:
            return a
        return Value(self.at(a, a.stage + 1), a.stage + 1)


class SharedPipelineOps(PipelineOps):
    """`PipelineOps` for several sequences of which one runs per element (the ops
    of a `VectorLane`): an fp32 unit and its output register serve every
    sequence that needs a unit of that kind in that stage. Call `begin(select)`
    before each sequence, where ``select(stage)`` is high while that sequence's
    element is in `stage`; `finish()` also drives each shared unit's inputs
    from the sequence that owns the stage.
    """

    def __init__(self, m, enable, prefix="", unit_modules=None, stages=1):
        super().__init__(m, enable, prefix, unit_modules, stages=stages)
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
            slot = self._slots[(stage, kind, index)] = [*self._fp_result(kind, stage), []]
        slot[3].append((self._select(stage), x, y))
        return Value(slot[2], stage + self.stages)

    def finish(self):
        for in_a, in_b, _, users in self._slots.values():
            _, x, y = users[-1]
            for select, ux, uy in reversed(users[:-1]):
                x, y = Mux(select, ux, x), Mux(select, uy, y)
            self.m.d.comb += [in_a.eq(x), in_b.eq(y)]
        super().finish()


def _staged_signature(cls, stages):
    """The signature of an fp32 unit class `cls` of `stages` stages (from an
    instance that is never elaborated, and says so)."""
    unit = cls(stages=stages)
    unit._MustUse__silence = True
    return unit.signature


def _is_nan(x):
    return x[:31] > 0x7F800000


def min_max_signature():
    """The ports of an fp32 max or min unit: ``a``, ``b`` and the result ``s``."""
    return wiring.Signature({"a": In(32), "b": In(32), "s": Out(32)})


def _min_max(x, y, larger):
    """fp32 max (or min) of two words: NaN if either is, otherwise by value with
    -0 < +0, through keys that order like the values as unsigned integers."""
    key_x = Mux(x[31], ~x, x | 0x80000000)
    key_y = Mux(y[31], ~y, y | 0x80000000)
    pick_x = (key_x >= key_y) if larger else (key_x <= key_y)
    return Mux(_is_nan(x) | _is_nan(y), C(FP32_QNAN, 32), Mux(pick_x, x, y))


class LatencyOps(_FpOps):
    """The `mxu.hdl.vecmath` interface on stages only (None: a constant), to know a
    pipeline's latency without building it; each fp32 operation takes `stages`."""

    def __init__(self, stages=1):
        self.stages = stages

    @staticmethod
    def _stage(*stages):
        known = [s for s in stages if s is not None]
        return max(known) if known else None

    def const(self, bits):
        return None

    def _fp_op(self, kind, a, b):
        return (self._stage(a, b) or 0) + self.stages

    def _int(self, *values):
        return self._stage(*values)

    def _shift(self, a, k):
        return a

    def cut(self, a):
        return a if self.stages == 1 or a is None else a + 1

    iadd = isub = band = bor = bxor = shlv = ieq = select = clz = _int
    shl = shr = sar = _shift


class UsageOps(LatencyOps):
    """`LatencyOps` that also counts the fp32 units a sequence uses, by stage."""

    def __init__(self, stages=1):
        super().__init__(stages)
        self.units = Counter()      # (input stage, kind) -> units

    def _fp_op(self, kind, a, b):
        stage = self._stage(a, b) or 0
        self.units[(stage, kind)] += 1
        return stage + self.stages
