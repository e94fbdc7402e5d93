"""The load and store engines: LOAD/STORE instructions become DMA descriptors."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .dma import DmaDir, DmaError, DmaSpace, dma_completion_layout, dma_descriptor_layout
from .isa import VECTOR_LINK_BIT, DmaInstr, ErrorCode, Opcode, Pushes

__all__ = ["TransferEngine"]


class TransferEngine(wiring.Component):
    """Runs LOAD (or STORE), RECV (or SEND) and SYNC instructions on one `Dma`: up to two
    descriptors in flight (the DMA overlaps a load's data with the next
    load's bursts, docs/memory.md), completed in order.

    Parameters
    ----------
    config : ChipConfig
    direction : DmaDir
        LOAD for the load engine, STORE for the store engine.

    Interface
    ---------
    cmd : In(stream.Signature(DmaInstr))
        Instructions in program order, tokens already taken.
    complete : Out(stream.Signature(Pushes), always ready)
        The push flags of an instruction once its transfer has completed.
    error : Out(ErrorCode)
        DMA_DESCRIPTOR or AXI_ERROR from the DMA's completion; the engine then
        refuses further commands.
    idle : Out(1)
    dma_cmd : Out(stream.Signature(dma_descriptor_layout(config)))
    dma_done : In(stream.Signature(dma_completion_layout(config)))
    """

    def __init__(self, config, direction):
        self.config = config
        self.direction = DmaDir(direction)
        super().__init__({
            "cmd": In(stream.Signature(DmaInstr)),
            "complete": Out(stream.Signature(Pushes, always_ready=True)),
            "error": Out(ErrorCode),
            "idle": Out(1),
            "dma_cmd": Out(stream.Signature(dma_descriptor_layout(config))),
            "dma_done": In(stream.Signature(dma_completion_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        ins = self.cmd.payload
        inflight = Signal(range(3))
        self.inflight = inflight    # for the formal proof's invariant (docs/formal.md)
        failed = Signal()
        is_sync = ins.opcode == Opcode.SYNC
        d = self.dma_cmd.payload
        ext_base, ext_stride = ins.ext_addr, ins.ext_stride
        if self.config.links:
            # SEND/RECV: a contiguous block in the link's address window
            # (`mxu.hdl.link`); their link number sits where ext_addr starts.
            # (Muxes, not an If: a conditional assignment to some fields of the
            # payload splits it over several processes, which Verilator orders
            # wrongly.)
            top = self.config.axi_addr_bits
            link = (ins.opcode == Opcode.SEND) | (ins.opcode == Opcode.RECV)
            ext_base = Mux(link, Cat(C(0, top - 4), ins.ext_addr[:3], C(1, 1)), ext_base)
            ext_stride = Mux(link, ins.row_bytes, ext_stride)
            m.d.comb += d.link.eq(link)
        m.d.comb += [
            d.dir.eq(self.direction),
            d.space.eq(Mux(ins.flags.space, DmaSpace.ACC, DmaSpace.VMEM)),
            d.to_bf16.eq(ins.flags.to_bf16),
            d.relu.eq(ins.flags.relu),
            d.tag.eq(Cat(ins.deps.as_value(), ins.as_value()[VECTOR_LINK_BIT])),
            d.rows.eq(ins.rows),
            d.row_bytes.eq(ins.row_bytes),
            d.chip_row.eq(ins.chip_row),
            d.ext_base.eq(ext_base),
            d.ext_stride.eq(ext_stride),
        ]
        if self.config.quant_formats:
            m.d.comb += d.format.eq(ins.flags.quant)
        # A SYNC waits until every transfer before it has completed. A command
        # offered to the DMA stays offered until taken, even if an earlier one
        # fails meanwhile (a stream's valid is never withdrawn).
        free = (inflight < 2) & ~failed
        offered = Signal()
        m.d.sync += offered.eq(self.dma_cmd.valid & ~self.dma_cmd.ready)
        m.d.comb += [
            self.dma_cmd.valid.eq(self.cmd.valid & ~is_sync & (inflight < 2) & (~failed | offered)),
            self.cmd.ready.eq(Mux(is_sync, free & (inflight == 0),
                                  (inflight < 2) & (~failed | offered) & self.dma_cmd.ready)),
            self.dma_done.ready.eq(1),
            self.idle.eq(inflight == 0),
        ]
        done = self.dma_done.valid
        issue = self.dma_cmd.valid & self.dma_cmd.ready
        m.d.sync += inflight.eq(inflight + issue - done)
        ok = self.dma_done.payload.error == DmaError.OK
        axi = ((self.dma_done.payload.error == DmaError.SLVERR)
               | (self.dma_done.payload.error == DmaError.DECERR))
        with m.If(done):
            with m.If(~ok & ~failed):
                m.d.sync += [failed.eq(1),
                             self.error.eq(Mux(axi, ErrorCode.AXI_ERROR, ErrorCode.DMA_DESCRIPTOR))]
        sync_done = self.cmd.valid & self.cmd.ready & is_sync
        m.d.comb += [
            self.complete.valid.eq((done & ok & ~failed) | sync_done),
            self.complete.payload.as_value().eq(
                Mux(sync_done, Cat(ins.deps.as_value(), ins.as_value()[VECTOR_LINK_BIT]),
                    self.dma_done.payload.tag[:5])),
        ]
        return m
