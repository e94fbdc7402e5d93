"""VMEM: the banked bf16 scratchpad, and the banked row memory it is made of.

Address map (see ``docs/memory.md``)
------------------------------------
VMEM is addressed in **rows**, never in bytes. Row ``r`` (``0 <= r <
config.vmem_rows``) holds ``config.vmem_row_elems`` bf16 elements; element ``e``
is bits ``[16e, 16e+16)`` of the row word, so a row read from external memory
(little-endian) lands with its first element in element 0. Row ``r`` lives in bank
``r % banks`` at bank index ``r // banks``.

Banking
-------
Every bank is one simple-dual-port RAM (one write port, one synchronous read
port): the DMA write and an array read never conflict, whatever their rows. The
*read* requestors (array activations, the weight lanes, DMA store) share a
bank's read port, and the higher-priority one always wins: the array read port
is ``always_ready``; the weight lanes never meet each other on a bank. Both stream consecutive rows, so they sit on the same bank at
most every other cycle, while the DMA needs a VMEM row only every
``vmem_row_bytes / axi_data_bytes`` (>= 2 for the default) cycles; its prefetch
absorbs the lost cycles. See ``docs/memory.md`` for the full argument.
"""

from amaranth.hdl import C, Module, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .numerics import BF16

__all__ = ["ReadPortSignature", "WritePortSignature", "RowWrite", "BankedRowMemory", "Vmem",
           "vmem_row_layout", "lane_port_names"]


def _addr_shape(depth):
    return unsigned(max(1, (depth - 1).bit_length()))


def RowWrite(addr_shape, data_shape):
    """Payload of a row write: ``addr`` (row) and ``data`` (the whole row)."""
    return data.StructLayout({"addr": addr_shape, "data": data_shape})


class ReadPortSignature(wiring.Signature):
    """A row read port, seen from the requestor.

    Members: ``req``: Out(stream of the row address); ``resp``: In(always-ready
    stream of the row data). ``resp.valid`` rises exactly one cycle after a
    ``req`` handshake, with the row as it was before any write in that same cycle
    (read-first). If `always_ready`, ``req.ready`` is constantly 1: a request is
    never refused (the port has the top priority of its memory).
    """

    def __init__(self, addr_shape, data_shape, *, always_ready=False):
        self.addr_shape, self.data_shape, self.always_ready = addr_shape, data_shape, always_ready
        super().__init__({
            "req": Out(stream.Signature(addr_shape, always_ready=always_ready)),
            "resp": In(stream.Signature(data_shape, always_ready=True)),
        })

    def __eq__(self, other):
        return (type(other) is ReadPortSignature and self.members == other.members)


def WritePortSignature(addr_shape, data_shape, *, always_ready=False):
    """A row write port, seen from the requestor: a ``stream.Signature`` of
    `RowWrite` (``addr``, ``data``). A handshake writes the whole row. If
    `always_ready`, the write is never refused (top priority)."""
    return stream.Signature(RowWrite(addr_shape, data_shape), always_ready=always_ready)


class BankedRowMemory(wiring.Component):
    """Rows of `width` bits in `banks` simple-dual-port banks, with any number of
    prioritised read and write requestors.

    Parameters
    ----------
    width : int
        Bits per row.
    depth : int
        Number of rows (any value >= banks).
    banks : int
        Number of banks, a power of two; row ``r`` is in bank ``r % banks``.
    read_ports, write_ports : int
        One boolean per read (write) requestor, in priority order (port 0
        first): True makes the port ``always_ready`` (only port 0 may be, since
        it wins every bank conflict). A port waits while a higher-priority port
        uses its bank.

    Interface: ``read[i]``: In(ReadPortSignature); ``write[i]``: In(WritePortSignature).
    """

    def __init__(self, *, width, depth, banks, read_ports, write_ports):
        self._MustUse__silence = True       # not yet valid: no "never used" warning
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"BankedRowMemory width must be a positive integer, not {width!r}")
        if not isinstance(banks, int) or banks < 1 or banks & (banks - 1):
            raise ValueError(f"BankedRowMemory banks must be a power of two, not {banks!r}")
        if not isinstance(depth, int) or depth < banks:
            raise ValueError(
                f"BankedRowMemory depth must be an integer >= banks ({banks}), not {depth!r}")
        for name, ports in (("read_ports", read_ports), ("write_ports", write_ports)):
            ports = list(ports) if isinstance(ports, (list, tuple)) else None
            if not ports or any(not isinstance(p, bool) for p in ports) or any(ports[1:]):
                raise ValueError(
                    f"BankedRowMemory {name} must be a non-empty list of booleans (always_ready "
                    f"per port, in priority order) where only port 0 may be True, not {ports!r}")
        self._MustUse__silence = False
        self.width, self.depth, self.banks = width, depth, banks
        self.addr_shape = _addr_shape(depth)
        members = {}
        for i, ar in enumerate(read_ports):
            members[f"read{i}"] = In(ReadPortSignature(self.addr_shape, width, always_ready=ar))
        for i, ar in enumerate(write_ports):
            members[f"write{i}"] = In(WritePortSignature(self.addr_shape, width, always_ready=ar))
        super().__init__(members)
        self.read = [getattr(self, f"read{i}") for i in range(len(read_ports))]
        self.write = [getattr(self, f"write{i}") for i in range(len(write_ports))]

    def elaborate(self, platform):
        m = Module()
        lg = (self.banks - 1).bit_length()
        bank_depth = -(-self.depth // self.banks)

        def bank_of(addr):
            return addr[:lg] if lg else 0

        def index_of(addr):
            return addr[lg:] if lg else addr

        rd_q = [Signal(range(self.banks), name=f"rd_bank{i}") for i in range(len(self.read))]
        for b in range(self.banks):
            mem = memory.Memory(shape=self.width, depth=bank_depth, init=[])
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=())
            # Writes: the first requestor (in priority order) on this bank wins.
            taken = C(0, 1)
            for i, port in enumerate(self.write):
                here = port.valid & (bank_of(port.payload.addr) == b)
                with m.If(here & ~taken):
                    m.d.comb += [wp.en.eq(1), wp.addr.eq(index_of(port.payload.addr)),
                                 wp.data.eq(port.payload.data)]
                taken = taken | here
            # Reads: same, one synchronous read per bank per cycle.
            taken = C(0, 1)
            for i, port in enumerate(self.read):
                here = port.req.valid & (bank_of(port.req.payload) == b)
                with m.If(here & ~taken):
                    m.d.comb += [rp.en.eq(1), rp.addr.eq(index_of(port.req.payload))]
                taken = taken | here
            setattr(self, f"_rp{b}", rp)

        for kind, ports, addr_of, valid_of in (
                ("w", self.write, lambda p: p.payload.addr, lambda p: p.valid),
                ("r", self.read, lambda p: p.req.payload, lambda p: p.req.valid)):
            for i, port in enumerate(ports):
                blocked = C(0, 1)
                for j in range(i):
                    other = ports[j]
                    blocked = blocked | (valid_of(other) & (bank_of(addr_of(other)) ==
                                                           bank_of(addr_of(port))))
                ready = port.ready if kind == "w" else port.req.ready
                if not isinstance(ready, Signal):
                    continue            # always_ready: ready is the constant 1
                if kind == "w":
                    m.d.comb += port.ready.eq(~blocked)
                else:
                    m.d.comb += port.req.ready.eq(~blocked)

        for i, port in enumerate(self.read):
            fire = port.req.valid & port.req.ready
            m.d.sync += port.resp.valid.eq(fire)
            with m.If(fire):
                m.d.sync += rd_q[i].eq(bank_of(port.req.payload))
            with m.Switch(rd_q[i]):
                for b in range(self.banks):
                    with m.Case(b):
                        m.d.comb += port.resp.payload.eq(getattr(self, f"_rp{b}").data)
        return m


def lane_port_names(base, lanes):
    """Names of a port's `lanes` lanes: `base` for lane 0, ``base + str(i)``
    for lane i >= 1 (``weight_read``, ``weight_read1``, ...)."""
    return [base] + [f"{base}{i}" for i in range(1, lanes)]


def vmem_row_layout(config):
    """A VMEM row: ``config.vmem_row_elems`` bf16, element 0 in the low bits."""
    return data.ArrayLayout(BF16, config.vmem_row_elems)


class Vmem(wiring.Component):
    """The bf16 scratchpad: ``config.vmem_rows`` rows of ``config.vmem_row_elems``
    bf16 in ``config.vmem_banks`` banks (module docstring: address map, banking).

    Parameters
    ----------
    config : ChipConfig
    weight_port : bool
        Add the weight read ports (below ``array_read`` in priority), so that
        the next weight tile loads while activations stream.

    Interface
    ---------
    array_read : In(ReadPortSignature(addr, row, always_ready=True))
        The array's activation/weight read port; never refused.
    weight_read, weight_read1, ... : In(ReadPortSignature(addr, row)), if `weight_port`
        The array's weight read ports, one per lane of the weight port
        (``config.weight_rows_per_cycle``; `lane_port_names`); each waits while
        ``array_read`` uses its bank. Lane i reads the rows ``i mod lanes`` of a
        LOADW: lanes never share a bank (docs/memory.md).
    dma_read : In(ReadPortSignature(addr, row))
        The DMA's read port for stores; waits while the array reads the same bank.
    dma_write : In(WritePortSignature(addr, row))
        The DMA's write port for loads; first in priority, so never refused
        (``ready`` is kept in the signature for uniformity with the accumulator
        memory).
    dma_write1, ... : In(WritePortSignature(addr, row)), with
        ``config.weight_rows_per_cycle`` > 1
        More DMA write ports, one per further lane, next in priority: the
        rows r, r+1, ..., r+lanes-1 written in one cycle are in distinct banks,
        so none is refused; a port whose bank an earlier port writes waits.
        For a weight expander that writes several rows a cycle.
    vector_write : In(WritePortSignature(addr, row)), with ``config.vpu``
        The vector engine's bf16 result rows; waits while a DMA port writes its bank.
    """

    def __init__(self, config, *, weight_port=False):
        self.config = config
        self.weight_port = weight_port
        self.addr_shape = _addr_shape(config.vmem_rows)
        row = vmem_row_layout(config)
        lanes = config.weight_rows_per_cycle
        self.weight_reads = lane_port_names("weight_read", lanes) if weight_port else []
        self.dma_writes = lane_port_names("dma_write", lanes)
        members = {
            "array_read": In(ReadPortSignature(self.addr_shape, row, always_ready=True)),
            "dma_read": In(ReadPortSignature(self.addr_shape, row)),
        }
        for name in self.weight_reads:
            members[name] = In(ReadPortSignature(self.addr_shape, row))
        for name in self.dma_writes:
            members[name] = In(WritePortSignature(self.addr_shape, row))
        if config.vpu:
            members["vector_write"] = In(WritePortSignature(self.addr_shape, row))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        # Read priority: array activations, then the weight lanes, then the DMA.
        reads = [True] + [False] * (len(self.weight_reads) + 1)
        writes = len(self.dma_writes) + c.vpu
        m.submodules.mem = mem = BankedRowMemory(width=16 * c.vmem_row_elems, depth=c.vmem_rows,
                                                 banks=c.vmem_banks, read_ports=reads,
                                                 write_ports=[False] * writes)
        _connect_read(m, self.array_read, mem.read[0])
        for i, name in enumerate(self.weight_reads):
            _connect_read(m, getattr(self, name), mem.read[1 + i])
        _connect_read(m, self.dma_read, mem.read[-1])
        # The DMA's ports stay refusable so that the DMA's code is the same for
        # VMEM and the accumulator memory (and the vector engine may write too).
        for i, name in enumerate(self.dma_writes):
            _connect_write(m, getattr(self, name), mem.write[i])
        if c.vpu:
            _connect_write(m, self.vector_write, mem.write[-1])
        return m


def _connect_read(m, outer, inner):
    m.d.comb += [inner.req.valid.eq(outer.req.valid), inner.req.payload.eq(outer.req.payload),
                 outer.resp.valid.eq(inner.resp.valid),
                 outer.resp.payload.eq(inner.resp.payload)]
    if not outer.signature.members["req"].signature.always_ready:
        m.d.comb += outer.req.ready.eq(inner.req.ready)


def _connect_write(m, outer, inner):
    m.d.comb += [inner.valid.eq(outer.valid), inner.payload.eq(outer.payload)]
    if not outer.signature.always_ready:
        m.d.comb += outer.ready.eq(inner.ready)
