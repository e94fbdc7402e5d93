"""`mxu.hdl.fifo.Fifo` against `amaranth.lib.fifo.SyncFIFO`, `BufferedFifo` against
`SyncFIFOBuffered`: the same inputs
(random writes, reads and resets) give the same outputs in every cycle, with
the storage in registers, in a memory, or split between the two."""

import random

import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.sim import Simulator

from mxu.hdl.fifo import BufferedFifo, Fifo


def _offer_both(ctx, fifos, w_en, r_en, data, reset, where):
    """Drive the reference and the design alike, then check that every output
    of theirs agrees (`fifos`: reference, design, and their common clear)."""
    ref, dut, clear = fifos
    for fifo in (ref, dut):
        ctx.set(fifo.w_en, w_en)
        ctx.set(fifo.r_en, r_en)
        ctx.set(fifo.w_data, data)
    ctx.set(clear, reset)
    for name in ("w_rdy", "r_rdy", "level", "r_data"):
        assert ctx.get(getattr(dut, name)) == ctx.get(getattr(ref, name)), f"{where}: {name}"


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("memory_bits", [0, 5, 8])
def test_fifo_matches_syncfifo(depth, memory_bits):
    m = Module()
    clear = Signal()
    ref = m.submodules.ref = ResetInserter(clear)(SyncFIFO(width=8, depth=depth))
    dut = m.submodules.dut = ResetInserter(clear)(Fifo(8, depth, memory_bits=memory_bits))
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def bench(ctx):
        rng = random.Random(depth * 10 + memory_bits)
        for cycle in range(2000):
            w_en, r_en = rng.random() < 0.6, rng.random() < 0.5
            data, reset = rng.randrange(256), rng.random() < 0.02
            _offer_both(ctx, (ref, dut, clear), w_en, r_en, data, reset,
                        f"depth {depth}, cycle {cycle}")
            await ctx.tick()
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("cls", [Fifo, BufferedFifo], ids=lambda c: c.__name__)
def test_fifo_rejects_bad_parameters(cls):
    with pytest.raises(ValueError, match="depth must be an integer of at least 1, not 0"):
        cls(8, 0)
    with pytest.raises(ValueError, match="memory_bits must be from 0 to the width 8, not 9"):
        cls(8, 2, memory_bits=9)


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("memory_bits", [0, 5, 8])
def test_buffered_fifo_matches_syncfifobuffered(depth, memory_bits):
    """`BufferedFifo` against `SyncFIFOBuffered`: random writes, reads and
    resets, every output equal in every cycle (``r_data`` also while not
    ``r_rdy``), and the register part of each held entry (`entry`) the one
    written that many entries ago."""
    m = Module()
    clear = Signal()
    ref = m.submodules.ref = ResetInserter(clear)(SyncFIFOBuffered(width=8, depth=depth))
    dut = m.submodules.dut = ResetInserter(clear)(
        BufferedFifo(8, depth, memory_bits=memory_bits))
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def bench(ctx):
        rng = random.Random(depth * 10 + memory_bits)
        held = []                       # the entries written and not read, oldest first
        for cycle in range(3000):
            # Phases of mostly writes and mostly reads, so the queue fills and empties.
            w_p = 0.8 if (cycle // 50) % 2 else 0.3
            w_en, r_en = rng.random() < w_p, rng.random() < 1.1 - w_p
            data, reset = rng.randrange(256), rng.random() < 0.01
            _offer_both(ctx, (ref, dut, clear), w_en, r_en, data, reset,
                        f"depth {depth}, cycle {cycle}")
            level = ctx.get(dut.level)
            assert level == len(held), f"depth {depth}, cycle {cycle}: level"
            for i, value in enumerate(held):
                assert ctx.get(dut.entry(i)) == value >> memory_bits, \
                    f"depth {depth}, cycle {cycle}: entry {i}"
            wrote, read = w_en and ctx.get(dut.w_rdy), r_en and ctx.get(dut.r_rdy)
            if read:
                held.pop(0)
            if wrote:
                held.append(data)
            if reset:
                held = []
            await ctx.tick()
    sim.add_testbench(bench)
    sim.run()
