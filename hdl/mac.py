"""The multiply-accumulate unit: ``acc + a*w`` with a bf16 product and an fp32 sum."""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .numerics import BF16, FP32, Bf16ProductCore, Bf16ProductRound, FpAddAlign, Fp32AddRound, unpack_fp32

__all__ = ["MacOperands", "MacPipeline", "MacUnit", "MAC_STAGES"]

MAC_STAGES = (1, 2, 3, 4)


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
    significand product (the DSP block) and before its normalising shift.

    Parameters
    ----------
    stages : int
        Pipeline depth, 1, 2, 3 or 4.

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
        m.submodules.mul_round = mul_round = Bf16ProductRound()
        m.submodules.align = align = FpAddAlign()
        m.submodules.round = rnd = Fp32AddRound()

        def stage(value, registered, name):
            if not registered:
                return value
            reg = Signal.like(value, name=name)
            with m.If(self.en):
                m.d.sync += reg.eq(value)
            return reg

        ops = self.operands
        m.d.comb += [mul.a.eq(ops.a), mul.b.eq(ops.w)]
        m.d.comb += mul_round.raw.eq(stage(mul.raw, self.stages >= 4, "raw_product"))
        acc = stage(ops.acc, self.stages >= 4, "acc_d0")
        valid = stage(self.valid, self.stages >= 4, "valid_raw")
        product = stage(mul_round.p, self.stages >= 2, "product")
        acc = stage(acc, self.stages >= 2, "acc_d")
        valid = stage(valid, self.stages >= 2, "valid_mul")
        m.d.comb += [align.x.eq(unpack_fp32(m, FP32(acc), "acc_unpacked")), align.y.eq(product)]
        partial = stage(align.partial, self.stages >= 3, "partial")
        valid = stage(valid, self.stages >= 3, "valid_align")
        m.d.comb += rnd.partial.eq(partial)
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
        Pipeline depth, 1, 2, 3 or 4.

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
