"""The multiply-accumulate unit: ``acc + a*w`` with a bf16 product and an fp32 sum."""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .numerics import (BF16, FP32, Bf16ProductAmount, Bf16ProductCore, Bf16ProductShift, Fp32AddNormalize,
                       Fp32AddNormAmount, FpAddOrder, FpAddShiftAdd, unpack_fp32)

__all__ = ["MacOperands", "MacPipeline", "MacUnit", "MAC_STAGES"]

MAC_STAGES = (1, 2, 3, 4, 5, 6, 7)


class MacOperands(data.Struct):
    """One MAC request: activation, weight and the incoming fp32 partial sum."""
    a: BF16
    w: BF16
    acc: FP32


class MacPipeline(wiring.Component):
    """``result = acc + a*w`` (each operation rounded, docs/numerics.md) with a fixed
    latency of `stages` cycles while ``en`` is high; everything holds while it is low.

    The register boundaries are: stages=1, after the adder; stages=2, also between
    multiplier and adder; stages=3, also between the adder's alignment and its
    normalise/round halves; stages=4, also inside the multiplier, after the
    significand product (the DSP block) and before its normalising shift;
    stages=5, also between that shift's amount and the shift itself; stages=6,
    also between the adder's normalising shift amount and the shift itself;
    stages=7, also between the adder's magnitude order and its alignment shift.
    Each later boundary splits the stage that limited Fmax at the depth before
    it (docs/synth.md).

    Parameters
    ----------
    stages : int
        Pipeline depth, 1 to 7.

    Interface
    ---------
    en : In(1)
        Advance the pipeline.
    operands : In(MacOperands)
    valid : In(1)
        Tags `operands`; travels with them and comes out as ``result_valid``.
    result : Out(FP32)
    result_valid : Out(1)
    """

    def __init__(self, stages):
        if stages not in MAC_STAGES:
            raise ValueError(f"MAC stages must be one of {MAC_STAGES}, not {stages!r}")
        self.stages = stages
        super().__init__({
            "en": In(1),
            "operands": In(MacOperands),
            "valid": In(1),
            "result": Out(FP32),
            "result_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # The product goes to the adder unpacked (exactly the fp32 product, but
        # never packed into the fp32 encoding and unpacked again).
        m.submodules.mul = mul = Bf16ProductCore()
        m.submodules.mul_plan = mul_plan = Bf16ProductAmount()
        m.submodules.mul_round = mul_round = Bf16ProductShift()
        m.submodules.order = order = FpAddOrder()
        m.submodules.align = align = FpAddShiftAdd()
        m.submodules.norm_plan = norm_plan = Fp32AddNormAmount(lzc="onehot")
        m.submodules.round = rnd = Fp32AddNormalize()

        # The valid bit's registers, in order (the formal proofs' induction
        # lemmas read them: docs/formal.md).
        self.valid_stages = []

        def stage(value, registered, name):
            if not registered:
                return value
            reg = Signal.like(value, name=name)
            with m.If(self.en):
                m.d.sync += reg.eq(value)
            if any(value is v for v in (self.valid, *self.valid_stages)):
                self.valid_stages.append(reg)
            return reg

        def boundary(depth, name, value, *others):
            """`value` and the signals that travel beside it (the partial sum,
            the valid bit) through a register boundary that exists from `depth`
            stages on."""
            registered = self.stages >= depth
            return [stage(v, registered, f"{name}_{i}" if i else name)
                    for i, v in enumerate((value, *others))]

        ops = self.operands
        m.d.comb += [mul.a.eq(ops.a), mul.b.eq(ops.w)]
        raw, acc, valid = boundary(4, "raw", mul.raw, ops.acc, self.valid)
        m.d.comb += mul_plan.raw.eq(raw)
        plan, acc, valid = boundary(5, "mul_plan", mul_plan.plan, acc, valid)
        m.d.comb += mul_round.plan.eq(plan)
        product, acc, valid = boundary(2, "product", mul_round.p, acc, valid)
        m.d.comb += [order.x.eq(unpack_fp32(m, FP32(acc), "acc_unpacked")), order.y.eq(product)]
        ordered, valid = boundary(7, "ordered", order.ordered, valid)
        m.d.comb += align.ordered.eq(ordered)
        partial, valid = boundary(3, "partial", align.partial, valid)
        m.d.comb += norm_plan.partial.eq(partial)
        norm, valid = boundary(6, "norm", norm_plan.plan, valid)
        m.d.comb += rnd.plan.eq(norm)
        m.d.comb += [
            self.result.eq(stage(rnd.s, True, "result_q")),
            self.result_valid.eq(stage(valid, True, "valid_q")),
        ]
        return m


class MacUnit(wiring.Component):
    """`MacPipeline` behind valid/ready streams.

    The whole pipeline stalls while its output is valid and not accepted, so the
    latency from an accepted input to a valid output is `stages` cycles and one
    result can be taken per cycle.

    Parameters
    ----------
    stages : int
        Pipeline depth, 1 to 7 (see `MacPipeline`).

    Interface
    ---------
    i : In(stream.Signature(MacOperands))
    o : Out(stream.Signature(FP32))
    """

    def __init__(self, stages=2):
        if stages not in MAC_STAGES:
            raise ValueError(f"MAC stages must be one of {MAC_STAGES}, not {stages!r}")
        self.stages = stages
        super().__init__({
            "i": In(stream.Signature(MacOperands)),
            "o": Out(stream.Signature(FP32)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.pipe = pipe = MacPipeline(self.stages)
        advance = ~self.o.valid | self.o.ready
        m.d.comb += [
            pipe.en.eq(advance),
            pipe.operands.eq(self.i.payload),
            pipe.valid.eq(self.i.valid),
            self.i.ready.eq(advance),
            self.o.payload.eq(pipe.result),
            self.o.valid.eq(pipe.result_valid),
        ]
        return m
