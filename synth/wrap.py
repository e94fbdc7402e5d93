"""Synthesis wrappers: measure a unit's own register-to-register paths."""

from amaranth.hdl import Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredPorts", "SerialPorts"]


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


class SerialPorts(wiring.Component):
    """`unit` behind a narrow serial pin interface, for placing and routing units
    with more port bits than the FPGA package has pins (the chip's two AXI ports
    alone have about 400).

    Every input port bit of the unit is one flip-flop of a shift register loaded
    `width` bits per cycle from ``din``; every output port bit is captured into a
    register that shifts out `width` bits per cycle on ``dout``. Every input is
    therefore controllable and every output observable, so Yosys cannot remove
    any logic, and every timing path of the unit starts and ends at a register.
    The cost is one FF per port bit plus one LUT per output bit (capture or
    shift), which a report should subtract (`overhead`).

    Parameters
    ----------
    unit : wiring.Component
        The unit, clocked by the ``sync`` domain.
    width : int
        Width of the serial buses (>= 1).

    Interface
    ---------
    din : In(width)
        Shifted into the input register while ``load`` is high.
    load, capture, unload : In(1)
        Shift the input register; capture the unit's outputs; shift the output
        register by `width` bits (``capture`` wins).
    dout : Out(width)
        The lowest `width` bits of the output register.
    """

    def __init__(self, unit, width=16):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"SerialPorts width must be a positive integer, not {width!r}")
        self._unit = unit
        self.width = width
        ins = outs = 0
        for _, member, value in unit.signature.flatten(unit):
            bits = len(Value.cast(value))
            if member.flow == In:
                ins += bits
            else:
                outs += bits
        self.input_bits, self.output_bits = ins, outs
        super().__init__({
            "din": In(width), "load": In(1), "capture": In(1), "unload": In(1),
            "dout": Out(width),
        })

    @property
    def overhead(self):
        """(flip-flops, LUTs) the wrapper adds around the unit, approximately."""
        pins = self.width + 3
        return self.input_bits + self.output_bits + pins, self.output_bits

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self._unit
        ins, outs = [], []
        for _, member, value in unit.signature.flatten(unit):
            (ins if member.flow == In else outs).append(value)
        width = self.width

        # Register the pins, so that no path starts at an input pad.
        din = Signal(width)
        load, capture, unload = Signal(), Signal(), Signal()
        m.d.sync += [din.eq(self.din), load.eq(self.load), capture.eq(self.capture),
                     unload.eq(self.unload)]

        in_bits = Cat(*ins)
        shift_in = Signal(-(-len(in_bits) // width) * width)
        with m.If(load):
            m.d.sync += shift_in.eq(Cat(shift_in[width:], din))
        m.d.comb += in_bits.eq(shift_in[:len(in_bits)])

        out_bits = Cat(*outs)
        shift_out = Signal(len(out_bits))
        with m.If(capture):
            m.d.sync += shift_out.eq(out_bits)
        with m.Elif(unload):
            m.d.sync += shift_out.eq(shift_out >> width)
        m.d.comb += self.dout.eq(shift_out[:width])
        return m
