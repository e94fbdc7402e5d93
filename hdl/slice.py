"""A register slice: cuts every combinational path through a stream handshake
(docs/synth.md, "Pipelining the control for 50 MHz")."""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisterSlice"]


class RegisterSlice(wiring.Component):
    """A full-rate register slice (two-entry skid buffer) on a stream: ``o`` comes
    from registers and ``i.ready`` is a register, so no combinational path
    crosses it in either direction. Adds one cycle of latency.

    Parameters: ``shape``, the payload. Interface: ``i``: In(stream.Signature(shape));
    ``o``: Out(stream.Signature(shape)).
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        spare = Signal.like(self.i.payload)
        spare_valid = Signal()
        m.d.comb += self.i.ready.eq(~spare_valid)
        take = self.i.valid & ~spare_valid
        with m.If(~self.o.valid | self.o.ready):
            with m.If(spare_valid):
                m.d.sync += [self.o.payload.eq(spare), self.o.valid.eq(1), spare_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(take)]
        with m.Elif(take):
            m.d.sync += [spare.eq(self.i.payload), spare_valid.eq(1)]
        return m
