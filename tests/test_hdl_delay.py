"""Delay lines (`mxu.hdl.delay`): a chain of registers below `MEMORY_DELAY_MIN`
cycles, a memory ring from it on; both delay by exactly their length in
enabled cycles."""

import numpy as np
import pytest
from amaranth.hdl import Fragment, Module, Signal
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from mxu.hdl.delay import MEMORY_DELAY_MIN, delayed, memory_rings

LENGTHS = [1, MEMORY_DELAY_MIN - 1, MEMORY_DELAY_MIN, 21, 64, 105]


def _lines(lengths):
    m, enable, value = Module(), Signal(), Signal(16)
    rings = []
    outs = [delayed(m, enable, value, n, f"line{n}", rings) for n in lengths]
    memory_rings(m, enable, rings)
    return m, enable, value, outs, rings


def test_long_lines_are_rings_and_short_ones_registers():
    m, _, value, outs, rings = _lines(LENGTHS)
    assert [n for _, _, n in rings] == [n for n in LENGTHS if n >= MEMORY_DELAY_MIN]
    for i, (_, _, n) in enumerate(rings):
        ring = m.submodules[f"ring_{i}"]
        assert isinstance(ring, Memory) and ring.depth == 1 << (n - 1).bit_length()
    with pytest.raises(AttributeError):
        m.submodules[f"ring_{len(rings)}"]
    # A register chain's last register is named after its length.
    assert outs[0].name == "line1_1" and outs[1].name == f"line{MEMORY_DELAY_MIN - 1}_15"
    assert delayed(m, Signal(), value, 0, "none", []) is value
    Fragment.get(m, None)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_line_delays_by_its_length_in_enabled_cycles(seed):
    """Random words under a random enable: once `length` words are in (the
    fill, which no valid element reads), each line's output after a clock
    edge is the word taken `length` enabled edges before it, counting the
    edge itself as the first."""
    m, enable, value, outs, _ = _lines(LENGTHS)
    rng = np.random.default_rng(seed)
    cycles = 400
    words = rng.integers(0, 1 << 16, cycles)
    enables = rng.random(cycles) < 0.7
    seen = []

    async def bench(ctx):
        for word, en in zip(words, enables):
            ctx.set(value, int(word))
            ctx.set(enable, bool(en))
            await ctx.tick()
            seen.append([ctx.get(o) for o in outs])

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    written = [int(w) for w, en in zip(words, enables) if en]
    for k, n in enumerate(LENGTHS):
        count, checked = 0, 0
        for t, en in enumerate(enables):
            count += bool(en)          # enabled cycles up to and including t
            if count >= n:
                assert seen[t][k] == written[count - n], f"length {n}, cycle {t}"
                checked += 1
        assert checked > 100


def test_a_ring_of_two_cycles_is_refused():
    m = Module()
    m._MustUse__silence = True       # built only to be refused
    with pytest.raises(ValueError, match="a memory ring delays by 3 cycles or more"):
        memory_rings(m, Signal(), [(Signal(4), Signal(4), 2)])
