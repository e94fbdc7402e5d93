"""Inter-chip links (docs/pod.md): the port each link has at the chip's edge,
and the bridge that lets the DMA engines move rows over them.

SEND and RECV are a STORE and a LOAD whose external addresses lie in a link's
window at the top of the AXI address space (`ChipConfig.link_window_base`).
`LinkBridge` sits between the DMA engines and the external bus and steers a
burst to the memory or to the link its address names, so the DMA engines, their
row conversions, checks and tokens serve the links unchanged. A link is a byte
stream in flits of one AXI data beat.
"""

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4Signature, AxiResp

__all__ = ["link_signature", "LinkPort", "LinkBridge"]


def link_signature(config):
    """One link as the chip sees it: ``tx`` flits out (ready when the link
    model can take one this cycle), ``tx_credit`` a credit back from the
    neighbour (one per cycle at most), ``rx_flit`` a flit in when
    ``rx_valid`` (always taken: the sender only sends against a credit; no
    ready, so that every member is a port), ``rx_credit`` a credit given back."""
    flit = 8 * config.link_flit_bytes
    return wiring.Signature({
        "tx": Out(stream.Signature(flit)), "tx_credit": In(1),
        "rx_valid": In(1), "rx_flit": In(flit), "rx_credit": Out(1),
    })


class LinkPort(wiring.Component):
    """One link's endpoint: the sender's buffer and credit counter, and the
    receiver's buffer, each of ``config.link_credits`` flits.

    The send buffer lets the store DMA hand a SEND's flits over at its own
    rate and go on to its next transfer (another link's SEND, a STORE) while
    a slower link drains them: the DMA's write beats are one in-order stream,
    which a link paced below it would otherwise hold up.

    Credits are not cleared by a start or soft reset, only by a hard reset:
    credits still travelling back from the neighbour at a start would
    otherwise be counted twice (docs/pod.md).

    Interface
    ---------
    link : Out(link_signature(config))
    send : In(stream.Signature(flit bits))
        Flits to send, into the send buffer; each leaves when the link is
        ready and a credit is held.
    receive : Out(stream.Signature(flit bits))
        Flits received, in order.
    overflow : Out(1)
        Sticky: a flit arrived with the buffer full (the neighbour sent
        without a credit). Never set between two `LinkPort`.
    """

    def __init__(self, config):
        self.config = config
        flit = 8 * config.link_flit_bytes
        super().__init__({
            "link": Out(link_signature(config)), "send": In(stream.Signature(flit)),
            "receive": Out(stream.Signature(flit)), "overflow": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c, link = self.config, self.link
        m.submodules.outgoing = outgoing = fifo.SyncFIFOBuffered(
            width=8 * c.link_flit_bytes, depth=c.link_credits)
        credits = Signal(range(c.link_credits + 1), init=c.link_credits)
        have = credits != 0
        m.d.comb += [outgoing.w_data.eq(self.send.payload), outgoing.w_en.eq(self.send.valid),
                     self.send.ready.eq(outgoing.w_rdy),
                     link.tx.valid.eq(outgoing.r_rdy & have),
                     link.tx.payload.eq(outgoing.r_data),
                     outgoing.r_en.eq(link.tx.ready & have)]
        m.d.sync += credits.eq(credits - (link.tx.valid & link.tx.ready) + link.tx_credit)
        m.submodules.buffer = buffer = fifo.SyncFIFOBuffered(
            width=8 * c.link_flit_bytes, depth=c.link_credits)
        m.d.comb += [buffer.w_data.eq(link.rx_flit), buffer.w_en.eq(link.rx_valid),
                     self.receive.valid.eq(buffer.r_rdy), self.receive.payload.eq(buffer.r_data),
                     buffer.r_en.eq(self.receive.ready),
                     link.rx_credit.eq(buffer.r_rdy & self.receive.ready)]
        with m.If(link.rx_valid & ~buffer.w_rdy):
            m.d.sync += self.overflow.eq(1)
        return m


class LinkBridge(wiring.Component):
    """Steers the DMA engines' bursts to external memory or to the links.

    A burst goes to link ``i`` when its address is in that link's window
    (`ChipConfig.link_window_base` + ``i * link_window_bytes``), else to
    memory. Bursts of one engine in flight all go to one place: a burst for
    another waits until the earlier ones have completed, so responses never
    mix. A link burst's write data leave as flits, and its response (OKAY)
    follows its last beat; a read burst's beats are the next flits
    received. Only SEND and RECV reach a link's window: the decoder rejects
    a link beyond ``config.links`` (LINK_INDEX), and the DMA a LOAD or
    STORE there (EXT_RANGE).

    Interface
    ---------
    load, store : In(AXI4Signature)
        The load DMA (read channels used) and the store DMA (write channels).
    load_mem, store_mem : Out(AXI4Signature)
        The same towards external memory.
    send : Out(stream.Signature(flit bits)).array(config.links)
    receive : In(stream.Signature(flit bits)).array(config.links)
    """

    def __init__(self, config):
        if not config.links:
            raise ValueError("LinkBridge needs a chip with links (ChipConfig.links >= 1)")
        self.config = config
        axi = AXI4Signature(addr_width=config.axi_addr_bits, data_width=config.axi_data_bits)
        flit = stream.Signature(8 * config.link_flit_bytes)
        super().__init__({
            "load": In(axi), "store": In(axi), "load_mem": Out(axi), "store_mem": Out(axi),
            "send": Out(flit).array(config.links), "receive": In(flit).array(config.links),
        })

    def _target(self, addr):
        """(is a link window, link index) of an address."""
        top = self.config.axi_addr_bits
        return addr[top - 1], addr[top - 4:top - 1]

    def elaborate(self, platform):
        m = Module()
        self._reads(m)
        self._writes(m)
        return m

    def _reads(self, m):
        c, src, mem = self.config, self.load, self.load_mem
        inflight = Signal(range(c.dma_max_outstanding + 1))
        to_link, index = Signal(), Signal(3)
        ar_link, ar_index = self._target(src.araddr)
        same = (inflight == 0) | ((ar_link == to_link) & (~ar_link | (ar_index == index)))
        m.submodules.lengths = lengths = fifo.SyncFIFOBuffered(width=8,
                                                               depth=c.dma_max_outstanding)
        for name in src.signature.members:
            if name.startswith("ar") and name not in ("arvalid", "arready"):
                m.d.comb += getattr(mem, name).eq(getattr(src, name))
        m.d.comb += [mem.arvalid.eq(src.arvalid & ~ar_link & same),
                     src.arready.eq(same & Mux(ar_link, lengths.w_rdy, mem.arready)),
                     lengths.w_data.eq(src.arlen),
                     lengths.w_en.eq(src.arvalid & src.arready & ar_link)]
        with m.If(src.arvalid & src.arready):
            m.d.sync += [to_link.eq(ar_link), index.eq(ar_index)]
        # A link burst's beats: the next flits received.
        beat = Signal(8)
        flits = Array(port for port in self.receive)
        rvalid = lengths.r_rdy & flits[index].valid
        rlast = beat == lengths.r_data
        fire = rvalid & src.rready & to_link
        for i, port in enumerate(self.receive):
            m.d.comb += port.ready.eq(fire & (index == i))
        with m.If(fire):
            m.d.sync += beat.eq(Mux(rlast, 0, beat + 1))
        m.d.comb += lengths.r_en.eq(fire & rlast)
        m.d.comb += [
            src.rid.eq(0),
            src.rdata.eq(Mux(to_link, flits[index].payload, mem.rdata)),
            src.rresp.eq(Mux(to_link, AxiResp.OKAY, mem.rresp)),
            src.rlast.eq(Mux(to_link, rlast, mem.rlast)),
            src.rvalid.eq(Mux(to_link, rvalid, mem.rvalid)),
            mem.rready.eq(src.rready & ~to_link),
        ]
        done = src.rvalid & src.rready & src.rlast
        m.d.sync += inflight.eq(inflight + (src.arvalid & src.arready) - done)

    def _writes(self, m):
        c, src, mem = self.config, self.store, self.store_mem
        inflight = Signal(range(c.dma_max_outstanding + 1))   # AW taken, B not yet given
        unsent = Signal(range(-1, c.dma_max_outstanding + 1))  # AW taken, W not yet all sent
        answers = Signal(range(c.dma_max_outstanding + 1))    # link bursts sent, B owed
        to_link, index = Signal(), Signal(3)
        aw_link, aw_index = self._target(src.awaddr)
        same = (inflight == 0) | ((aw_link == to_link) & (~aw_link | (aw_index == index)))
        for name in src.signature.members:
            if name.startswith("aw") and name not in ("awvalid", "awready"):
                m.d.comb += getattr(mem, name).eq(getattr(src, name))
            if name in ("wdata", "wstrb", "wlast"):
                m.d.comb += getattr(mem, name).eq(getattr(src, name))
        aw_fire = src.awvalid & src.awready
        m.d.comb += [mem.awvalid.eq(src.awvalid & ~aw_link & same),
                     src.awready.eq(same & (aw_link | mem.awready))]
        with m.If(aw_fire):
            m.d.sync += [to_link.eq(aw_link), index.eq(aw_index)]
        # Write data go where their burst's address went. The DMA may offer
        # them before the address; then they go to memory together with it (a
        # master must not hold data back until the address is taken, AXI
        # A3.3.1), and to a link only after it (the bridge takes a link's
        # address at once). `unsent` is -1 while memory took a burst's data
        # before its address.
        owed = unsent > 0
        to_mem = Mux(owed, ~to_link, (unsent == 0) & src.awvalid & same & ~aw_link)
        to_port = owed & to_link
        flits = Array(port for port in self.send)
        for i, port in enumerate(self.send):
            m.d.comb += [port.payload.eq(src.wdata),
                         port.valid.eq(src.wvalid & to_port & (index == i))]
        m.d.comb += [mem.wvalid.eq(src.wvalid & to_mem),
                     src.wready.eq(Mux(to_port, flits[index].ready, to_mem & mem.wready))]
        last = src.wvalid & src.wready & src.wlast
        m.d.sync += unsent.eq(unsent + aw_fire - last)
        # Responses: the memory's, or OKAY once a link burst has gone.
        b_fire = src.bvalid & src.bready
        m.d.comb += [
            src.bid.eq(0),
            src.bvalid.eq(Mux(to_link, answers != 0, mem.bvalid)),
            src.bresp.eq(Mux(to_link, AxiResp.OKAY, mem.bresp)),
            mem.bready.eq(src.bready & ~to_link),
        ]
        m.d.sync += [answers.eq(answers + (last & to_port) - (b_fire & to_link)),
                     inflight.eq(inflight + aw_fire - b_fire)]
