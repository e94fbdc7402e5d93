"""`mxu.hdl.fifo.Fifo` against `amaranth.lib.fifo.SyncFIFO`: the same inputs
(random writes, reads and resets) give the same outputs in every cycle, with
the storage in registers, in a memory, or split between the two."""

import random

import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib.fifo import SyncFIFO
from amaranth.sim import Simulator

from mxu.hdl.fifo import Fifo


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
            for fifo in (ref, dut):
                ctx.set(fifo.w_en, w_en)
                ctx.set(fifo.r_en, r_en)
                ctx.set(fifo.w_data, data)
            ctx.set(clear, reset)
            for name in ("w_rdy", "r_rdy", "level", "r_data"):
                assert ctx.get(getattr(dut, name)) == ctx.get(getattr(ref, name)), \
                    f"depth {depth}, cycle {cycle}: {name}"
            await ctx.tick()
    sim.add_testbench(bench)
    sim.run()


def test_fifo_rejects_bad_parameters():
    with pytest.raises(ValueError, match="depth must be an integer of at least 1, not 0"):
        Fifo(8, 0)
    with pytest.raises(ValueError, match="memory_bits must be from 0 to the width 8, not 9"):
        Fifo(8, 2, memory_bits=9)
