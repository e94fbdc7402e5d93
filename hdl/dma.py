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
  keep the read channel busy; completions stay in order. Quantized loads
  (through the weight expander) overlap the same way. A descriptor that is
  not a load with data (a store, an illegal or empty one), or a load of the
  other kind (plain, quantized), waits until no load is receiving.
* Errors: illegal descriptors complete at once with an error code and no bus
  traffic. An error response (SLVERR/DECERR) stops the issue of new bursts; the
  bursts already issued are completed (all their beats and responses taken), so
  the bus is left clean, then the descriptor completes with the error code.
"""

from amaranth.hdl import C, Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from .accmem import AccMem, acc_row_layout
from .axi import AXI4Signature, AxiBurst, segment_beats
from .fields import unpack_fields
from .fields import pack_fields as _pack_dict
from .numerics import Fp32ToBf16
from .expander import Expander
from .fifo import Fifo
from .slice import RegisterSlice
from .quant import QUANT_INFO, QuantFormat, tile_block_bytes
from .vmem import (ReadPortSignature, RowWrite, Vmem, WritePortSignature, _addr_shape,
                   lane_port_names, vmem_row_layout)

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
        # (A quantized load's row is a tile-block: docs/memory.md.)
        "row_bytes": range(max([_max_row_bytes(config)]
                               + [tile_block_bytes(QuantFormat[f], config.cols)
                                  for f in config.quant_formats]) + 1),
        "chip_row": range(_max_rows(config)),
        "ext_base": config.axi_addr_bits,
        "ext_stride": config.axi_addr_bits,
        # SEND/RECV (chips with links): ext_base is a link's address window
        # (docs/pod.md), checked against that window instead of external memory.
        **({"link": 1} if config.links else {}),
        # A quantized LOAD (chips with the expander, docs/memory.md).
        **({"format": QuantFormat} if config.quant_formats else {}),
    })


def dma_completion_layout(config):
    """What a `Dma` reports on its ``done`` stream: one per descriptor, in order."""
    return data.StructLayout({"error": DmaError, "tag": 8})


def pack_fields(layout, **values):
    """Python int holding `values` laid out as `layout` (see `mxu.hdl.fields`)."""
    return _pack_dict(layout, values)


def _log2(n):
    return (n - 1).bit_length()


def _context_layout(c):
    """A receive context: a load whose data is arriving (rx[0]) or whose bursts
    are issuing or issued (rx[1]): what the load path needs of its descriptor,
    its bursts in flight, and its first row's addresses."""
    desc, A = dma_descriptor_layout(c), c.axi_addr_bits
    return data.StructLayout({
        "valid": 1, "issued": 1, "err": DmaError, "tag": 8, "vmem": 1, "coalesced": 1,
        "rows": desc["rows"].width, "row_bytes": desc["row_bytes"].width,
        "chip_row": desc["chip_row"].width,
        "stride": A, "bursts": range(c.dma_max_outstanding + 1),
        "a": A + 1, "end": A + 1, "na": A + 1, "nend": A + 1, "be": A + 1,
        # A quantized load (chips with the expander): its format and its R beats.
        **({"quant": 1, "format": QuantFormat,
            "beats": desc["rows"].width + desc["row_bytes"].width}
           if c.quant_formats else {}),
    })


def _derived_layout(c):
    """The descriptor's values that the checks and the sections derive from it
    (`Dma`'s ``derived`` register, set in CHECK)."""
    desc, A = dma_descriptor_layout(c), c.axi_addr_bits
    return data.StructLayout({
        "coalesced": 1,                                         # the rows are one range
        "last_off": A + desc["rows"].width,                     # (rows - 1) * stride
        "total": desc["rows"].width + desc["row_bytes"].width,  # rows * row_bytes
        "first_end": A + 1,                                     # the first row's end
        # The range's room past the first row: the limit of last_off.
        "room": signed(A + 2),
    })


def _burst_setup_layout(c):
    desc = dma_descriptor_layout(c)
    return data.StructLayout({"base": c.axi_addr_bits,
                              "seg_len": desc["rows"].width + desc["row_bytes"].width,
                              "segments": desc["rows"].width})


def _store_row_layout(c):
    return data.StructLayout({"data": 8 * _max_row_bytes(c), "first": 1, "last": 1,
                              "off": range(c.axi_data_bytes)})


def _byte_mask(n_bytes, length, bits_per_byte):
    """``bits_per_byte`` ones for each byte below ``length``, of ``n_bytes``
    (`bits_per_byte` a power of two).

    Written as ones shifted right by the bytes above the mask: every bit is the
    same function of `length` as a comparison per byte, but the Verilated
    model computes it in a few operations per 32-bit word, where a comparison,
    replication and concatenation per byte cost about ten times as many, every
    cycle (docs/simulation.md)."""
    bits = n_bytes.bit_length()
    above = Mux(length < n_bytes, (C(n_bytes, bits) - length)[:bits], 0)
    width = n_bytes * bits_per_byte
    return C((1 << width) - 1, width) >> (above << (bits_per_byte.bit_length() - 1))


class _BurstGenerator(wiring.Component):
    """Cuts a descriptor's external range into AXI bursts: at most
    ``dma_max_burst_beats`` beats, never across 4 KiB, at most
    ``dma_max_outstanding`` in flight.

    The range is ``segments`` segments of ``seg_len`` bytes, the first at
    ``base`` and each ``stride`` bytes after the one before (one segment when
    the rows are contiguous).

    Interface
    ---------
    start : In(1)
        Begin a range (not while ``active``): ``setup`` is taken.
    setup : In({base, seg_len, segments})
    stride : In(addr_bits)
        The descriptor's ``ext_stride``, held while ``active``.
    enable : In(1)
        Bursts may be offered: the DMA runs the descriptor.
    abort : In(1)
        No new burst: an error response has arrived.
    stop : In(1)
        End the range: its bursts are out, or its descriptor completes.
    burst : Out(stream.Signature({addr, len}))
        The next burst: its first beat's byte address and its AxLEN.
    returned : In(1)
        A burst in flight completed (its last R beat or its B response).
    active : Out(1)
        Bursts of the range are still to be offered.
    inflight : Out(range(dma_max_outstanding + 1))
    """

    def __init__(self, config):
        self.config = config
        c = config
        super().__init__({
            "start": In(1), "setup": In(_burst_setup_layout(c)), "stride": In(c.axi_addr_bits),
            "enable": In(1), "abort": In(1), "stop": In(1),
            "burst": Out(stream.Signature(data.StructLayout({"addr": c.axi_addr_bits, "len": 8}))),
            "returned": In(1), "active": Out(1), "inflight": Out(range(c.dma_max_outstanding + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        A, LG, MAXO = c.axi_addr_bits, _log2(c.axi_data_bytes), c.dma_max_outstanding
        x = Signal(A + 1)           # beat-aligned address of the next burst
        beats = Signal(A + 1)       # beats left in the current segment (a register:
                                    # no subtract-compare chain into the burst decision)
        seg = Signal(A + 1)         # start address of the current segment
        left = Signal.like(self.setup.segments)   # segments left, the current one included
        seg_len = Signal.like(self.setup.seg_len)
        to4k = Signal(13 - LG + 1)
        nbeats = Signal(9)
        m.d.comb += to4k.eq((4096 - x[:12]) >> LG)
        cap4k = Mux(to4k < c.dma_max_burst_beats, to4k, c.dma_max_burst_beats)
        m.d.comb += [
            nbeats.eq(Mux(beats < cap4k, beats, cap4k)),
            self.burst.valid.eq(self.enable & self.active & ~self.abort & (self.inflight < MAXO)),
            self.burst.payload.addr.eq(x[:A]), self.burst.payload.len.eq(nbeats - 1),
        ]
        fire = self.burst.valid & self.burst.ready
        m.d.sync += self.inflight.eq(self.inflight + fire - self.returned)
        with m.If(fire):
            with m.If(cap4k >= beats):          # this burst ends the segment
                with m.If(left == 1):
                    m.d.sync += self.active.eq(0)
                with m.Else():
                    nxt = seg + self.stride
                    m.d.sync += [left.eq(left - 1), seg.eq(nxt), x.eq(Cat(C(0, LG), nxt[LG:])),
                                 beats.eq(segment_beats(nxt, seg_len, LG))]
            with m.Else():
                m.d.sync += [x.eq(x + (nbeats << LG)), beats.eq(beats - nbeats)]
        with m.If(self.start):
            base = self.setup.base
            m.d.sync += [self.active.eq(1), seg.eq(base), x.eq(Cat(C(0, LG), base[LG:])),
                         beats.eq(segment_beats(base, self.setup.seg_len, LG)),
                         left.eq(self.setup.segments), seg_len.eq(self.setup.seg_len)]
        with m.If(self.stop):
            m.d.sync += self.active.eq(0)
        return m


class _LoadPath(wiring.Component):
    """Load: R beats gathered and shifted into on-chip rows, for the receive
    context it took last (at ``restart``: its own copy of the context's
    fields). It can take the next context in the cycle it takes the last beat
    of this one, so that back-to-back loads receive without a gap while the
    receive contexts complete the one that ended (docs/memory.md).

    Every address the beat decision compares is a register: the current
    beat's end, the current row's end, the next row's start and end (each
    advanced by one add when a row ends). The decision is then three
    register compares in parallel instead of two chained adds and a compare
    from the descriptor (docs/synth.md, "Timing"). The first of them, "this
    beat ends the row", is itself a register (``ends``, always ``ld_be >=
    ld_end``), computed from the addresses' next values: the row's end leads
    `last`, and through it the next context's restart, whose muxes load
    every address (docs/synth.md, "The `fpga-llm` chip").

    Interface
    ---------
    beats : In(stream.Signature(axi_data_bits))
        The R channel's data.
    receiving : In(1)
        The context taken last has bursts still to come: the R beats are its.
    restart : In(1)
        Take ``first``: its rows, row bytes, first on-chip row, stride,
        contiguity, memory and its first row's addresses.
    first : In(context)
    clear : In(1)
        Drop a row not yet written (between descriptors).
    hold_rows : In(1)
        End no row: the last context's completion waits for its last row,
        which must stay the only row offered until it completes.
    row : Out(stream.Signature(RowWrite(chip row, max row bytes) and ``vmem``))
        The context's rows, zero past ``row_bytes``, in order, each with the
        memory it goes to.
    rows_done : Out(rows)
        Rows of the context gathered.
    last : Out(1)
        The context's last row is gathered in this cycle.
    """

    def __init__(self, config):
        self.config = config
        c = config
        ctx = _context_layout(c)
        row = data.StructLayout({**RowWrite(ctx["chip_row"].width, 8 * _max_row_bytes(c)).members,
                                 "vmem": 1})
        super().__init__({
            "beats": In(stream.Signature(c.axi_data_bits)), "receiving": In(1),
            "restart": In(1), "first": In(ctx), "clear": In(1), "hold_rows": In(1),
            "row": Out(stream.Signature(row)), "rows_done": Out(ctx["rows"].width),
            "last": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        BB, LG, RBX = c.axi_data_bytes, _log2(c.axi_data_bytes), _max_row_bytes(c)
        A, beat, row = c.axi_addr_bits, self.beats, self.row
        ctx = Signal(_context_layout(c))   # the context's fields, taken at restart
        nslot = -(-(BB - 2 + RBX) // BB)
        slots = [Signal(8 * BB, name=f"ld_slot{i}") for i in range(nslot)]
        ld_k = Signal(range(nslot))
        ld_r = self.rows_done              # rows finished
        ld_more = Signal()                 # ld_r + 1 < rows: a row follows the current one
        ld_a = Signal(A + 1)               # external address of the current row
        ld_end = Signal(A + 1)             # ... and its end
        ld_na = Signal(A + 1)              # the next row's address (ld_a + ext_stride)
        ld_nend = Signal(A + 1)            # ... and its end (ld_end + ext_stride)
        ld_be = Signal(A + 1)              # end of the next beat (its address + BB)
        can_emit = (~row.valid | row.ready) & ~self.hold_rows
        # `ends` is ld_be >= ld_end, kept as a register (0 >= 0 at reset).
        ends = Signal(init=1)
        shared, next_ends_here = Signal(), Signal()
        m.d.comb += [
            shared.eq(ctx.coalesced & ld_more & (ld_na < ld_be)),
            next_ends_here.eq(ld_be >= ld_nend),
        ]
        be_step = Signal(A + 1)            # ld_be + BB: the beat after this one
        be_row = Signal(A + 1)             # the first beat of the next row, uncoalesced
        m.d.comb += [be_step.eq(ld_be + BB), be_row.eq(Cat(C(0, LG), ld_na[LG:] + 1))]
        # A beat that ends this row and holds all of the next one is used twice.
        hold = ends & shared & next_ends_here
        m.d.comb += beat.ready.eq(self.receiving & (~ends | can_emit) & ~hold)
        process = self.receiving & beat.valid & (~ends | can_emit)
        gathered = Cat(*[Mux(ld_k == i, beat.payload, slots[i]) for i in range(nslot)])
        shifted = Signal(8 * RBX)
        m.d.comb += shifted.eq(gathered >> Cat(C(0, 3), ld_a[:LG]))
        with m.If(row.valid & row.ready):
            m.d.sync += row.valid.eq(0)
        with m.If(process):
            with m.Switch(ld_k):
                for i in range(nslot):
                    with m.Case(i):
                        m.d.sync += slots[i].eq(beat.payload)
            with m.If(ends):
                m.d.sync += [row.valid.eq(1),
                             row.payload.data.eq(shifted & _byte_mask(RBX, ctx.row_bytes, 8)),
                             row.payload.addr.eq(ctx.chip_row + ld_r),
                             row.payload.vmem.eq(ctx.vmem),
                             ld_r.eq(ld_r + 1), ld_more.eq(ld_r + 2 < ctx.rows),
                             ld_a.eq(ld_na), ld_end.eq(ld_nend),
                             ld_na.eq(ld_na + ctx.stride), ld_nend.eq(ld_nend + ctx.stride)]
                with m.If(hold):
                    m.d.sync += [ld_k.eq(0), ends.eq(next_ends_here)]
                with m.Elif(shared | ctx.coalesced):
                    with m.If(shared):
                        m.d.sync += [slots[0].eq(beat.payload), ld_k.eq(1)]
                    with m.Else():
                        m.d.sync += ld_k.eq(0)
                    m.d.sync += [ld_be.eq(be_step), ends.eq(be_step >= ld_nend)]
                with m.Else():
                    m.d.sync += [ld_k.eq(0), ld_be.eq(be_row), ends.eq(be_row >= ld_nend)]
            with m.Else():
                m.d.sync += [ld_k.eq(ld_k + 1), ld_be.eq(be_step), ends.eq(be_step >= ld_end)]
        m.d.comb += self.last.eq(process & ends & ~ld_more)
        f = self.first
        with m.If(self.restart):
            m.d.sync += [ctx.eq(f),
                         ld_r.eq(0), ld_more.eq(f.rows > 1), ld_a.eq(f.a), ld_end.eq(f.end),
                         ld_na.eq(f.na), ld_nend.eq(f.nend), ld_be.eq(f.be), ld_k.eq(0),
                         ends.eq(f.be >= f.end)]
        with m.If(self.clear):
            m.d.sync += row.valid.eq(0)
        return m


def _row_meta_layout(c):
    return data.StructLayout({"first": 1, "last": 1, "off": range(c.axi_data_bytes)})


def _row_reader_width(c):
    """A queued row: the memory's row (the wider of the two) and its meta."""
    return max(8 * c.vmem_row_bytes, 8 * c.acc_row_bytes) + _row_meta_layout(c).size


class _RowReader(wiring.Component):
    """Store: the descriptor's on-chip rows read in order, through ReLU and
    fp32 -> bf16, into a four-row queue in front of the gearbox.

    Interface
    ---------
    desc : In(dma_descriptor_layout(config))
    coalesced : In(1)
        The rows form one contiguous external range.
    start : In(1)
        Begin at the descriptor's first row.
    enable : In(1)
        A store runs: read.
    clear : In(1)
        Empty the queue (between descriptors).
    vmem_read, acc_read : Out(ReadPortSignature)
    rows : Out(stream.Signature({data, first, last, off}))
        The converted rows; ``first`` and ``last``: the row begins or ends a
        contiguous range (every row does, unless ``coalesced``); ``off``: its
        external address within a beat.
    waiting : Out(1)
        A read request is offered and not taken (it stays offered).

    ``queue`` (a `mxu.hdl.fifo.Fifo`) holds the rows read and not yet taken.
    """

    DEPTH = 4

    def __init__(self, config):
        self.config = config
        c = config
        super().__init__({
            "desc": In(dma_descriptor_layout(c)), "coalesced": In(1),
            "start": In(1), "enable": In(1), "clear": In(1),
            "vmem_read": Out(ReadPortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c))),
            "acc_read": Out(ReadPortSignature(_addr_shape(c.acc_rows), acc_row_layout(c))),
            "rows": Out(stream.Signature(_store_row_layout(c))),
            "waiting": Out(1),
        })
        # (The rows in a memory; their marks in registers, for the proofs.)
        self.queue = Fifo(_row_reader_width(c), self.DEPTH,
                          memory_bits=max(8 * c.vmem_row_bytes, 8 * c.acc_row_bytes))

    def elaborate(self, platform):
        m = Module()
        c, d, DEPTH = self.config, self.desc, self.DEPTH
        A, LG = c.axi_addr_bits, _log2(c.axi_data_bytes)
        is_vmem = d.space == DmaSpace.VMEM
        meta = _row_meta_layout(c)
        rd_width = max(8 * c.vmem_row_bytes, 8 * c.acc_row_bytes)
        m.submodules.rd_q = rd_q = ResetInserter(self.clear)(self.queue)
        rd_r = Signal(len(d.rows))          # rows requested
        rd_a = Signal(A + 1)                # external address of row rd_r
        rd_pending = Signal()               # a response arrives next cycle
        rd_meta = Signal(meta)
        rd_req = Signal()
        m.d.comb += rd_req.eq(self.enable & (rd_r < d.rows) & (rd_q.level + rd_pending < DEPTH))
        m.d.comb += [
            self.vmem_read.req.valid.eq(rd_req & is_vmem),
            self.vmem_read.req.payload.eq(d.chip_row + rd_r),
            self.acc_read.req.valid.eq(rd_req & ~is_vmem),
            self.acc_read.req.payload.eq(d.chip_row + rd_r),
        ]
        rd_fire = rd_req & Mux(is_vmem, self.vmem_read.req.ready, self.acc_read.req.ready)
        # A request is held until taken, even when an error response stops the
        # store (stream rule; docs/formal.md).
        m.d.comb += self.waiting.eq(rd_req & ~rd_fire)
        m.d.sync += rd_pending.eq(rd_fire & ~self.clear)
        with m.If(rd_fire):
            m.d.sync += [rd_r.eq(rd_r + 1), rd_a.eq(rd_a + d.ext_stride),
                         rd_meta.first.eq(~self.coalesced | (rd_r == 0)),
                         rd_meta.last.eq(~self.coalesced | (rd_r + 1 == d.rows)),
                         rd_meta.off.eq(rd_a[:LG])]
        with m.If(self.start):
            m.d.sync += [rd_r.eq(0), rd_a.eq(d.ext_base)]
        resp_data = Mux(is_vmem, self.vmem_read.resp.payload.as_value(),
                        self.acc_read.resp.payload.as_value())
        # Only a response this reader waits for: one to a request taken just
        # before a soft reset of the core arrives after it (the memories are not
        # reset) and must not become the next store's first row (docs/formal.md).
        m.d.comb += [rd_q.w_en.eq((self.vmem_read.resp.valid | self.acc_read.resp.valid)
                                  & rd_pending),
                     rd_q.w_data.eq(Cat(resp_data, rd_meta))]
        q_meta = meta(rd_q.r_data[rd_width:])
        m.d.comb += [
            self.rows.valid.eq(rd_q.r_rdy), rd_q.r_en.eq(self.rows.valid & self.rows.ready),
            self.rows.payload.data.eq(self._convert(m, rd_q.r_data[:rd_width], is_vmem)),
            self.rows.payload.first.eq(q_meta.first), self.rows.payload.last.eq(q_meta.last),
            self.rows.payload.off.eq(q_meta.off),
        ]
        return m

    def _convert(self, m, q_row, is_vmem):
        """ReLU and fp32 -> bf16 of a queued row, as the descriptor asks."""
        c, d = self.config, self.desc
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
        out = Signal(8 * _max_row_bytes(c))
        with m.If(is_vmem):
            m.d.comb += out.eq(Cat(*vmem_elems))
        with m.Elif(d.to_bf16):
            m.d.comb += out.eq(Cat(*acc_b16))
        with m.Else():
            m.d.comb += out.eq(Cat(*acc_f32))
        return out


class _Gearbox(wiring.Component):
    """Store: rows packed into W beats with strobes, WLAST on each burst's
    last beat.

    Interface
    ---------
    rows : In(stream.Signature({data, first, last, off}))
        From `_RowReader`.
    lengths : In(stream.Signature(8))
        The AxLEN of each burst issued, in order; taken with its last beat.
    row_bytes : In(row bytes)
        The descriptor's ``row_bytes``.
    enable : In(1)
        A store runs.
    clear : In(1)
        Drop what is packed (between descriptors).
    w : Out(stream.Signature({data, strb, last}))
        The W channel.
    """

    def __init__(self, config):
        self.config = config
        c = config
        BB = c.axi_data_bytes
        super().__init__({
            "rows": In(stream.Signature(_store_row_layout(c))),
            "lengths": In(stream.Signature(8)),
            "row_bytes": In(dma_descriptor_layout(c)["row_bytes"].width),
            "enable": In(1), "clear": In(1),
            "w": Out(stream.Signature(data.StructLayout({"data": 8 * BB, "strb": BB, "last": 1}))),
        })

    def _last(self, beat, length):
        """WLAST: the burst's beat ``beat`` (from 0) is its last of ``length`` + 1."""
        return beat == length

    def elaborate(self, platform):
        m = Module()
        c = self.config
        BB, RBX = c.axi_data_bytes, _max_row_bytes(c)
        rows, w, row_bytes = self.rows, self.w, self.row_bytes
        CAP = BB + RBX
        gb_data = Signal(8 * CAP)
        gb_strb = Signal(CAP)
        gb_n = Signal(range(CAP + 1))
        gb_flush = Signal()
        beat_valid = (gb_n >= BB) | (gb_flush & (gb_n != 0))
        w_beat = Signal(8)
        m.d.comb += [w.valid.eq(self.enable & beat_valid & self.lengths.valid),
                     w.payload.data.eq(gb_data[:8 * BB]), w.payload.strb.eq(gb_strb[:BB]),
                     w.payload.last.eq(self._last(w_beat, self.lengths.payload))]
        w_fire = w.valid & w.ready
        m.d.comb += self.lengths.ready.eq(w_fire & w.payload.last)
        with m.If(w_fire):
            m.d.sync += w_beat.eq(Mux(w.payload.last, 0, w_beat + 1))
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
        # Where the row goes, and whether it fits, for either outcome of this
        # cycle's beat (kept: gb_n; sent: gb_n - BB): both from registers and
        # the queued row, so that W's handshake only selects between them at
        # the end (the `fpga` chip's worst path ran from the handshake through
        # the subtract, the sum and the compare into the row queue's level;
        # docs/synth.md).
        first, off = rows.payload.first, rows.payload.off
        sent_n = Mux(BB < gb_n, gb_n - BB, 0)
        pos_kept, pos_sent = Signal(range(CAP + 1)), Signal(range(CAP + 1))
        m.d.comb += [pos_kept.eq(Mux(first, off, gb_n)), pos_sent.eq(Mux(first, off, sent_n))]
        end_kept, end_sent = pos_kept + row_bytes, pos_sent + row_bytes
        fits = Mux(w_fire, CAP >= end_sent, CAP >= end_kept)
        m.d.comb += rows.ready.eq(self.enable & ~flush1 & fits)
        accept = rows.valid & rows.ready
        row = rows.payload.data & _byte_mask(RBX, row_bytes, 8)
        strb = _byte_mask(RBX, row_bytes, 1)
        placed = Mux(w_fire, row << Cat(C(0, 3), pos_sent), row << Cat(C(0, 3), pos_kept))
        placed_strb = Mux(w_fire, strb << pos_sent, strb << pos_kept)
        with m.If(accept):
            m.d.sync += [gb_data.eq(data1 | placed), gb_strb.eq(strb1 | placed_strb),
                         gb_n.eq(Mux(w_fire, end_sent, end_kept)), gb_flush.eq(rows.payload.last)]
        with m.Else():
            m.d.sync += [gb_data.eq(data1), gb_strb.eq(strb1), gb_n.eq(n1), gb_flush.eq(flush1)]
        with m.If(self.clear):
            m.d.sync += [gb_n.eq(0), gb_flush.eq(0), gb_data.eq(0), gb_strb.eq(0), w_beat.eq(0)]
        return m


class _ReceiveContexts(wiring.Component):
    """The loads in flight (plain or quantized, both of one kind): rx[0]
    receives its data, rx[1] (if any) has issued its bursts or is issuing them. A context completes once its bursts are
    all back and its last row written; rx[1] then moves up and the load path
    takes its first row.

    Interface
    ---------
    alloc : In(1)
        A load gets a context: ``new`` (rx[0] if free, else rx[1]).
    new : In(context)
    burst_issued : In(1)
        A load's burst was issued: the issuing context has one more in flight.
    issued : In(1)
        The issuing load's bursts are all out.
    r_last, r_error : In(1)
        A cycle ago, a burst's last R beat, and an error response (of code
        ``r_code``). The contexts take them a cycle late: R handshakes wait on
        the load path's row-end compare, and that chain into the context was
        the fpga chip's critical path (docs/synth.md).
    r_code : In(DmaError)
    r_next : In(1)
        That beat was rx[1]'s (rx[0] had no burst left on the bus), else rx[0]'s.
    row_idle : In(1)
        The load path holds no unwritten row after this cycle (a quantized
        rx[0]: its rows are all written, or an error response came).
    rows_done : In(rows)
        Rows of rx[0] written or being written.
    abort : In(1), abort_err : In(DmaError)
        Bursts stopped by an error response, and its code (for a context it cut short).
    rx0, rx1 : Out(context)
    following : Out(context)
        What becomes rx[0] at a ``shift`` (the load path's next context).
    done : Out(stream.Signature(dma_completion_layout(config)))
        rx[0] completes: in the cycle its last row is written (the token it
        frees is pushed a cycle later, when the row is in the memory).
    shift : Out(1)
        rx[0]'s completion is taken: rx[1] moves up.
    """

    def __init__(self, config):
        self.config = config
        c = config
        ctx = _context_layout(c)
        super().__init__({
            "alloc": In(1), "new": In(ctx), "burst_issued": In(1), "issued": In(1),
            "r_last": In(1), "r_error": In(1), "r_code": In(DmaError), "r_next": In(1),
            "row_idle": In(1),
            "rows_done": In(ctx["rows"].width), "abort": In(1), "abort_err": In(DmaError),
            "rx0": Out(ctx), "rx1": Out(ctx), "following": Out(ctx),
            "done": Out(stream.Signature(dma_completion_layout(c))), "shift": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        rx0, rx1, n1 = self.rx0, self.rx1, self.following
        last0, last1 = self.r_last & ~self.r_next, self.r_last & self.r_next

        def err(ctx, error):
            return Mux(ctx.err != DmaError.OK, ctx.err, Mux(error, self.r_code, DmaError.OK))
        err0 = err(rx0, self.r_error & ~self.r_next)
        short = self.rows_done != rx0.rows
        m.d.comb += [
            self.done.valid.eq(rx0.valid & rx0.issued & (rx0.bursts == last0) & self.row_idle),
            self.done.payload.tag.eq(rx0.tag),
            self.done.payload.error.eq(Mux(err0 != DmaError.OK, err0,
                                           Mux(self.abort & short, self.abort_err, DmaError.OK))),
            self.shift.eq(self.done.valid & self.done.ready),
        ]
        # Updates of this cycle, then the move up.
        n0 = Signal.like(rx0)
        m.d.comb += [n0.eq(rx0), n1.eq(rx1)]
        with m.If(rx1.valid):
            m.d.comb += [n1.bursts.eq(rx1.bursts + self.burst_issued - last1),
                         n1.err.eq(err(rx1, self.r_error & self.r_next)),
                         n0.bursts.eq(rx0.bursts - last0)]
            with m.If(self.issued):
                m.d.comb += n1.issued.eq(1)
        with m.Else():
            m.d.comb += n0.bursts.eq(rx0.bursts + self.burst_issued - last0)
            with m.If(self.issued):
                m.d.comb += n0.issued.eq(1)
        m.d.comb += n0.err.eq(err0)
        with m.If(self.alloc):
            with m.If(~rx0.valid):
                m.d.comb += n0.eq(self.new)
            with m.Else():
                m.d.comb += n1.eq(self.new)
        with m.If(self.shift):
            m.d.sync += [rx0.eq(n1), rx1.eq(0)]
        with m.Else():
            m.d.sync += [rx0.eq(n0), rx1.eq(n1)]
        return m


class Dma(wiring.Component):
    """AXI4 DMA master between external memory and VMEM / the accumulator memory.

    The sections are components, each with its interface: `_BurstGenerator`
    (the external range cut into bursts), `_LoadPath` (R beats into on-chip
    rows), `_ReceiveContexts` (the loads in flight), `_RowReader` and
    `_Gearbox` (on-chip rows into W beats). This component holds the
    descriptor, checks it, runs it (a state machine), and owns the AR
    register, the AW queue and the responses.

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
    vmem_write1, ... : Out(WritePortSignature), with the expander and
        ``config.quant_rows`` > 1
        A quantized load's further write lanes (`vmem_writes`), to `Vmem`'s
        ``dma_write1, ...``: the expander's rows ``k + i`` of a group on lane i.
    busy : Out(1)
        A descriptor is being checked, moved or completed.
    drain : In(1)
        A soft reset drains the bus (`mxu.hdl.regs.SoftReset`): no new burst;
        those in flight complete (their R beats taken, their W beats sent).
    quiet : Out(1)
        No burst in flight (every one issued has its last R beat or its B).

    The sections are attributes (``bursts``, ``load_path``, ``contexts``,
    ``row_reader``, ``gearbox``), so that checkers can attach to their ports,
    and so are the store's queues (``aw_queue``, ``len_queue``, and the row
    reader's ``queue``: `mxu.hdl.fifo.Fifo`, whose pointers and entries the
    proofs' lemmas name).
    """

    def __init__(self, config):
        self.config = config
        c = config
        self.vmem_writes = lane_port_names("vmem_write", c.quant_rows if c.quant_formats else 1)
        super().__init__({
            "cmd": In(stream.Signature(dma_descriptor_layout(c))),
            "done": Out(stream.Signature(dma_completion_layout(c))),
            "axi": Out(AXI4Signature(addr_width=c.axi_addr_bits, data_width=c.axi_data_bits)),
            "vmem_read": Out(ReadPortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c))),
            "vmem_write": Out(WritePortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c))),
            "acc_read": Out(ReadPortSignature(_addr_shape(c.acc_rows), acc_row_layout(c))),
            "acc_write": Out(WritePortSignature(_addr_shape(c.acc_rows), acc_row_layout(c))),
            "busy": Out(1), "drain": In(1), "quiet": Out(1),
            **{name: Out(WritePortSignature(_addr_shape(c.vmem_rows), vmem_row_layout(c)))
               for name in self.vmem_writes[1:]},
        })
        self.bursts = _BurstGenerator(c)
        self.load_path = _LoadPath(c)
        self.contexts = _ReceiveContexts(c)
        self.row_reader = _RowReader(c)
        self.gearbox = self._gearbox_class()(c)
        # The AW queue (address, AxLEN) and the W side's burst lengths.
        self.aw_queue = Fifo(c.axi_addr_bits + 8, c.dma_max_outstanding)
        self.len_queue = Fifo(8, c.dma_max_outstanding)
        self.expander = Expander(c) if c.quant_formats else None

    def _gearbox_class(self):
        return _Gearbox

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.bursts = bursts = self.bursts
        m.submodules.load_path = lp = self.load_path
        m.submodules.contexts = rc = self.contexts
        m.submodules.row_reader = rr = self.row_reader
        m.submodules.gearbox = gb = self.gearbox
        d = Signal(dma_descriptor_layout(c))
        derived = Signal(_derived_layout(c))
        status = Signal(data.StructLayout({
            "err": DmaError,          # the completion of a descriptor the FSM completes
            "abort": 1,               # no new bursts: an error response arrived
            "abort_err": DmaError,    # the first error response, for contexts it cut short
        }))
        self._status = status       # (for the proofs' lemmas)
        run, clear = Signal(), Signal()     # RUN; COMPLETE (the sections' state is reset)
        is_load = d.dir == DmaDir.LOAD
        self._m = m
        self._quant = Signal()      # the descriptor is a quantized load
        self._qmode = Signal()      # rx[0] is a quantized load: R beats go to the expander
        # "Units" of the external range: rows, or a quantized load's tile-blocks;
        # registers, set as the descriptor is taken (`_take_units`).
        self._units = Signal(data.StructLayout({
            "n": len(d.rows), "n_1": len(d.rows), "zero": 1, "one": 1}))
        self._quant_rows = Signal(data.StructLayout({
            "valid": 1, "beats_ready": 1, "addr": range(c.vmem_rows), "data": 8 * c.vmem_row_bytes,
            "idle": 1}))
        # RUN with a store, as a register of its own: it enables the row reader
        # and the gearbox, whose handshakes are the `fpga` chip's longest paths.
        self._store_run = Signal(name="store_run")
        self._q_at = Signal(range(3))           # `_quant_path`
        self._q_written = Signal(len(d.rows))   # rows of rx[0] written
        if c.quant_formats:
            m.d.comb += self._quant.eq(is_load & (d.format != QuantFormat.NONE))
        if c.quant_formats:
            m.d.comb += self._qmode.eq(rc.rx0.valid & rc.rx0.quant)
        m.d.comb += [
            bursts.stride.eq(d.ext_stride), bursts.enable.eq(run),
            bursts.abort.eq(status.abort | self.drain), self.quiet.eq(bursts.inflight == 0),
            rr.desc.eq(d), rr.coalesced.eq(derived.coalesced),
            rr.enable.eq(self._store_run), rr.clear.eq(clear),
            gb.row_bytes.eq(d.row_bytes), gb.enable.eq(self._store_run), gb.clear.eq(clear),
            rc.burst_issued.eq(bursts.burst.valid & bursts.burst.ready & is_load),
            rc.abort.eq(status.abort), rc.abort_err.eq(status.abort_err),
            self.load_path.clear.eq(clear),
        ]
        wiring.connect(m, rr.rows, gb.rows)
        wiring.connect(m, rr.vmem_read, wiring.flipped(self.vmem_read))
        wiring.connect(m, rr.acc_read, wiring.flipped(self.acc_read))
        self._connect_axi(m, bursts, gb, is_load, clear)
        self._quant_path(m, rc, status, clear)
        moved_on = Signal()     # the load path works for rx[1] (`_connect_load_path`)
        self._responses(m, bursts, rc, status)
        self._connect_load_path(m, lp, rc, clear, moved_on)
        fsm_done = self._control(m, d, derived, status, run, clear)
        # Completions leave in order: a descriptor the state machine completes
        # waited for the loads in flight.
        m.d.comb += [
            self.done.valid.eq(rc.done.valid | fsm_done),
            self.done.payload.eq(Mux(rc.done.valid, rc.done.payload, Cat(status.err, d.tag))),
            rc.done.ready.eq(self.done.ready),
        ]
        with m.If(rc.rx0.valid):
            m.d.comb += self.busy.eq(1)
        return m

    def _connect_axi(self, m, bursts, gb, is_load, clear):
        """AR for loads; AW and the queue of W burst lengths for stores; W."""
        c, axi = self.config, self.axi
        A, LG, MAXO = c.axi_addr_bits, _log2(c.axi_data_bytes), c.dma_max_outstanding
        burst = bursts.burst
        ar_valid = Signal()
        ar_addr = Signal(A)
        ar_len = Signal(8)
        m.d.comb += [axi.arvalid.eq(ar_valid), axi.araddr.eq(ar_addr), axi.arlen.eq(ar_len),
                     axi.arsize.eq(LG), axi.arburst.eq(AxiBurst.INCR), axi.arid.eq(0),
                     axi.arcache.eq(0b0011), axi.arprot.eq(0), axi.arlock.eq(0)]
        with m.If(axi.arvalid & axi.arready):
            m.d.sync += ar_valid.eq(0)
        m.submodules.aw_q = aw_q = ResetInserter(clear)(self.aw_queue)
        m.submodules.wl_q = wl_q = ResetInserter(clear)(self.len_queue)
        m.d.comb += [axi.awvalid.eq(aw_q.r_rdy), axi.awaddr.eq(aw_q.r_data[:A]),
                     axi.awlen.eq(aw_q.r_data[A:]), axi.awsize.eq(LG),
                     axi.awburst.eq(AxiBurst.INCR), axi.awid.eq(0), axi.awcache.eq(0b0011),
                     axi.awprot.eq(0), axi.awlock.eq(0),
                     aw_q.r_en.eq(axi.awready),
                     aw_q.w_data.eq(Cat(burst.payload.addr, burst.payload.len)),
                     wl_q.w_data.eq(burst.payload.len)]
        fire = burst.valid & burst.ready
        with m.If(is_load):
            m.d.comb += burst.ready.eq(~ar_valid | axi.arready)
            with m.If(fire):
                m.d.sync += [ar_valid.eq(1), ar_addr.eq(burst.payload.addr),
                             ar_len.eq(burst.payload.len)]
        with m.Else():
            m.d.comb += [burst.ready.eq(aw_q.w_rdy & wl_q.w_rdy),
                         aw_q.w_en.eq(fire), wl_q.w_en.eq(fire)]
        m.d.comb += [gb.lengths.valid.eq(wl_q.r_rdy), gb.lengths.payload.eq(wl_q.r_data),
                     wl_q.r_en.eq(gb.lengths.ready),
                     axi.wvalid.eq(gb.w.valid), axi.wdata.eq(gb.w.payload.data),
                     axi.wstrb.eq(gb.w.payload.strb), axi.wlast.eq(gb.w.payload.last),
                     gb.w.ready.eq(axi.wready)]

    def _responses(self, m, bursts, rc, status):
        """R and B responses: bursts returned, and the first error."""
        axi = self.axi
        r_fire = axi.rvalid & axi.rready
        b_fire = axi.bvalid & axi.bready
        m.d.comb += axi.bready.eq(1)
        # R beats are a load's (a store takes no R), B responses a store's: the
        # receive contexts may still hold loads while a store runs.
        m.d.comb += bursts.returned.eq((r_fire & axi.rlast) | b_fire)
        resp = Mux(r_fire, axi.rresp, axi.bresp)
        code = Mux(resp[0], DmaError.DECERR, DmaError.SLVERR)
        r_error = Signal()
        with m.If((r_fire | b_fire) & resp[1]):
            m.d.sync += status.abort.eq(1)
            with m.If(status.abort_err == DmaError.OK):
                m.d.sync += status.abort_err.eq(code)
            with m.If(r_fire):
                m.d.comb += r_error.eq(1)       # a context's, a cycle later
            with m.Elif(status.err == DmaError.OK):
                m.d.sync += status.err.eq(code)
        # A beat is rx[1]'s when rx[0] has no burst left on the bus (responses
        # come in order), unless rx[1] moves up to rx[0] at this edge. Counted
        # from the contexts' bursts, not from the load path's position (where it
        # has moved on, or the expander's beat count): the same beats, but the
        # proofs' induction ties counts, not addresses (docs/formal.md).
        rx0 = rc.rx0
        none_left = rx0.bursts == (rc.r_last & ~rc.r_next)
        m.d.sync += [rc.r_last.eq(r_fire & axi.rlast), rc.r_error.eq(r_error),
                     rc.r_code.eq(code), rc.r_next.eq(none_left & ~rc.shift)]

    def _connect_load_path(self, m, lp, rc, clear, moved_on):
        """The load path works for rx[0], and writes its rows to VMEM or the
        accumulator; it takes a context's first row when the context becomes
        rx[0], or earlier: in the cycle it gathers rx[0]'s last row, if rx[1]
        is there (it has then moved on: rx[0] completes a cycle later, when
        its last burst's end reaches it, and R beats meanwhile are rx[1]'s)."""
        axi, rx0, rx1 = self.axi, rc.rx0, rc.rx1
        row = lp.row
        early = lp.last & rc.following.valid & ~moved_on
        with m.If(early):
            m.d.sync += moved_on.eq(1)
        with m.If(rc.shift | clear):
            m.d.sync += moved_on.eq(0)
        last1 = rc.r_last & rc.r_next
        q = self._quant_rows
        m.d.comb += [
            lp.beats.valid.eq(axi.rvalid & ~self._qmode), lp.beats.payload.eq(axi.rdata),
            axi.rready.eq(Mux(self._qmode, q.beats_ready, lp.beats.ready)),
            lp.receiving.eq(Mux(moved_on, rx1.valid & (rx1.bursts != last1),
                                rx0.valid & (rx0.bursts != (rc.r_last & ~rc.r_next)))),
            lp.restart.eq((rc.alloc & ~rx0.valid) | (rc.shift & ~moved_on) | early),
            # rx[0]'s completion counts on its last row: rx[1]'s wait for the
            # move up (they may end in the cycle of the move).
            lp.hold_rows.eq(moved_on & ~rc.shift),
            lp.first.eq(Mux(rc.shift | early, rc.following, rc.new)),
            # (Muxes, not an If: see `mxu.hdl.transfer` on split payloads.)
            self.vmem_write.valid.eq(Mux(self._qmode, q.valid, row.valid & row.payload.vmem)),
            self.vmem_write.payload.addr.eq(Mux(self._qmode, q.addr, row.payload.addr)),
            self.vmem_write.payload.data.eq(
                Mux(self._qmode, q.data, row.payload.data[:8 * self.config.vmem_row_bytes])),
            self.acc_write.valid.eq(row.valid & ~row.payload.vmem),
            self.acc_write.payload.addr.eq(row.payload.addr),
            self.acc_write.payload.data.eq(row.payload.data[:8 * self.config.acc_row_bytes]),
            row.ready.eq(Mux(row.payload.vmem, self.vmem_write.ready, self.acc_write.ready)),
            # (A quantized load's: its rows all written, or an error response.)
            rc.row_idle.eq(Mux(self._qmode, q.idle, ~row.valid | row.ready)),
            # Moved on, the load path counts rx[1]'s rows: rx[0]'s are all in.
            rc.rows_done.eq(Mux(self._qmode, self._q_written,
                                Mux(moved_on, rx0.rows, lp.rows_done))),
        ]

    def _checks(self, d, derived):
        """The descriptor's checks (docs/memory.md), in the order they are reported.

        (Comparisons throughout are written as ``<`` and ``>=``: Yosys maps
        ``a > b`` and ``a <= b`` to a carry chain plus an equality tree, the
        other two to the chain alone; docs/synth.md.)"""
        c = self.config
        is_load, is_vmem = d.dir == DmaDir.LOAD, d.space == DmaSpace.VMEM
        limit = Mux(is_vmem, c.vmem_row_bytes,
                    Mux(is_load | ~d.to_bf16, c.acc_row_bytes, c.acc_row_bytes // 2))
        four = ~is_vmem & ~d.to_bf16    # fp32 rows: 4-byte alignment
        fields = d.ext_base | d.ext_stride | d.row_bytes
        chip_rows = Mux(is_vmem, c.vmem_rows, c.acc_rows)
        q_option, q_row_bytes, q_misaligned = self._quant_checks(d, is_load, is_vmem)
        return [
            (DmaError.BAD_OPTION, (is_load & (d.to_bf16 | d.relu)) | (is_vmem & d.to_bf16)
             | q_option),
            (DmaError.ROW_BYTES, Mux(self._quant, q_row_bytes, limit < d.row_bytes)),
            (DmaError.MISALIGNED, fields[0] | (four & fields[1]) | q_misaligned),
            (DmaError.CHIP_RANGE, chip_rows < d.chip_row + d.rows),
            (DmaError.OK, (d.rows == 0) | (d.row_bytes == 0)),       # empty: nothing to move
            (DmaError.EXT_RANGE, derived.room < derived.last_off),
        ]

    def _quant_checks(self, d, is_load, is_vmem):
        """A quantized load's checks (docs/memory.md, "Quantized loads"): a
        format the expander builds, loaded into VMEM; ``row_bytes`` one
        tile-block; whole beats; whole blocks of rows."""
        c = self.config
        if not c.quant_formats:
            return C(0, 1), C(0, 1), C(0, 1)
        LG = _log2(c.axi_data_bytes)
        known = Cat(*(d.format == QuantFormat[f] for f in c.quant_formats)).any()
        tile = Signal(len(d.row_bytes) + 1)
        whole = Signal()
        with self._m.Switch(d.format):
            for name in c.quant_formats:
                f = QuantFormat[name]
                with self._m.Case(f):
                    self._m.d.comb += [tile.eq(tile_block_bytes(f, c.cols)),
                                       whole.eq(d.rows[:_log2(QUANT_INFO[f].block)] == 0)]
        option = (d.format != QuantFormat.NONE) & (~is_load | ~is_vmem | ~known)
        beats = (d.ext_base | d.ext_stride)[:LG] if LG else C(0, 1)
        return option, d.row_bytes != tile, self._quant & ((beats != 0) | ~whole)

    def _quant_path(self, m, rc, status, clear):
        """Quantized loads, in receive contexts as plain loads are (so the
        next one issues its bursts while this one's beats arrive): R beats
        through the `Expander`, with the format of the context they are of,
        its rows into VMEM rows ``chip_row + k`` of rx[0], a group of
        ``quant_rows`` a cycle, row ``k + i`` on write lane i (distinct
        banks, so `Vmem` refuses none of them; a lane that is refused all the
        same holds the group, and the lanes that wrote write the same rows
        again). rx[0] completes once its rows are all written (``q.idle``);
        the next context's rows wait for that. After an error response the
        rows are dropped, the contexts complete as their bursts return, and
        the expander is emptied once none is left."""
        c = self.config
        q = self._quant_rows
        if not c.quant_formats:
            m.d.comb += [q.valid.eq(0), q.beats_ready.eq(0)]
            return
        m.submodules.expander = ex = self.expander
        axi, rx0, rx1 = self.axi, rc.rx0, rc.rx1
        lanes = [getattr(self, name) for name in self.vmem_writes]
        # The context the next R beat is of (0: rx[0], 1: rx[1], 2: one not
        # yet allocated), and the beats of it taken: responses come in order.
        at, taken = self._q_at, Signal(len(rx0.beats))
        beat = ex.beats.valid & ex.beats.ready
        last_beat = beat & (taken + 1 == Mux(at == 0, rx0.beats, rx1.beats))
        at_next = Signal.like(at)
        m.d.comb += at_next.eq(at + last_beat)
        with m.If(beat):
            m.d.sync += taken.eq(Mux(last_beat, 0, taken + 1))
        with m.If(last_beat):
            m.d.sync += at.eq(at_next)
        with m.If(rc.shift):
            # rx[1] moves up. (rx[0] completes before its last beat only
            # after an error response: the beat count restarts.)
            m.d.sync += at.eq(Mux(at_next == 0, 0, at_next - 1))
            with m.If(at_next == 0):
                m.d.sync += taken.eq(0)
        drained = status.abort & ~rx0.valid     # no context left after an error response
        with m.If(clear | drained):
            m.d.sync += [at.eq(0), taken.eq(0)]
        # The expander's rows reach the write lanes through a register slice,
        # so that its stall (`rows.ready`) is a register and not the lanes'
        # acceptance and rx[0]'s state (docs/synth.md, "The weight expander
        # on the `fpga` chip"). Emptied with the expander.
        empty = Signal()
        m.d.comb += empty.eq(clear | drained)
        m.submodules.expander_slice = rows = ResetInserter(empty)(
            RegisterSlice(ex.rows.payload.shape()))
        wiring.connect(m, ex.rows, rows.i)
        # `full`: rx[0]'s rows are all written (a register, not a compare:
        # `more` holds the expander's every stage).
        # `waiting`: a group offered and refused by a lane stays offered, also
        # when an error response comes meanwhile (the stream rule; its rows
        # are written, the ones after it dropped).
        written, full = self._q_written, Signal()
        waiting = Signal()
        more = self._qmode & ~full & (~status.abort | waiting)
        accepted = Cat(*(lane.ready for lane in lanes)).all()
        m.d.sync += waiting.eq(more & rows.o.valid & ~accepted)
        m.d.comb += [
            ex.format.eq(Mux(at == 0, rx0.format, rx1.format)), ex.clear.eq(empty),
            ex.beats.valid.eq(axi.rvalid & self._qmode), ex.beats.payload.eq(axi.rdata),
            q.beats_ready.eq(ex.beats.ready),
            # Lane 0 is `vmem_write`, shared with the plain load path.
            q.valid.eq(rows.o.valid & more), q.addr.eq(rx0.chip_row + written),
            q.data.eq(rows.o.payload[0].as_value()),
            rows.o.ready.eq((status.abort & ~waiting) | (more & accepted)),
            q.idle.eq(full | (status.abort & ~waiting)),
        ]
        for i, lane in enumerate(lanes[1:], 1):
            m.d.comb += [lane.valid.eq(more & rows.o.valid),
                         lane.payload.addr.eq(rx0.chip_row + written + i),
                         lane.payload.data.eq(rows.o.payload[i].as_value())]
        with m.If(more & rows.o.valid & rows.o.ready):
            m.d.sync += [written.eq(written + len(lanes)),
                         full.eq(written + len(lanes) == rx0.rows)]
        with m.If(rc.shift | clear):
            m.d.sync += [written.eq(0), full.eq(0)]

    def _room(self, d):
        """How far the last row may start past the first one: EXT_RANGE is
        ``ext_base + row_bytes + last_off`` beyond external memory (or the
        link's window), that is ``last_off > room``. Computed in CHECK beside
        ``last_off``, so that DECIDE compares two registers instead of adding
        first (docs/synth.md, "The weight expander on the `fpga` chip")."""
        c = self.config
        room = C(c.ext_mem_bytes, len(d.ext_base) + 2) - (d.ext_base + d.row_bytes)
        if not c.links:
            return room
        return Mux(d.link, C(c.link_window_bytes, len(d.ext_base) + 2) - d.row_bytes, room)

    def _control(self, m, d, derived, status, run, clear):
        """The run state machine; returns "the state machine completes a
        descriptor" (a store, or one that failed its checks)."""
        c, bursts, rc = self.config, self.bursts, self.contexts
        LG = _log2(c.axi_data_bytes)
        is_load = d.dir == DmaDir.LOAD
        rx0 = rc.rx0
        # The checks but the last (EXT_RANGE, on CHECK's arithmetic) depend on
        # the descriptor alone: CHECK registers their results, so that DECIDE's
        # start decision comes from registers (docs/synth.md).
        computed = self._checks(d, derived)
        failed_at = Signal(len(computed) - 1)
        checks = ([(code, failed_at[i]) for i, (code, _) in enumerate(computed[:-1])]
                  + computed[-1:])
        units = self._units
        bad = Signal()
        m.d.comb += bad.eq(Cat(*(failed for _, failed in checks)).any())
        # What a load's context starts from.
        first_end = derived.first_end
        m.d.comb += [
            rc.new.valid.eq(1), rc.new.tag.eq(d.tag),
            rc.new.vmem.eq(d.space == DmaSpace.VMEM), rc.new.coalesced.eq(derived.coalesced),
            rc.new.rows.eq(d.rows), rc.new.row_bytes.eq(d.row_bytes),
            rc.new.chip_row.eq(d.chip_row), rc.new.stride.eq(d.ext_stride),
            rc.new.a.eq(d.ext_base), rc.new.end.eq(first_end),
            rc.new.na.eq(d.ext_base + d.ext_stride), rc.new.nend.eq(first_end + d.ext_stride),
            rc.new.be.eq(Cat(C(0, LG), d.ext_base[LG:] + 1)),
        ]
        if c.quant_formats:
            m.d.comb += [rc.new.quant.eq(self._quant), rc.new.format.eq(d.format),
                         rc.new.beats.eq(derived.total >> LG)]
        fsm_done = Signal()
        with m.FSM():
            with m.State("IDLE"):
                # After an error response, nothing new until the loads in flight drain.
                m.d.comb += self.cmd.ready.eq(~status.abort | ~rx0.valid)
                with m.If(self.cmd.valid & self.cmd.ready):
                    m.d.sync += [d.eq(self.cmd.payload), status.eq(0)]
                    self._take_units(m, self.cmd.payload)
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [
                    derived.last_off.eq(Mux(units.zero, 0, units.n_1 * d.ext_stride)),
                    derived.total.eq(units.n * d.row_bytes),
                    derived.first_end.eq(d.ext_base + d.row_bytes),
                    derived.room.eq(self._room(d)),
                    derived.coalesced.eq((d.ext_stride == d.row_bytes) | units.one),
                    failed_at.eq(Cat(*(failed for _, failed in computed[:-1]))),
                ]
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.comb += self.busy.eq(1)
                self._decide(m, d, derived, status, bad, checks)
            with m.State("RUN"):
                m.d.comb += [self.busy.eq(1), run.eq(1)]
                out = (~bursts.active | status.abort) & ~(bursts.burst.valid & bursts.burst.ready)
                with m.If(is_load):
                    # Its bursts are out: the receive context completes it, and
                    # the next descriptor may issue meanwhile.
                    with m.If(out):
                        m.d.comb += [rc.issued.eq(1), bursts.stop.eq(1)]
                        m.next = "IDLE"
                with m.Elif(out & (bursts.inflight == 0) & ~self.row_reader.waiting):
                    m.d.sync += self._store_run.eq(0)
                    m.next = "COMPLETE"
            with m.State("COMPLETE"):
                m.d.comb += [self.busy.eq(1), fsm_done.eq(1), clear.eq(1), bursts.stop.eq(1)]
                with m.If(self.done.ready):
                    m.next = "IDLE"
        return fsm_done

    def _take_units(self, m, desc):
        """Set the units of descriptor `desc` as it is taken: its rows, or a
        quantized load's tile-blocks (``rows >> log2(block)`` by format),
        with ``units - 1`` and whether they are 0 or 1. A cycle before CHECK,
        so that CHECK's ``(units - 1) * stride`` starts from registers, not
        from the format's decode (docs/synth.md, "The weight expander on the
        `fpga` chip")."""
        c = self.config
        n = Signal(len(desc.rows))
        m.d.comb += n.eq(desc.rows)
        if c.quant_formats:
            with m.If((desc.dir == DmaDir.LOAD) & (desc.format != QuantFormat.NONE)):
                with m.Switch(desc.format):
                    for name in c.quant_formats:
                        with m.Case(QuantFormat[name]):
                            m.d.comb += n.eq(desc.rows >> _log2(QUANT_INFO[QuantFormat[name]].block))
        u = self._units
        m.d.sync += [u.n.eq(n), u.n_1.eq(n - 1), u.zero.eq(n == 0), u.one.eq(n == 1)]

    def _decide(self, m, d, derived, status, bad, checks):
        """DECIDE: wait for the loads in flight if need be; then either complete
        with the first failed check's code, or start the descriptor."""
        bursts, rc = self.bursts, self.contexts
        is_load = d.dir == DmaDir.LOAD
        rx0, rx1 = rc.rx0, rc.rx1
        other = (self._quant != rx0.quant) if self.config.quant_formats else C(0, 1)
        with m.If(rx0.valid & (bad | ~is_load | other)):
            pass                  # a descriptor that receives no data, or a load of
                                  # the other kind (plain, quantized), waits for the loads
        for code, failed in checks:
            with m.Elif(failed):
                if code != DmaError.OK:
                    m.d.sync += status.err.eq(code)
                m.next = "COMPLETE"
        with m.Elif(~is_load | ~rx1.valid & ~rc.shift & (~status.abort | ~rx0.valid)):
            # (After an error response, a load accepted meanwhile starts
            # afresh once the loads before it have drained.)
            keep = status.abort & rx0.valid
            m.d.comb += [
                rc.alloc.eq(is_load), bursts.start.eq(1),
                self.row_reader.start.eq(1),
                bursts.setup.base.eq(d.ext_base),
                bursts.setup.seg_len.eq(Mux(derived.coalesced, derived.total, d.row_bytes)),
                bursts.setup.segments.eq(Mux(derived.coalesced, 1, self._units.n)),
            ]
            m.d.sync += [status.abort.eq(keep),
                         status.abort_err.eq(Mux(keep, status.abort_err, DmaError.OK)),
                         self._store_run.eq(~is_load)]
            m.next = "RUN"


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
        for port, lane in zip(dma.vmem_writes, vmem.dma_writes):
            wiring.connect(m, getattr(dma, port), getattr(vmem, lane))
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
