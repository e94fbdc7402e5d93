"""The host register file: an AXI4-Lite slave (docs/architecture.md, docs/isa.md).

| offset | name | access | meaning |
|---|---|---|---|
| 0x00 | ID | RO | 0x4D585531 ("MXU1") |
| 0x04 | CTRL | WO | bit 0: start (ignored while busy or resetting); bit 1: soft reset |
| 0x08 | STATUS | RO | bit 0 busy, bit 1 done, bit 2 resetting, bits 7:4 error code, bits 10:8 bus users still draining (fetch, load DMA, store DMA) |
| 0x0C | ERROR_PC | RO | instruction index of the first error |
| 0x10 | PROG_BASE | RW | byte address of the program |
| 0x14 | PROG_LEN | RW | program length in instructions |
| 0x18 | SHAPE | RO | rows in bits 15:0, cols in bits 31:16 |
| 0x20 + 8i | counter i | RO | 64-bit, low word first (`COUNTERS` order) |

Unmapped addresses answer SLVERR; partial-strobe writes are applied whole.
"""

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4LiteSignature, AxiResp
from .isa import ErrorCode

__all__ = ["RegisterFile", "SoftReset", "REG", "CHIP_ID", "HOST_ADDR_BITS", "COUNTERS",
           "BUS_USERS"]

# Performance counters, in register order: counter i is at ``REG["COUNTERS"] + 8 i``.
COUNTERS = ("cycles", "array_active", "load_stall", "compute_stall", "store_stall",
            "dma_read_bytes", "dma_write_bytes", "instructions", "vector_active", "vector_stall")

# The core's AXI users, in the order of STATUS bits 10:8 (docs/isa.md).
BUS_USERS = ("fetch", "load_dma", "store_dma")

CHIP_ID = 0x4D585531
HOST_ADDR_BITS = 12
REG = {"ID": 0x00, "CTRL": 0x04, "STATUS": 0x08, "ERROR_PC": 0x0C, "PROG_BASE": 0x10,
       "PROG_LEN": 0x14, "SHAPE": 0x18, "COUNTERS": 0x20}


class SoftReset(wiring.Component):
    """The soft reset's sequence (docs/isa.md, "Host registers"): a request
    starts a drain, in which the core starts no new AXI burst and completes
    those in flight; once none is, a one-cycle reset of the core. A reset in
    the middle of a burst would drop VALIDs before READY, which the bus allows
    only for ARESETn.

    Interface
    ---------
    request : In(1)
        Begin (a pulse; one during a drain is merged into it).
    quiet : In(1)
        No burst of the core is in flight (with ``draining`` high, none starts).
    draining : Out(1)
        The core must start no new burst: from the request to the reset, both
        included.
    reset : Out(1)
        The core's reset, registered: a cycle after ``quiet`` was seen.
    """

    def __init__(self):
        super().__init__({"request": In(1), "quiet": In(1), "draining": Out(1), "reset": Out(1)})
        self.pending = Signal()     # a drain is under way (for the proofs' lemmas)

    def _done(self, pending):
        """The drain is over: nothing in flight."""
        return pending & self.quiet

    def elaborate(self, platform):
        m = Module()
        pending = self.pending
        waiting = self.request | pending
        done = self._done(waiting)
        m.d.sync += [pending.eq(waiting & ~done), self.reset.eq(done)]
        m.d.comb += self.draining.eq(waiting | self.reset)
        return m


class RegisterFile(wiring.Component):
    """AXI4-Lite slave holding control, status, program and counter registers.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    bus : In(AXI4LiteSignature(addr_width=12, data_width=32))
    start : Out(1)
        One-cycle pulse, registered: the cycle after a CTRL write is taken
        (with the write response).
    soft_reset : Out(1)
        The core's reset (`SoftReset`): one cycle, once a soft reset's drain
        is over.
    draining : Out(1)
        A soft reset drains the bus: the core starts no new burst.
    bus_busy : In(len(BUS_USERS))
        Which of the core's AXI users still has a burst in flight.
    prog_base, prog_len : Out(32)
    busy, done : In(1); error : In(ErrorCode); error_pc : In(32)
    counters : In(ArrayLayout(64, len(COUNTERS)))
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS, data_width=32)),
            "start": Out(1), "soft_reset": Out(1), "draining": Out(1),
            "bus_busy": In(len(BUS_USERS)),
            "prog_base": Out(32), "prog_len": Out(32),
            "busy": In(1), "done": In(1), "error": In(ErrorCode), "error_pc": In(32),
            "counters": In(data.ArrayLayout(64, len(COUNTERS))),
        })
        self.soft = SoftReset()

    def elaborate(self, platform):
        m = Module()
        bus = self.bus

        # ---- writes: AW and W together, then B ---------------------------------
        b_pending = Signal()
        take_w = bus.awvalid & bus.wvalid & ~b_pending
        m.d.comb += [bus.awready.eq(take_w), bus.wready.eq(take_w), bus.bvalid.eq(b_pending)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += b_pending.eq(0)
        waddr = bus.awaddr[2:HOST_ADDR_BITS]
        # start and soft_reset are registered pulses, the cycle after the write:
        # both reset large parts of the core, so a combinational path from the
        # bus would make the next-state logic of those registers depend on the
        # chip's inputs (a longer path in hardware; in a Verilated model, all
        # of it evaluated again whenever an input changes).
        request = Signal()
        m.submodules.soft = soft = self.soft
        m.d.comb += [soft.request.eq(request), soft.quiet.eq(self.bus_busy == 0),
                     self.soft_reset.eq(soft.reset), self.draining.eq(soft.draining)]
        m.d.sync += [self.start.eq(0), request.eq(0)]
        with m.If(take_w):
            m.d.sync += [b_pending.eq(1), bus.bresp.eq(AxiResp.OKAY)]
            with m.Switch(waddr):
                with m.Case(REG["CTRL"] >> 2):
                    m.d.sync += [self.start.eq(bus.wdata[0] & ~self.busy & ~soft.draining),
                                 request.eq(bus.wdata[1])]
                with m.Case(REG["PROG_BASE"] >> 2):
                    m.d.sync += self.prog_base.eq(bus.wdata)
                with m.Case(REG["PROG_LEN"] >> 2):
                    m.d.sync += self.prog_len.eq(bus.wdata)
                with m.Default():
                    m.d.sync += bus.bresp.eq(AxiResp.SLVERR)

        # ---- reads: AR, then R one cycle later ------------------------------------
        r_pending = Signal()
        m.d.comb += [bus.arready.eq(~r_pending), bus.rvalid.eq(r_pending)]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += r_pending.eq(0)
        raddr = bus.araddr[2:HOST_ADDR_BITS]
        c = self.config
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [r_pending.eq(1), bus.rresp.eq(AxiResp.OKAY), bus.rdata.eq(0)]
            with m.Switch(raddr):
                with m.Case(REG["ID"] >> 2):
                    m.d.sync += bus.rdata.eq(CHIP_ID)
                with m.Case(REG["STATUS"] >> 2):
                    m.d.sync += bus.rdata.eq(Cat(self.busy, self.done, soft.draining, C(0, 1),
                                                     self.error, self.bus_busy))
                with m.Case(REG["ERROR_PC"] >> 2):
                    m.d.sync += bus.rdata.eq(self.error_pc)
                with m.Case(REG["PROG_BASE"] >> 2):
                    m.d.sync += bus.rdata.eq(self.prog_base)
                with m.Case(REG["PROG_LEN"] >> 2):
                    m.d.sync += bus.rdata.eq(self.prog_len)
                with m.Case(REG["SHAPE"] >> 2):
                    m.d.sync += bus.rdata.eq(Cat(C(c.rows, 16), C(c.cols, 16)))
                for i in range(len(COUNTERS)):
                    for half in (0, 1):
                        with m.Case((REG["COUNTERS"] >> 2) + 2 * i + half):
                            m.d.sync += bus.rdata.eq(self.counters[i][32 * half:32 * half + 32])
                with m.Case(REG["CTRL"] >> 2):
                    pass
                with m.Default():
                    m.d.sync += bus.rresp.eq(AxiResp.SLVERR)
        return m
