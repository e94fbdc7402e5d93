"""Synthesis wrappers: measure a unit's own register-to-register paths."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring

__all__ = ["RegisteredPorts"]


class RegisteredPorts(wiring.Component):
    """`unit` with a flip-flop on every input and output port bit.

    nextpnr reports Fmax over register-to-register paths only; without these
    registers a combinational input stage would be left out of the figure. The
    wrapper has the unit's signature, so it is a drop-in top for `run_ecp5`.
    Costs one FF per port bit, which a report should subtract.
    """

    def __init__(self, unit):
        self._unit = unit
        super().__init__(unit.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self._unit
        for path, member, outer in self.signature.flatten(self):
            inner = unit
            for part in path:
                inner = inner[part] if isinstance(part, int) else getattr(inner, part)
            reg = Signal.like(outer, name="q_" + "_".join(map(str, path)))
            if member.flow == wiring.In:
                m.d.sync += reg.eq(outer)
                m.d.comb += inner.eq(reg)
            else:
                m.d.sync += reg.eq(inner)
                m.d.comb += outer.eq(reg)
        return m
