"""One design that holds every numeric unit, so that a single simulator build
serves the whole numerics regression (builds dominate test time)."""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mxu.hdl.mac import MAC_STAGES, MacOperands, MacUnit
from mxu.hdl.numerics import BF16, FP32, Bf16Multiplier, Fp32Adder, Fp32ToBf16

__all__ = ["NumericsTestTop"]


class NumericsTestTop(wiring.Component):
    """`Bf16Multiplier`, `Fp32Adder` and `Fp32ToBf16` with their ports brought out
    as ``mul_*``, ``add_*``, ``cvt_*``, and one `MacUnit` per pipeline depth as
    streams ``mac<stages>_i`` / ``mac<stages>_o``."""

    def __init__(self):
        members = {
            "mul_a": In(BF16), "mul_b": In(BF16), "mul_p": Out(FP32),
            "add_a": In(FP32), "add_b": In(FP32), "add_s": Out(FP32),
            "cvt_x": In(FP32), "cvt_y": Out(BF16),
        }
        for stages in MAC_STAGES:
            members[f"mac{stages}_i"] = In(stream.Signature(MacOperands))
            members[f"mac{stages}_o"] = Out(stream.Signature(FP32))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mul = mul = Bf16Multiplier()
        m.submodules.add = add = Fp32Adder()
        m.submodules.cvt = cvt = Fp32ToBf16()
        m.d.comb += [
            mul.a.eq(self.mul_a), mul.b.eq(self.mul_b), self.mul_p.eq(mul.p),
            add.a.eq(self.add_a), add.b.eq(self.add_b), self.add_s.eq(add.s),
            cvt.x.eq(self.cvt_x), self.cvt_y.eq(cvt.y),
        ]
        for stages in MAC_STAGES:
            unit = MacUnit(stages)
            m.submodules[f"mac{stages}"] = unit
            wiring.connect(m, wiring.flipped(getattr(self, f"mac{stages}_i")), unit.i)
            wiring.connect(m, unit.o, wiring.flipped(getattr(self, f"mac{stages}_o")))
        return m
