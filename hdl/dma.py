"""The DMA engine: an AXI4 master moving 2-D strided blocks between external
memory and the on-chip memories (VMEM, accumulator memory).

The contract (descriptor fields, completion, error codes, alignment and range
rules, AXI behaviour) is written down in ``docs/memory.md``; `mxu.verif.dma_model`
is its executable statement. In short:

* A descriptor moves ``rows`` external rows of ``row_bytes`` bytes, row ``i`` at
  ``ext_base + i * ext_stride``, to/from on-chip rows ``chip_row + i``. A loaded
  row fills its on-chip row from byte 0 and the rest of that row is written with
  zeros (free K/N zero padding). A stored row is the first ``row_bytes`` bytes of
  the (ReLU'd, bf16-converted) on-chip row.
* Rows with ``ext_stride == row_bytes`` (or a single row) are one contiguous
  range and move in long bursts; other descriptors move row by row.
* AXI: INCR bursts of full-width beats (``AxSIZE = log2(data bytes)``), at most
  ``config.dma_max_burst_beats`` beats, never across 4 KiB, up to
  ``config.dma_max_outstanding`` bursts in flight, ID 0 (responses in order),
  ``WSTRB`` for partial beats. W never waits for AW (the W side gets burst
  lengths from the burst generator, not from the AW handshake).
* Loads overlap: once a load's bursts are all issued, the next load is
  checked and issues its bursts while the first one's data still arrives (a
  receive context per load, two at most), so back-to-back small descriptors
  keep the read channel busy; completions stay in order. A descriptor that
  is not a load with data (a store, an illegal or empty one) waits until no
  load is receiving.
* Errors: illegal descriptors complete at once with an error code and no bus
  traffic. An error response (SLVERR/DECERR) stops the issue of new bursts; the
  bursts already issued are completed (all their beats and responses taken), so
  the bus is left clean, then the descriptor completes with the error code.
"""

from types import SimpleNamespace

from amaranth.hdl import C, Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .accmem import AccMem, acc_row_layout
from .axi import AXI4Signature, AxiBurst, segment_beats
from .fields import unpack_fields
from .fields import pack_fields as _pack_dict
from .numerics import Fp32ToBf16
from .vmem import ReadPortSignature, Vmem, WritePortSignature, _addr_shape, vmem_row_layout

__all__ = ["DmaDir", "DmaSpace", "DmaError", "dma_descriptor_layout", "dma_completion_layout",
           "Dma", "DmaSystem", "pack_fields", "unpack_fields"]


class DmaDir(enum.Enum, shape=1):
    """Direction of a descriptor."""
    LOAD = 0    # external memory -> on-chip
    STORE = 1   # on-chip -> external memory


class DmaSpace(enum.Enum, shape=1):
    """On-chip memory a descriptor uses."""
    VMEM = 0
    ACC = 1


class DmaError(enum.Enum, shape=4):
    """Completion status. Descriptor checks are made in this order; the first
    failing one is reported."""
    OK = 0
    BAD_OPTION = 1   # to_bf16/relu on a load, or to_bf16 with VMEM
    ROW_BYTES = 2    # row_bytes larger than the on-chip row (after conversion)
    MISALIGNED = 3   # ext_base, ext_stride or row_bytes not a multiple of the element size
    CHIP_RANGE = 4   # chip_row + rows > rows of the on-chip memory
    EXT_RANGE = 5    # a row byte at or beyond config.ext_mem_bytes
    SLVERR = 6       # an AXI slave error response (first error response wins)
    DECERR = 7       # an AXI decode error response


def _max_rows(config):
    return max(config.vmem_rows, config.acc_rows)


def _max_row_bytes(config):
    return max(config.vmem_row_bytes, config.acc_row_bytes)


def dma_descriptor_layout(config):
    """The descriptor a `Dma` takes on its ``cmd`` stream (fields in bit order)."""
    return data.StructLayout({
        "dir": DmaDir,
        "space": DmaSpace,
        "to_bf16": 1,
        "relu": 1,
        "tag": 8,
        "rows": range(_max_rows(config) + 1),
        "row_bytes": range(_max_row_bytes(config) + 1),
        "chip_row": range(_max_rows(config)),
        "ext_base": config.axi_addr_bits,
        "ext_stride": config.axi_addr_bits,
    })


def dma_completion_layout(config):
    """What a `Dma` reports on its ``done`` stream: one per descriptor, in order."""
    return data.StructLayout({"error": DmaError, "tag": 8})


def pack_fields(layout, **values):
    """Python int holding `values` laid out as `layout` (see `mxu.hdl.fields`)."""
    return _pack_dict(layout, values)


def _log2(n):
    return (n - 1).bit_length()


class Dma(wiring.Component):
    """AXI4 DMA master between external memory and VMEM / the accumulator memory.

    Parameters
    ----------
    config : ChipConfig
        Data width ``axi_data_bits``, address width ``axi_addr_bits``, burst and
        outstanding limits ``dma_max_burst_beats``, ``dma_max_outstanding``, the
        range ``ext_mem_bytes``, and the on-chip memory shapes.

    Interface
    ---------
    cmd : In(stream.Signature(dma_descriptor_layout(config)))
        Descriptors; one is taken when the engine is idle.
    done : Out(stream.Signature(dma_completion_layout(config)))
        One completion per descriptor, in order, with its ``tag`` and ``error``.
    axi : Out(AXI4Signature(addr_width, data_width, id_width=1))
    vmem_read, vmem_write, acc_read, acc_write :
        Out(ReadPortSignature / WritePortSignature) to the DMA ports of `Vmem`
        and `AccMem`.
    busy : Out(1)
        A descriptor is being checked, moved or completed.
    """

    def __init__(self, config):
        self.config = config
        c = config
        super().__init__({
            "cmd": In(stream.Signature(dma_descriptor_layout(c))),
            "done": Out(stream.Signature(dma_completion_layout(c))),
            "axi": Out(AXI4Signature(addr_width=c.axi_addr_bits, data_width=c.axi_data_bits)),
            "vmem_read": Out(ReadPortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c))),
            "vmem_write": Out(WritePortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c))),
            "acc_read": Out(ReadPortSignature(_addr_shape(c.acc_rows), acc_row_layout(c))),
            "acc_write": Out(WritePortSignature(_addr_shape(c.acc_rows), acc_row_layout(c))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        # `s` carries the signals the sections share; each section takes what it
        # reads from it and puts back what later sections use.
        s = SimpleNamespace(c=c, A=c.axi_addr_bits, BB=c.axi_data_bytes, LG=_log2(c.axi_data_bytes),
                            RBV=c.vmem_row_bytes, RBA=c.acc_row_bytes, RBX=_max_row_bytes(c),
                            MAXO=c.dma_max_outstanding, axi=self.axi)
        self._descriptor(m, s)
        self._burst_generator(m, s)
        self._address_channels(m, s)
        self._responses(m, s)
        self._load_path(m, s)
        self._row_reader(m, s)
        self._gearbox(m, s)
        self._control(m, s)
        self._receive_contexts(m, s)
        return m

    def _descriptor(self, m, s):
        """The descriptor being run and its derived values."""
        A, c = s.A, s.c
        d = Signal(dma_descriptor_layout(c))
        err = Signal(DmaError)
        abort = Signal()            # stop issuing bursts (an error response arrived)
        is_load = d.dir == DmaDir.LOAD
        is_vmem = d.space == DmaSpace.VMEM
        coalesced = Signal()        # rows form one contiguous range
        last_off = Signal(A + len(d.rows))      # (rows - 1) * stride
        total = Signal(len(d.rows) + len(d.row_bytes))  # rows * row_bytes
        first_end = Signal(A + 1)   # ext_base + row_bytes: the end of the first row
        clear = Signal()            # reset the data-path state between descriptors
        # Receive contexts of loads whose data is arriving (rx[0]) or whose
        # bursts are issuing or issued (rx[1]): what the load path needs of
        # its descriptor, its bursts in flight, and its first row's addresses.
        ctx = data.StructLayout({
            "valid": 1, "issued": 1, "err": DmaError, "tag": 8, "vmem": 1, "coalesced": 1,
            "rows": len(d.rows), "row_bytes": len(d.row_bytes), "chip_row": len(d.chip_row),
            "stride": A, "bursts": range(c.dma_max_outstanding + 1),
            "a": A + 1, "end": A + 1, "na": A + 1, "nend": A + 1, "be": A + 1,
        })
        rx = [Signal(ctx, name=f"rx{k}") for k in range(2)]
        abort_err = Signal(DmaError)   # the first error response, for contexts it cuts short
        s.ctx = ctx
        s.rx = rx
        s.shift = Signal()          # rx[0] completes and rx[1] moves up
        s.abort_err = abort_err
        s.abort = abort
        s.clear = clear
        s.coalesced = coalesced
        s.d = d
        s.err = err
        s.first_end = first_end
        s.is_load = is_load
        s.is_vmem = is_vmem
        s.last_off = last_off
        s.total = total

    def _burst_generator(self, m, s):
        """Cuts the external range into AXI bursts (at most the burst length, never
        across 4 KiB)."""
        A, LG, MAXO, abort, c, d, total = s.A, s.LG, s.MAXO, s.abort, s.c, s.d, s.total
        bg_active = Signal()
        bg_x = Signal(A + 1)        # beat-aligned address of the next burst
        bg_beats = Signal(A + 1)    # beats left in the current segment (a register:
                                    # no subtract-compare chain into the burst decision)
        bg_seg = Signal(A + 1)      # start address of the current segment
        bg_left = Signal(len(d.rows))  # segments left, including the current one
        seg_len = Signal(len(total))
        inflight = Signal(range(MAXO + 1))
        to4k = Signal(13 - LG + 1)
        nbeats = Signal(9)
        m.d.comb += to4k.eq((4096 - bg_x[:12]) >> LG)
        cap4k = Mux(to4k < c.dma_max_burst_beats, to4k, c.dma_max_burst_beats)
        m.d.comb += nbeats.eq(Mux(bg_beats < cap4k, bg_beats, cap4k))
        bg_ok = Signal()            # a burst may be issued this cycle (if taken)
        bg_fire = Signal()
        m.d.comb += bg_ok.eq(bg_active & ~abort & (inflight < MAXO))
        with m.If(bg_fire):
            with m.If(cap4k >= bg_beats):       # this burst ends the segment
                with m.If(bg_left == 1):
                    m.d.sync += bg_active.eq(0)
                with m.Else():
                    nxt = bg_seg + d.ext_stride
                    m.d.sync += [bg_left.eq(bg_left - 1), bg_seg.eq(nxt),
                                 bg_x.eq(Cat(C(0, LG), nxt[LG:])),
                                 bg_beats.eq(segment_beats(nxt, seg_len, LG))]
            with m.Else():
                m.d.sync += [bg_x.eq(bg_x + (nbeats << LG)), bg_beats.eq(bg_beats - nbeats)]
        s.bg_active = bg_active
        s.bg_beats = bg_beats
        s.bg_fire = bg_fire
        s.bg_left = bg_left
        s.bg_ok = bg_ok
        s.bg_seg = bg_seg
        s.bg_x = bg_x
        s.inflight = inflight
        s.nbeats = nbeats
        s.seg_len = seg_len

    def _address_channels(self, m, s):
        """AR for loads; AW and the W-length queue for stores."""
        A, LG, MAXO, axi, bg_fire, bg_ok = s.A, s.LG, s.MAXO, s.axi, s.bg_fire, s.bg_ok
        bg_x, clear, d, is_load, nbeats = s.bg_x, s.clear, s.d, s.is_load, s.nbeats
        ar_valid = Signal()
        ar_addr = Signal(A)
        ar_len = Signal(8)
        m.d.comb += [axi.arvalid.eq(ar_valid), axi.araddr.eq(ar_addr), axi.arlen.eq(ar_len),
                     axi.arsize.eq(LG), axi.arburst.eq(AxiBurst.INCR), axi.arid.eq(0),
                     axi.arcache.eq(0b0011), axi.arprot.eq(0), axi.arlock.eq(0)]
        ar_free = ~ar_valid | axi.arready
        with m.If(axi.arvalid & axi.arready):
            m.d.sync += ar_valid.eq(0)
        # ---------------------------------------------------------------- AW / W-length queues
        m.submodules.aw_q = aw_q = ResetInserter(clear)(fifo.SyncFIFO(width=A + 8, depth=MAXO))
        m.submodules.wl_q = wl_q = ResetInserter(clear)(fifo.SyncFIFO(width=8, depth=MAXO))
        m.d.comb += [axi.awvalid.eq(aw_q.r_rdy), axi.awaddr.eq(aw_q.r_data[:A]),
                     axi.awlen.eq(aw_q.r_data[A:]), axi.awsize.eq(LG),
                     axi.awburst.eq(AxiBurst.INCR), axi.awid.eq(0), axi.awcache.eq(0b0011),
                     axi.awprot.eq(0), axi.awlock.eq(0),
                     aw_q.r_en.eq(axi.awready),
                     aw_q.w_data.eq(Cat(bg_x[:A], nbeats - 1)), wl_q.w_data.eq(nbeats - 1)]
        run = Signal()
        with m.If(is_load):
            m.d.comb += bg_fire.eq(run & bg_ok & ar_free)
            with m.If(bg_fire):
                m.d.sync += [ar_valid.eq(1), ar_addr.eq(bg_x[:A]), ar_len.eq(nbeats - 1)]
        with m.Else():
            m.d.comb += [bg_fire.eq(run & bg_ok & aw_q.w_rdy & wl_q.w_rdy),
                         aw_q.w_en.eq(bg_fire), wl_q.w_en.eq(bg_fire)]
        s.run = run
        s.wl_q = wl_q

    def _responses(self, m, s):
        """R and B responses: bursts in flight, and the first error."""
        abort, axi, bg_fire, d, err, inflight = s.abort, s.axi, s.bg_fire, s.d, s.err, s.inflight
        is_load = s.is_load
        r_fire = axi.rvalid & axi.rready
        b_fire = axi.bvalid & axi.bready
        m.d.comb += axi.bready.eq(1)
        # R beats are a load's (a store takes no R), B responses a store's: the
        # receive contexts may still hold loads while a store runs.
        done_burst = (r_fire & axi.rlast) | b_fire
        m.d.sync += inflight.eq(inflight + bg_fire - done_burst)
        s.r_last = r_fire & axi.rlast
        resp = Mux(r_fire, axi.rresp, axi.bresp)
        resp_fire = r_fire | b_fire
        is_load = r_fire
        code = Mux(resp[0], DmaError.DECERR, DmaError.SLVERR)
        s.r_error = Signal()           # an error response of a load's beat (its rx[0])
        s.r_code = code
        with m.If(resp_fire & resp[1]):
            m.d.sync += abort.eq(1)
            with m.If(s.abort_err == DmaError.OK):
                m.d.sync += s.abort_err.eq(code)
            with m.If(is_load):
                m.d.comb += s.r_error.eq(1)
            with m.Elif(err == DmaError.OK):
                m.d.sync += err.eq(code)
        # rx[0] counts a burst's last beat and takes an error a cycle after
        # the beat: R handshakes wait on the load path's row-end comparison,
        # and that chain into the receive context was the fpga chip's
        # critical path (docs/synth.md). `_receive_contexts` reads the
        # registered pair as part of rx[0].
        s.r_last_q, s.r_error_q, s.r_code_q = Signal(), Signal(), Signal.like(code)
        m.d.sync += [s.r_last_q.eq(s.r_last), s.r_error_q.eq(s.r_error), s.r_code_q.eq(code)]

    def _load_path(self, m, s):
        """Load: R beats gathered and shifted into on-chip rows.

        Every address the beat decision compares is a register: the current
        beat's end, the current row's end, the next row's start and end (each
        advanced by one add when a row ends). The decision is then three
        register compares in parallel instead of two chained adds and a compare
        from the descriptor (docs/synth.md, "Timing")."""
        A, BB, LG, RBA, RBV, RBX, axi = s.A, s.BB, s.LG, s.RBA, s.RBV, s.RBX, s.axi
        d, rx0 = s.d, s.rx[0]
        # The load path works for the receive context rx[0]; R beats go to it
        # while it has bursts in flight (later beats are the next context's).
        coalesced, is_vmem = rx0.coalesced, rx0.vmem
        run = rx0.valid & (rx0.bursts != s.r_last_q)     # bursts still to come
        is_load = 1
        nslot = -(-(BB - 2 + RBX) // BB)
        slots = [Signal(8 * BB, name=f"ld_slot{i}") for i in range(nslot)]
        ld_k = Signal(range(nslot))
        ld_r = Signal(len(d.rows))         # rows finished
        ld_more = Signal()                 # ld_r + 1 < rows: a row follows the current one
        ld_a = Signal(A + 1)               # external address of the current row
        ld_end = Signal(A + 1)             # ... and its end
        ld_na = Signal(A + 1)              # the next row's address (ld_a + ext_stride)
        ld_nend = Signal(A + 1)            # ... and its end (ld_end + ext_stride)
        ld_be = Signal(A + 1)              # end of the next beat (its address + BB)
        out_valid = Signal()
        out_addr = Signal(len(d.chip_row))
        out_data = Signal(8 * RBX)
        out_ready = Mux(is_vmem, self.vmem_write.ready, self.acc_write.ready)
        m.d.comb += [
            self.vmem_write.valid.eq(out_valid & is_vmem),
            self.vmem_write.payload.addr.eq(out_addr),
            self.vmem_write.payload.data.eq(out_data[:8 * RBV]),
            self.acc_write.valid.eq(out_valid & ~is_vmem),
            self.acc_write.payload.addr.eq(out_addr),
            self.acc_write.payload.data.eq(out_data[:8 * RBA]),
        ]
        can_emit = ~out_valid | out_ready
        s.out_written = out_valid & out_ready
        ends = Signal()
        shared = Signal()
        next_ends_here = Signal()
        m.d.comb += [
            ends.eq(ld_be >= ld_end),
            shared.eq(coalesced & ld_more & (ld_na < ld_be)),
            next_ends_here.eq(ld_be >= ld_nend),
        ]
        hold = ends & shared & next_ends_here
        m.d.comb += axi.rready.eq(run & is_load & (~ends | can_emit) & ~hold)
        process = run & is_load & axi.rvalid & (~ends | can_emit)
        gathered = Cat(*[Mux(ld_k == i, axi.rdata, slots[i]) for i in range(nslot)])
        shifted = Signal(8 * RBX)
        m.d.comb += shifted.eq(gathered >> Cat(C(0, 3), ld_a[:LG]))
        row_mask = Cat(*[(C(j, 8) < rx0.row_bytes).replicate(8) for j in range(RBX)])
        s.store_row_mask = Cat(*[(C(j, 8) < d.row_bytes).replicate(8) for j in range(RBX)])
        with m.If(out_valid & out_ready):
            m.d.sync += out_valid.eq(0)
        with m.If(process):
            with m.Switch(ld_k):
                for i in range(nslot):
                    with m.Case(i):
                        m.d.sync += slots[i].eq(axi.rdata)
            with m.If(ends):
                m.d.sync += [out_valid.eq(1), out_data.eq(shifted & row_mask),
                             out_addr.eq(rx0.chip_row + ld_r),
                             ld_r.eq(ld_r + 1), ld_more.eq(ld_r + 2 < rx0.rows),
                             ld_a.eq(ld_na), ld_end.eq(ld_nend),
                             ld_na.eq(ld_na + rx0.stride), ld_nend.eq(ld_nend + rx0.stride)]
                with m.If(hold):
                    m.d.sync += ld_k.eq(0)
                with m.Elif(shared):
                    m.d.sync += [slots[0].eq(axi.rdata), ld_k.eq(1), ld_be.eq(ld_be + BB)]
                with m.Else():
                    m.d.sync += [ld_k.eq(0),
                                 ld_be.eq(Mux(coalesced, ld_be + BB,
                                              Cat(C(0, LG), ld_na[LG:] + 1)))]
            with m.Else():
                m.d.sync += [ld_k.eq(ld_k + 1), ld_be.eq(ld_be + BB)]
        s.ld_a = ld_a
        s.ld_be = ld_be
        s.ld_end = ld_end
        s.ld_k = ld_k
        s.ld_more = ld_more
        s.ld_na = ld_na
        s.ld_nend = ld_nend
        s.ld_r = ld_r
        s.out_valid = out_valid
        s.row_mask = s.store_row_mask

    def _row_reader(self, m, s):
        """Store: on-chip rows read, through ReLU and fp32 -> bf16."""
        A, BB, LG, RBA, RBV, RBX, c, clear = s.A, s.BB, s.LG, s.RBA, s.RBV, s.RBX, s.c, s.clear
        coalesced, d, is_load, is_vmem, run = s.coalesced, s.d, s.is_load, s.is_vmem, s.run
        DEPTH = 4
        meta = data.StructLayout({"first": 1, "last": 1, "off": range(BB)})
        rd_width = max(8 * RBV, 8 * RBA)
        m.submodules.rd_q = rd_q = ResetInserter(clear)(
            fifo.SyncFIFO(width=rd_width + meta.size, depth=DEPTH))
        rd_r = Signal(len(d.rows))          # rows requested
        rd_a = Signal(A + 1)                # external address of row rd_r
        rd_pending = Signal()               # a response arrives next cycle
        rd_meta = Signal(meta)
        rd_req = Signal()
        m.d.comb += rd_req.eq(run & ~is_load & (rd_r < d.rows)
                              & (rd_q.level + rd_pending < DEPTH))
        m.d.comb += [
            self.vmem_read.req.valid.eq(rd_req & is_vmem),
            self.vmem_read.req.payload.eq(d.chip_row + rd_r),
            self.acc_read.req.valid.eq(rd_req & ~is_vmem),
            self.acc_read.req.payload.eq(d.chip_row + rd_r),
        ]
        rd_fire = rd_req & Mux(is_vmem, self.vmem_read.req.ready, self.acc_read.req.ready)
        # A request is held until taken, even when an error response stops the
        # store (stream rule; docs/formal.md).
        s.rd_waiting = rd_req & ~rd_fire
        m.d.sync += rd_pending.eq(rd_fire & ~clear)
        with m.If(rd_fire):
            m.d.sync += [rd_r.eq(rd_r + 1), rd_a.eq(rd_a + d.ext_stride),
                         rd_meta.first.eq(~coalesced | (rd_r == 0)),
                         rd_meta.last.eq(~coalesced | (rd_r + 1 == d.rows)),
                         rd_meta.off.eq(rd_a[:LG])]
        resp_data = Mux(is_vmem, self.vmem_read.resp.payload.as_value(),
                        self.acc_read.resp.payload.as_value())
        m.d.comb += [rd_q.w_en.eq(self.vmem_read.resp.valid | self.acc_read.resp.valid),
                     rd_q.w_data.eq(Cat(resp_data, rd_meta))]

        # ReLU and fp32 -> bf16 on the queue's output.
        q_row = rd_q.r_data[:rd_width]
        q_meta = Signal(meta)
        m.d.comb += q_meta.eq(rd_q.r_data[rd_width:])
        row_bytes_out = Signal(8 * RBX)
        vmem_elems = []
        for e in range(c.vmem_row_elems):
            x = q_row[16 * e:16 * e + 16]
            neg = x[15] & ~((x[7:15] == 0xFF) & (x[:7] != 0))
            vmem_elems.append(Mux(d.relu & neg, 0, x))
        acc_f32, acc_b16 = [], []
        for e in range(c.cols):
            x = q_row[32 * e:32 * e + 32]
            neg = x[31] & ~((x[23:31] == 0xFF) & (x[:23] != 0))
            y = Signal(32, name=f"relu{e}")
            m.d.comb += y.eq(Mux(d.relu & neg, 0, x))
            conv = Fp32ToBf16()
            m.submodules[f"to_bf16_{e}"] = conv
            m.d.comb += conv.x.as_value().eq(y)
            acc_f32.append(y)
            acc_b16.append(conv.y.as_value())
        with m.If(is_vmem):
            m.d.comb += row_bytes_out.eq(Cat(*vmem_elems))
        with m.Elif(d.to_bf16):
            m.d.comb += row_bytes_out.eq(Cat(*acc_b16))
        with m.Else():
            m.d.comb += row_bytes_out.eq(Cat(*acc_f32))
        s.q_meta = q_meta
        s.rd_a = rd_a
        s.rd_q = rd_q
        s.rd_r = rd_r
        s.row_bytes_out = row_bytes_out

    def _gearbox(self, m, s):
        """Store: rows packed into W beats with strobes."""
        BB, RBX, axi, d, is_load, q_meta = s.BB, s.RBX, s.axi, s.d, s.is_load, s.q_meta
        rd_q, row_bytes_out, row_mask, run = s.rd_q, s.row_bytes_out, s.row_mask, s.run
        wl_q = s.wl_q
        CAP = BB + RBX
        gb_data = Signal(8 * CAP)
        gb_strb = Signal(CAP)
        gb_n = Signal(range(CAP + 1))
        gb_flush = Signal()
        beat_valid = (gb_n >= BB) | (gb_flush & (gb_n != 0))
        w_beat = Signal(8)
        m.d.comb += [axi.wvalid.eq(run & ~is_load & beat_valid & wl_q.r_rdy),
                     axi.wdata.eq(gb_data[:8 * BB]), axi.wstrb.eq(gb_strb[:BB]),
                     axi.wlast.eq(w_beat == wl_q.r_data)]
        w_fire = axi.wvalid & axi.wready
        m.d.comb += wl_q.r_en.eq(w_fire & axi.wlast)
        with m.If(w_fire):
            m.d.sync += w_beat.eq(Mux(axi.wlast, 0, w_beat + 1))
        n1 = Signal.like(gb_n)
        data1 = Signal.like(gb_data)
        strb1 = Signal.like(gb_strb)
        flush1 = Signal()
        m.d.comb += [n1.eq(gb_n), data1.eq(gb_data), strb1.eq(gb_strb), flush1.eq(gb_flush)]
        with m.If(w_fire):
            m.d.comb += [n1.eq(Mux(BB < gb_n, gb_n - BB, 0)), data1.eq(gb_data >> (8 * BB)),
                         strb1.eq(gb_strb >> BB)]
            with m.If(BB >= gb_n):
                m.d.comb += flush1.eq(0)
        pos = Signal(range(CAP + 1))
        m.d.comb += pos.eq(Mux(q_meta.first, q_meta.off, n1))
        accept = run & ~is_load & rd_q.r_rdy & ~flush1 & (CAP >= pos + d.row_bytes)
        m.d.comb += rd_q.r_en.eq(accept)
        L_mask = Cat(*[C(j, 8) < d.row_bytes for j in range(RBX)])
        with m.If(accept):
            m.d.sync += [gb_data.eq(data1 | ((row_bytes_out & row_mask) << Cat(C(0, 3), pos))),
                         gb_strb.eq(strb1 | (L_mask << pos)),
                         gb_n.eq(pos + d.row_bytes), gb_flush.eq(q_meta.last)]
        with m.Else():
            m.d.sync += [gb_data.eq(data1), gb_strb.eq(strb1), gb_n.eq(n1), gb_flush.eq(flush1)]
        s.gb_data = gb_data
        s.gb_flush = gb_flush
        s.gb_n = gb_n
        s.gb_strb = gb_strb
        s.w_beat = w_beat

    def _control(self, m, s):
        """The descriptor's checks and the run state machine.

        (Comparisons throughout are written as ``<`` and ``>=``: Yosys maps
        ``a > b`` and ``a <= b`` to a carry chain plus an equality tree, the
        other two to the chain alone; docs/synth.md.)"""
        A, LG, RBA, RBV, RBX, abort = s.A, s.LG, s.RBA, s.RBV, s.RBX, s.abort
        bg_active, bg_beats, bg_fire, bg_left = s.bg_active, s.bg_beats, s.bg_fire, s.bg_left
        bg_seg, bg_x, c, clear, coalesced, d = s.bg_seg, s.bg_x, s.c, s.clear, s.coalesced, s.d
        err, gb_data, gb_flush, gb_n, gb_strb = s.err, s.gb_data, s.gb_flush, s.gb_n, s.gb_strb
        inflight, is_load, is_vmem, last_off = s.inflight, s.is_load, s.is_vmem, s.last_off
        ld_a, ld_be, ld_end, ld_k, ld_r = s.ld_a, s.ld_be, s.ld_end, s.ld_k, s.ld_r
        ld_more, ld_na, ld_nend = s.ld_more, s.ld_na, s.ld_nend
        out_valid, rd_a, rd_r, run, seg_len = s.out_valid, s.rd_a, s.rd_r, s.run, s.seg_len
        total, w_beat, rd_waiting = s.total, s.w_beat, s.rd_waiting
        chip_rows = Mux(is_vmem, c.vmem_rows, c.acc_rows)
        limit = Signal(range(RBX + 1))
        with m.If(is_vmem):
            m.d.comb += limit.eq(RBV)
        with m.Elif(is_load | ~d.to_bf16):
            m.d.comb += limit.eq(RBA)
        with m.Else():
            m.d.comb += limit.eq(RBA // 2)
        four = ~is_vmem & ~d.to_bf16    # fp32 rows: 4-byte alignment
        misaligned = ((d.ext_base | d.ext_stride | d.row_bytes)[0]
                      | (four & (d.ext_base | d.ext_stride | d.row_bytes)[1]))
        empty = (d.rows == 0) | (d.row_bytes == 0)
        first_end = s.first_end
        ext_end = Signal(A + len(d.rows) + 2)
        m.d.comb += ext_end.eq(first_end + last_off)

        rx0, rx1 = s.rx
        # A descriptor that does not receive data waits until no load does, so
        # that completions stay in order.
        s.alloc = alloc = Signal()      # DECIDE gives a receive context to this load
        s.issued = issued = Signal()    # RUN: the issuing load's bursts are all out
        s.fsm_done = fsm_done = Signal()
        bad = Signal()
        m.d.comb += bad.eq((is_load & (d.to_bf16 | d.relu)) | (is_vmem & d.to_bf16)
                           | (d.row_bytes > limit) | misaligned
                           | (d.chip_row + d.rows > chip_rows) | empty
                           | (ext_end > c.ext_mem_bytes))
        with m.FSM():
            with m.State("IDLE"):
                # After an error response, nothing new until the loads in flight drain.
                m.d.comb += self.cmd.ready.eq(~abort | ~rx0.valid)
                with m.If(self.cmd.valid & self.cmd.ready):
                    m.d.sync += [d.eq(self.cmd.payload), err.eq(DmaError.OK), abort.eq(0),
                                 s.abort_err.eq(DmaError.OK)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [last_off.eq(Mux(d.rows == 0, 0, (d.rows - 1)[:len(d.rows)]
                                             * d.ext_stride)),
                             total.eq(d.rows * d.row_bytes),
                             first_end.eq(d.ext_base + d.row_bytes),
                             coalesced.eq((d.ext_stride == d.row_bytes) | (d.rows == 1))]
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.comb += self.busy.eq(1)
                with m.If(rx0.valid & (bad | ~is_load)):
                    pass                  # wait for the loads in flight
                with m.Elif((is_load & (d.to_bf16 | d.relu)) | (is_vmem & d.to_bf16)):
                    m.d.sync += err.eq(DmaError.BAD_OPTION)
                    m.next = "COMPLETE"
                with m.Elif(limit < d.row_bytes):
                    m.d.sync += err.eq(DmaError.ROW_BYTES)
                    m.next = "COMPLETE"
                with m.Elif(misaligned):
                    m.d.sync += err.eq(DmaError.MISALIGNED)
                    m.next = "COMPLETE"
                with m.Elif(chip_rows < d.chip_row + d.rows):
                    m.d.sync += err.eq(DmaError.CHIP_RANGE)
                    m.next = "COMPLETE"
                with m.Elif(empty):
                    m.next = "COMPLETE"
                with m.Elif(ext_end >= c.ext_mem_bytes + 1):
                    m.d.sync += err.eq(DmaError.EXT_RANGE)
                    m.next = "COMPLETE"
                with m.Elif(~is_load | ~rx1.valid & ~s.shift & (~abort | ~rx0.valid)):
                    # (After an error response, a load accepted meanwhile starts
                    # afresh once the loads before it have drained.)
                    sl = Mux(coalesced, total, d.row_bytes)
                    m.d.comb += alloc.eq(is_load)
                    m.d.sync += [
                        abort.eq(abort & rx0.valid),
                        s.abort_err.eq(Mux(abort & rx0.valid, s.abort_err, DmaError.OK)),
                        seg_len.eq(sl),
                        bg_active.eq(1), bg_seg.eq(d.ext_base),
                        bg_x.eq(Cat(C(0, LG), d.ext_base[LG:])),
                        bg_beats.eq(segment_beats(d.ext_base, sl, LG)),
                        bg_left.eq(Mux(coalesced, 1, d.rows)),
                        rd_r.eq(0), rd_a.eq(d.ext_base),
                    ]
                    with m.If(is_load & ~rx0.valid):
                        # The load path is free: it takes this load's first row now.
                        m.d.sync += [
                            ld_r.eq(0), ld_more.eq(d.rows >= 2), ld_a.eq(d.ext_base),
                            ld_end.eq(first_end), ld_na.eq(d.ext_base + d.ext_stride),
                            ld_nend.eq(first_end + d.ext_stride),
                            ld_be.eq(Cat(C(0, LG), d.ext_base[LG:] + 1)), ld_k.eq(0),
                        ]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += [self.busy.eq(1), run.eq(1)]
                with m.If(is_load):
                    # Its bursts are out: the receive context completes it, and
                    # the next descriptor may issue meanwhile.
                    with m.If((~bg_active | abort) & ~bg_fire):
                        m.d.comb += issued.eq(1)
                        m.d.sync += bg_active.eq(0)
                        m.next = "IDLE"
                with m.Elif((~bg_active | abort) & (inflight == 0) & ~bg_fire & ~rd_waiting):
                    m.next = "COMPLETE"
            with m.State("COMPLETE"):
                m.d.comb += [self.busy.eq(1), fsm_done.eq(1), clear.eq(1)]
                m.d.sync += [bg_active.eq(0), gb_n.eq(0), gb_flush.eq(0), gb_data.eq(0),
                             gb_strb.eq(0), w_beat.eq(0), out_valid.eq(0)]
                with m.If(self.done.ready):
                    m.next = "IDLE"

    def _receive_contexts(self, m, s):
        """The loads in flight: rx[0] receives its data, rx[1] (if any) has
        issued its bursts or is issuing them. A context completes once its
        bursts are all back and its last row written; rx[1] then moves up and
        the load path takes its first row. Completions, of these and of the
        descriptors the state machine completes itself, leave in order."""
        rx0, rx1 = s.rx
        d, LG = s.d, s.LG
        done0 = Signal()
        # Complete in the cycle the last row is written (the token it frees is
        # pushed a cycle later, when the row is in the memory).
        # rx[0] with its last cycle's R beat (`r_last_q`, `r_error_q`).
        err0 = Mux(rx0.err != DmaError.OK, rx0.err,
                   Mux(s.r_error_q, s.r_code_q, DmaError.OK))
        m.d.comb += done0.eq(rx0.valid & rx0.issued & (rx0.bursts == s.r_last_q)
                             & (~s.out_valid | s.out_written))
        short = s.ld_r != rx0.rows
        m.d.comb += [
            self.done.valid.eq(done0 | s.fsm_done),
            self.done.payload.tag.eq(Mux(done0, rx0.tag, d.tag)),
            self.done.payload.error.eq(
                Mux(done0, Mux(err0 != DmaError.OK, err0,
                               Mux(s.abort & short, s.abort_err, DmaError.OK)), s.err)),
        ]
        with m.If(rx0.valid):
            m.d.comb += self.busy.eq(1)
        m.d.comb += s.shift.eq(done0 & self.done.ready)
        # Updates of this cycle, then the move up.
        n0, n1 = Signal.like(rx0), Signal.like(rx1)
        m.d.comb += [n0.eq(rx0), n1.eq(rx1)]
        issuing_1 = rx1.valid
        inc = s.bg_fire & (d.dir == DmaDir.LOAD)
        with m.If(issuing_1):
            m.d.comb += [n1.bursts.eq(rx1.bursts + inc), n0.bursts.eq(rx0.bursts - s.r_last_q)]
            with m.If(s.issued):
                m.d.comb += n1.issued.eq(1)
        with m.Else():
            m.d.comb += n0.bursts.eq(rx0.bursts + inc - s.r_last_q)
            with m.If(s.issued):
                m.d.comb += n0.issued.eq(1)
        m.d.comb += n0.err.eq(err0)
        new = Signal.like(rx0)
        m.d.comb += [
            new.valid.eq(1), new.issued.eq(0), new.err.eq(DmaError.OK), new.tag.eq(d.tag),
            new.vmem.eq(d.space == DmaSpace.VMEM), new.coalesced.eq(s.coalesced),
            new.rows.eq(d.rows), new.row_bytes.eq(d.row_bytes), new.chip_row.eq(d.chip_row),
            new.stride.eq(d.ext_stride), new.bursts.eq(0),
            new.a.eq(d.ext_base), new.end.eq(s.first_end), new.na.eq(d.ext_base + d.ext_stride),
            new.nend.eq(s.first_end + d.ext_stride), new.be.eq(Cat(C(0, LG), d.ext_base[LG:] + 1)),
        ]
        with m.If(s.alloc):
            with m.If(~rx0.valid):
                m.d.comb += n0.eq(new)
            with m.Else():
                m.d.comb += n1.eq(new)
        with m.If(s.shift):
            m.d.sync += [rx0.eq(n1), rx1.eq(0),
                         # The load path takes the next context's first row.
                         s.ld_r.eq(0), s.ld_more.eq(n1.rows > 1), s.ld_a.eq(n1.a),
                         s.ld_end.eq(n1.end), s.ld_na.eq(n1.na), s.ld_nend.eq(n1.nend),
                         s.ld_be.eq(n1.be), s.ld_k.eq(0)]
        with m.Else():
            m.d.sync += [rx0.eq(n0), rx1.eq(n1)]


class DmaSystem(wiring.Component):
    """`Dma` + `Vmem` + `AccMem`, wired as in the chip, with the array's memory
    ports brought out: the top that DMA testbenches and the native DMA runner
    simulate (``sim/dma.py``).

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    cmd, done, axi : as `Dma`.
    vmem_rd, vmem_rd_data : In(stream.Signature(vmem addr)), Out(stream.Signature(vmem row))
        The array's VMEM read port: requests (``ready`` always 1) and, one cycle
        later, the row (its ``ready`` is ignored: responses cannot be refused).
        Plain streams, because a top-level port cannot be a constant.
    acc_rd, acc_rd_data : the same for the array's accumulator seed port.
    acc_wr : In(stream.Signature(RowWrite(acc addr, acc row)))
        The array's result write port (``ready`` is always 1).
    busy : Out(1)
    """

    def __init__(self, config):
        self.config = config
        c = config
        va, aa = _addr_shape(c.vmem_rows), _addr_shape(c.acc_rows)
        super().__init__({
            "cmd": In(stream.Signature(dma_descriptor_layout(c))),
            "done": Out(stream.Signature(dma_completion_layout(c))),
            "axi": Out(AXI4Signature(addr_width=c.axi_addr_bits, data_width=c.axi_data_bits)),
            "vmem_rd": In(stream.Signature(va)),
            "vmem_rd_data": Out(stream.Signature(vmem_row_layout(c))),
            "acc_rd": In(stream.Signature(aa)),
            "acc_rd_data": Out(stream.Signature(acc_row_layout(c))),
            "acc_wr": In(WritePortSignature(aa, acc_row_layout(c))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = Dma(self.config)
        m.submodules.vmem = vmem = Vmem(self.config)
        m.submodules.acc = acc = AccMem(self.config)
        wiring.connect(m, dma.vmem_read, vmem.dma_read)
        wiring.connect(m, dma.vmem_write, vmem.dma_write)
        wiring.connect(m, dma.acc_read, acc.dma_read)
        wiring.connect(m, dma.acc_write, acc.dma_write)
        wiring.connect(m, wiring.flipped(self.axi), dma.axi)
        wiring.connect(m, wiring.flipped(self.cmd), dma.cmd)
        wiring.connect(m, wiring.flipped(self.done), dma.done)
        m.d.comb += self.busy.eq(dma.busy)
        for req, resp, inner in ((self.vmem_rd, self.vmem_rd_data, vmem.array_read),
                                 (self.acc_rd, self.acc_rd_data, acc.array_read)):
            m.d.comb += [inner.req.valid.eq(req.valid), inner.req.payload.eq(req.payload),
                         req.ready.eq(1), resp.valid.eq(inner.resp.valid),
                         resp.payload.eq(inner.resp.payload)]
        m.d.comb += [acc.array_write.valid.eq(self.acc_wr.valid),
                     acc.array_write.payload.eq(self.acc_wr.payload), self.acc_wr.ready.eq(1)]
        return m
