"""Gateware that exists only to run units in simulation."""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamedUnit"]


class StreamedUnit(wiring.Component):
    """Puts a combinational unit behind valid/ready streams with one register stage,
    so that every unit runs through the same streaming harnesses; a pipelined
    unit (an ``en`` input and ``stages - 1`` register boundaries inside, as
    `mxu.hdl.numerics.Fp32Adder`) advances with that stage, its valid bit
    beside it.

    Parameters
    ----------
    unit : wiring.Component
        Combinational component, or pipelined (its ``stages`` attribute).
    inputs : sequence of str
        Names of its input members, packed LSB-first into the ``i`` payload.
    output : str
        Name of its output member, the ``o`` payload.

    Interface
    ---------
    i : In(stream.Signature(StructLayout(inputs)))
    o : Out(stream.Signature(<output shape>))
    """

    def __init__(self, unit, inputs, output):
        members = unit.signature.members
        for name in (*inputs, output):
            if name not in members:
                raise ValueError(f"{type(unit).__name__} has no member {name!r}")
        self._unit, self._inputs, self._output = unit, tuple(inputs), output
        layout = data.StructLayout({name: members[name].shape for name in inputs})
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(members[output].shape)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self._unit
        for name in self._inputs:
            m.d.comb += getattr(unit, name).eq(getattr(self.i.payload, name))
        advance = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(advance)
        valid = self.i.valid
        if getattr(unit, "stages", 1) > 1:
            m.d.comb += unit.en.eq(advance)
            for k in range(unit.stages - 1):
                reg = Signal(name=f"valid_s{k + 1}")
                with m.If(advance):
                    m.d.sync += reg.eq(valid)
                valid = reg
        with m.If(advance):
            m.d.sync += [
                self.o.valid.eq(valid),
                self.o.payload.eq(getattr(unit, self._output)),
            ]
        return m
