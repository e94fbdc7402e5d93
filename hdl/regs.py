"""The host register file: an AXI4-Lite slave (docs/architecture.md, docs/isa.md).

| offset | name | access | meaning |
|---|---|---|---|
| 0x00 | ID | RO | 0x4D585531 ("MXU1") |
| 0x04 | CTRL | WO | bit 0: start (ignored while busy); bit 1: soft reset |
| 0x08 | STATUS | RO | bit 0 busy, bit 1 done, bits 7:4 error code |
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

__all__ = ["RegisterFile", "REG", "CHIP_ID", "HOST_ADDR_BITS", "COUNTERS"]

# Performance counters, in register order: counter i is at ``REG["COUNTERS"] + 8 i``.
COUNTERS = ("cycles", "array_active", "load_stall", "compute_stall", "store_stall",
            "dma_read_bytes", "dma_write_bytes", "instructions", "vector_active", "vector_stall")

CHIP_ID = 0x4D585531
HOST_ADDR_BITS = 12
REG = {"ID": 0x00, "CTRL": 0x04, "STATUS": 0x08, "ERROR_PC": 0x0C, "PROG_BASE": 0x10,
       "PROG_LEN": 0x14, "SHAPE": 0x18, "COUNTERS": 0x20}


class RegisterFile(wiring.Component):
    """AXI4-Lite slave holding control, status, program and counter registers.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    bus : In(AXI4LiteSignature(addr_width=12, data_width=32))
    start, soft_reset : Out(1)
        One-cycle pulses, registered: the cycle after a CTRL write is taken
        (with the write response).
    prog_base, prog_len : Out(32)
    busy, done : In(1); error : In(ErrorCode); error_pc : In(32)
    counters : In(ArrayLayout(64, len(COUNTERS)))
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width=HOST_ADDR_BITS, data_width=32)),
            "start": Out(1), "soft_reset": Out(1),
            "prog_base": Out(32), "prog_len": Out(32),
            "busy": In(1), "done": In(1), "error": In(ErrorCode), "error_pc": In(32),
            "counters": In(data.ArrayLayout(64, len(COUNTERS))),
        })

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
        m.d.sync += [self.start.eq(0), self.soft_reset.eq(0)]
        with m.If(take_w):
            m.d.sync += [b_pending.eq(1), bus.bresp.eq(AxiResp.OKAY)]
            with m.Switch(waddr):
                with m.Case(REG["CTRL"] >> 2):
                    m.d.sync += [self.start.eq(bus.wdata[0] & ~self.busy),
                                 self.soft_reset.eq(bus.wdata[1])]
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
                    m.d.sync += bus.rdata.eq(Cat(self.busy, self.done, C(0, 2), self.error))
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
