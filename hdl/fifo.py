"""Synchronous FIFOs whose state the proofs can name (docs/formal.md).

`Fifo` is cycle for cycle and bit for bit the queue of
`amaranth.lib.fifo.SyncFIFO` (the same ports, the same comb read of the entry
at the read pointer, the same level), and `BufferedFifo` that of
`amaranth.lib.fifo.SyncFIFOBuffered` (an output register in front of a queue
one entry shorter: an entry written into an empty queue is out a cycle
later), but their read and write pointers, their entries and the output
register are attributes: k-induction needs the lemma that the pointers and
the level agree (else a write may land on the entry being read and change a
waiting payload), and lemmas about what a queue holds, and the library keeps
all of these local to its ``elaborate``.
"""

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["Fifo", "BufferedFifo"]


class Fifo(wiring.Component):
    """A first-in first-out queue of ``depth`` entries of ``width`` bits.

    Parameters
    ----------
    width : int
    depth : int (at least 1)
    memory_bits : int
        The low ``memory_bits`` bits of each entry are kept in a memory (a
        comb read, as `SyncFIFO`'s: distributed RAM on an FPGA), the rest in
        registers that the proofs can name (``entries``). A wide queue whose
        data the lemmas need not name keeps its data in the memory.

    Interface
    ---------
    w_en : In(1), w_data : In(width), w_rdy : Out(1)
        Write ``w_data`` when ``w_en`` and ``w_rdy`` (not full).
    r_en : In(1), r_data : Out(width), r_rdy : Out(1)
        ``r_data`` is the oldest entry while ``r_rdy`` (not empty); ``r_en``
        and ``r_rdy`` remove it. A write to a full queue is refused even when
        a read frees an entry in the same cycle (as `SyncFIFO`).
    level : Out(range(depth + 1))
        Entries held.

    Attributes (for proofs)
    -----------------------
    produce, consume : Signal(range(depth))
        The write and read pointers.
    entries : list of Signal(width - memory_bits)
        The register part of the storage (bits ``memory_bits`` and up), entry
        ``(consume + i) % depth`` the i-th oldest. Not reset (a reset empties
        the queue, as a memory keeps its contents).
    """

    def __init__(self, width, depth, *, memory_bits=0):
        self.width, self.depth, self.memory_bits = width, depth, memory_bits
        super().__init__(_members("Fifo", width, depth, memory_bits))
        self.produce = Signal(range(depth), name="produce")
        self.consume = Signal(range(depth), name="consume")
        self.entries = [Signal(width - memory_bits, name=f"entry{i}", reset_less=True)
                        for i in range(depth)]

    def elaborate(self, platform):
        m = Module()
        depth, level = self.depth, self.level
        m.d.comb += [self.w_rdy.eq(level != depth), self.r_rdy.eq(level != 0)]
        do_write = self.w_en & self.w_rdy
        do_read = self.r_en & self.r_rdy
        m.d.comb += self.r_data[self.memory_bits:].eq(Array(self.entries)[self.consume])
        _ring(m, self, depth, level, do_write, do_read, "comb")
        return m

    def lemma(self):
        """The pointers agree with the level: the entries from the read
        pointer on, ``level`` of them, are the ones written and not read."""
        depth = self.depth
        held = Mux(self.produce >= self.consume, self.produce - self.consume,
                   depth + self.produce - self.consume)
        return (self.produce < depth) & (self.consume < depth) & (self.level <= depth) & (
            (held == self.level) | ((held == 0) & (self.level == depth)))

    def entry(self, i):
        """The register part of the i-th oldest entry (valid when ``i < level``)."""
        return Array(self.entries)[(self.consume + i) % self.depth]


class BufferedFifo(wiring.Component):
    """A first-in first-out queue of ``depth`` entries of ``width`` bits whose
    output is a register: cycle for cycle and bit for bit
    `amaranth.lib.fifo.SyncFIFOBuffered` (``r_data`` too, also while not
    ``r_rdy``). An inner queue of ``depth - 1`` entries (its memory read
    through a register, as a block RAM is) moves its oldest entry into the
    output register in any cycle the register is empty or being read;
    ``level`` counts both, so an entry written into an empty queue is
    counted a cycle before ``r_rdy`` shows it. A depth of 1 is the output
    register alone (written only while empty, as the library's).

    Parameters
    ----------
    width : int
    depth : int (at least 1)
    memory_bits : int
        The low ``memory_bits`` bits of each inner entry are kept in a memory
        with a registered read port (the library's block-RAM-friendly read),
        the rest in registers that the proofs can name (``entries``).

    Interface
    ---------
    As `Fifo`: ``w_en``, ``w_data``, ``w_rdy``, ``r_en``, ``r_data``,
    ``r_rdy``, ``level``; ``r_rdy`` is the output register's valid bit.

    Attributes (for proofs)
    -----------------------
    produce, consume : Signal(range(depth - 1))
        The inner queue's write and read pointers.
    inner_level : Signal(range(depth))
        Entries in the inner queue (``level`` is it plus ``r_rdy``).
    entries : list of Signal(width - memory_bits)
        The register part of the inner queue's entries (`entry`).
    out : Signal(width - memory_bits)
        The register part of ``r_data`` (the output register's). Neither is
        reset (the library's ``r_data`` and memory are not either).
    """

    def __init__(self, width, depth, *, memory_bits=0):
        self.width, self.depth, self.memory_bits = width, depth, memory_bits
        super().__init__(_members("BufferedFifo", width, depth, memory_bits))
        inner = max(1, depth - 1)
        self.produce = Signal(range(inner), name="produce")
        self.consume = Signal(range(inner), name="consume")
        self.inner_level = Signal(range(depth), name="inner_level")
        self.entries = [Signal(width - memory_bits, name=f"entry{i}", reset_less=True)
                        for i in range(depth - 1)]
        self.out = Signal(width - memory_bits, name="out", reset_less=True)

    def elaborate(self, platform):
        m = Module()
        depth, low, inner = self.depth, self.memory_bits, self.depth - 1
        m.d.comb += [self.level.eq(self.inner_level + self.r_rdy),
                     self.r_data[low:].eq(self.out)]
        if depth == 1:
            m.d.comb += self.w_rdy.eq(~self.r_rdy)
            load = self.w_en & self.w_rdy
            if low:
                out_low = Signal(low, name="out_low", reset_less=True)
                with m.If(load):
                    m.d.sync += out_low.eq(self.w_data[:low])
                m.d.comb += self.r_data[:low].eq(out_low)
            self._output(m, load, self.w_data[low:])
            return m
        m.d.comb += self.w_rdy.eq(self.inner_level != inner)
        do_write = self.w_en & self.w_rdy
        load = (self.inner_level != 0) & (~self.r_rdy | self.r_en)
        _ring(m, self, inner, self.inner_level, do_write, load, "sync")
        self._output(m, load, Array(self.entries)[self.consume])
        return m

    def _output(self, m, load, data):
        """The output register: `data` (the register part) in by `load`,
        emptied by a read without one."""
        with m.If(load):
            m.d.sync += [self.out.eq(data), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)

    def lemma(self):
        """The inner queue's pointers agree with its level, and an empty
        output register has at most one inner entry behind it (one written
        last cycle into an empty queue, moving out now)."""
        if self.depth == 1:
            return self.inner_level == 0
        inner = self.depth - 1
        held = Mux(self.produce >= self.consume, self.produce - self.consume,
                   inner + self.produce - self.consume)
        return ((self.produce < inner) & (self.consume < inner) & (self.inner_level <= inner)
                & ((held == self.inner_level) | ((held == 0) & (self.inner_level == inner)))
                & (self.r_rdy | (self.inner_level <= 1)))

    def entry(self, i):
        """The register part of the i-th oldest entry (valid when ``i <
        level``): the output register's first while ``r_rdy``, then the
        inner queue's."""
        if self.depth == 1:
            return self.out
        inner, entries = self.depth - 1, Array(self.entries)
        behind = entries[(self.consume + i) % inner]
        if i == 0:
            return Mux(self.r_rdy, self.out, behind)
        return Mux(self.r_rdy, entries[(self.consume + i - 1) % inner], behind)


def _members(kind, width, depth, memory_bits):
    """The interface both queues declare, after checking their parameters
    (messages name `kind`, the class)."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"{kind} depth must be an integer of at least 1, not {depth!r}")
    if not 0 <= memory_bits <= width:
        raise ValueError(f"{kind} memory_bits must be from 0 to the width {width}, "
                         f"not {memory_bits!r}")
    return {
        "w_en": In(1), "w_data": In(width), "w_rdy": Out(1),
        "r_en": In(1), "r_data": Out(width), "r_rdy": Out(1),
        "level": Out(range(depth + 1)),
    }


def _ring(m, fifo, depth, level, do_write, do_read, read_domain):
    """The ring of entries `Fifo` and `BufferedFifo` share: `depth` entries,
    the low ``memory_bits`` of each in a memory read in `read_domain`
    (``"comb"``: `Fifo`'s, as `SyncFIFO`; ``"sync"``, enabled by `do_read`:
    the buffered queue's, as a block RAM), the rest in ``fifo.entries``;
    written at ``fifo.produce`` by `do_write`, read at ``fifo.consume`` by
    `do_read`, `level` counting the entries held."""
    low = fifo.memory_bits
    if low:
        m.submodules.storage = storage = Memory(shape=low, depth=depth, init=[])
        w_port, r_port = storage.write_port(), storage.read_port(domain=read_domain)
        m.d.comb += [w_port.addr.eq(fifo.produce), w_port.data.eq(fifo.w_data[:low]),
                     w_port.en.eq(do_write), r_port.addr.eq(fifo.consume),
                     fifo.r_data[:low].eq(r_port.data)]
        if read_domain != "comb":
            m.d.comb += r_port.en.eq(do_read)
    with m.If(do_write):
        with m.Switch(fifo.produce):
            for i, entry in enumerate(fifo.entries):
                with m.Case(i):
                    m.d.sync += entry.eq(fifo.w_data[low:])
        m.d.sync += fifo.produce.eq(_next(fifo.produce, depth))
    with m.If(do_read):
        m.d.sync += fifo.consume.eq(_next(fifo.consume, depth))
    with m.If(do_write & ~do_read):
        m.d.sync += level.eq(level + 1)
    with m.If(do_read & ~do_write):
        m.d.sync += level.eq(level - 1)


def _next(pointer, depth):
    """The pointer after `pointer`, wrapping at `depth`."""
    return Mux(pointer == depth - 1, 0, pointer + 1)
