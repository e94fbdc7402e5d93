"""Delay lines that advance under a clock enable: register chains, and memory
rings for the long ones (docs/synth.md, "The fpga-llm chip").

A word carried `MEMORY_DELAY_MIN` enabled cycles or more costs one flip-flop
per bit and cycle as a chain of registers; as a ring of ``2**n`` words in a
memory it costs RAM, which the FPGA flows map to distributed or block RAM,
and no flip-flops. Both give the same word at every enabled cycle once the
line has been filled; they differ only in what they hold after a reset (the
registers zeros, the ring the words it held), which no valid element reads.
"""

from amaranth.hdl import Signal
from amaranth.lib.memory import Memory

__all__ = ["MEMORY_DELAY_MIN", "memory_rings", "delayed", "chain"]

# A value carried this many enabled cycles or more is a memory ring, not a
# chain of registers: in the fpga-llm chip's 4-stage lane, the words carried
# across its 96 stages were 25.6k of its 32.2k flip-flops (docs/vpu.md,
# "Pipeline depth"), and the array's activation skew (16 rows, 7 stages a
# row) 13.2k of the rest (docs/synth.md, "The fpga-llm chip").
MEMORY_DELAY_MIN = 16


def memory_rings(m, enable, rings, prefix=""):
    """A ring of ``2**n >= length`` words per ``(value, out, length)`` of
    `rings` (each length at least 3): one write pointer for all, stepped under
    `enable`; each ring's synchronous read, also under `enable`, of the word
    written ``length - 2`` enabled cycles before, and a register after it
    (`out`), give the value `length` enabled cycles late, as a chain of that
    many registers would. The register is there for timing: a block RAM's
    read data comes late in the cycle (on the ECP5 some 4 ns after the clock
    without its output register), and the words a ring carries feed deep
    logic (a lane's result select, a PE's multiplier)."""
    if not rings:
        return
    if min(length for _, _, length in rings) < 3:
        raise ValueError("a memory ring delays by 3 cycles or more")
    bits = max((length - 1).bit_length() for _, _, length in rings)
    ptr = Signal(bits, name=f"{prefix}ring_ptr")
    with m.If(enable):
        m.d.sync += ptr.eq(ptr + 1)
    for i, (value, out, length) in enumerate(rings):
        n = (length - 1).bit_length()
        ring = Memory(shape=len(value), depth=1 << n, init=[])
        m.submodules[f"{prefix}ring_{i}"] = ring
        w, r = ring.write_port(), ring.read_port()
        m.d.comb += [w.addr.eq(ptr[:n]), w.data.eq(value), w.en.eq(enable),
                     r.addr.eq(ptr[:n] - (length - 2)), r.en.eq(enable)]
        with m.If(enable):
            m.d.sync += out.eq(r.data)


def delayed(m, enable, value, length, name, rings):
    """`value` delayed `length` enabled cycles: a chain of registers named
    ``{name}_{i}`` when shorter than `MEMORY_DELAY_MIN`, else a signal `name`
    whose ring is appended to `rings` (built by `memory_rings`)."""
    if length >= MEMORY_DELAY_MIN:
        out = Signal(len(value), name=name)
        rings.append((value, out, length))
        return out
    return chain(m, enable, value, length, name)[-1]


def chain(m, enable, value, length, name):
    """Taps ``[value, value delayed 1, ..., delayed length]`` of a shift
    register ``{name}_1 ..`` that advances under `enable`."""
    taps = [value]
    for i in range(length):
        reg = Signal(len(value), name=f"{name}_{i + 1}")
        with m.If(enable):
            m.d.sync += reg.eq(taps[-1])
        taps.append(reg)
    return taps
