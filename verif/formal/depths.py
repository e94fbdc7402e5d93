"""Every proof's depth, computed from the unit's parameters in one place
(docs/formal.md, "The proofs"): the bound of a bounded proof must cover the
deepest situation its properties are about, and a number written down goes
stale when the configuration changes (the array proofs once used 14 cycles,
"latency 5", for a `weights_s3` array whose latency is 7).

Each function returns a `Depth`: the number and the formula it came from, as
the docs table and ``mxu prove`` print it.
"""

from dataclasses import dataclass

from mxu.hdl.array import array_latency, weight_load_cycles

__all__ = ["Depth", "STALL", "dma_depth", "quant_load_depth", "soft_reset_depth", "fetch_depth",
           "loop_depth", "array_depth", "vector_depth"]

# A stall that ends in a transfer: the cycle it starts and the one it ends in
# (every asserted hold rule's cover).
STALL = 2


@dataclass(frozen=True)
class Depth:
    """A proof's depth and its formula (with the values it was computed from)."""
    cycles: int
    formula: str


# DMA: a descriptor taken (1), checked (2), the AR/AW register (1), the row
# output and the completion (2).
DMA_PIPELINE = 6
# A load also needs two descriptors issued one after the other (taken, checked,
# decided, a one-burst RUN and back to IDLE: 5 cycles each) and a third taken
# (1) while both receive contexts wait for their data: the most descriptors a
# load holds.
DMA_ISSUE = 5


def dma_depth(config, load):
    """The longest burst through the pipeline, and a stall; a load at least
    two descriptors issued back to back and a third taken."""
    beats = config.dma_max_burst_beats
    burst = beats + DMA_PIPELINE + STALL
    if not load:
        return Depth(burst, f"max_burst ({beats}) + pipeline ({DMA_PIPELINE}) + stall "
                            f"({STALL}) = {burst}")
    third = 2 * DMA_ISSUE + STALL
    cycles = max(burst, third)
    return Depth(cycles, f"max(max_burst ({beats}) + pipeline ({DMA_PIPELINE}) + stall "
                         f"({STALL}), 2 x issue ({DMA_ISSUE}) + 2 (a third taken)) = {cycles}")


def quant_load_depth(config):
    """A quantized load's first rows out of the expander: the pipeline, a
    tile-block's header beats and the code beats of its first group of rows
    (the longest of the chip's formats), the expander's latency, its
    output slice, and a stall; at least the plain load's depth (`dma_depth`)."""
    from mxu.hdl.expander import Expander
    from mxu.hdl.quant import QUANT_INFO, QuantFormat
    bits = config.axi_data_bits
    infos = [QUANT_INFO[QuantFormat[f]] for f in config.quant_formats]
    header = max(-(-config.cols * i.header_bytes * 8 // bits) for i in infos)
    group = max(-(-config.quant_rows * config.cols * i.bits // bits) for i in infos)
    # The expander's rows reach VMEM through a register slice (one cycle).
    rows = DMA_PIPELINE + header + group + Expander.LATENCY + 1 + STALL
    plain = dma_depth(config, True)
    cycles = max(rows, plain.cycles)
    return Depth(cycles, f"max(pipeline ({DMA_PIPELINE}) + header beats ({header}) + a group's "
                         f"code beats ({group}) + expander ({Expander.LATENCY}) + slice (1) + stall "
                         f"({STALL}), the plain load's {plain.cycles}) = {cycles}")


def soft_reset_depth(config, load):
    """A burst out (the pipeline), then a soft reset's drain: the rest of its
    beats (the longest burst), its response (1), the reset (1), and the bus
    after it (1). (The deeper situations of one direction, three loads open
    among them, are the plain DMA proofs'.)"""
    beats = config.dma_max_burst_beats
    cycles = DMA_PIPELINE + beats + 3
    return Depth(cycles, f"pipeline ({DMA_PIPELINE}) + max_burst ({beats}) + 3 (response, "
                         f"reset, after it) = {cycles}")


def fetch_depth(config):
    """A start (1), the AR register and handshake (2), a whole longest burst
    (16 beats), through the gearbox and the queue (3), and a stall."""
    from mxu.hdl.fetch import _BURST_BEATS
    cycles = 1 + 2 + _BURST_BEATS + 3 + STALL
    return Depth(cycles, f"start (1) + AR (2) + burst ({_BURST_BEATS}) + gearbox and queue "
                         f"(3) + stall ({STALL}) = {cycles}")


def loop_depth(config):
    """A LOOP word (1), a body of `pairs` instruction pairs stored (two
    words a pair), two iterations issued (one instruction every two cycles),
    and a stall; a longer body takes the same index comparisons."""
    pairs = min(2, config.loop_body_instrs)
    cycles = 1 + 2 * pairs + 2 * 2 * pairs + STALL
    return Depth(cycles, f"LOOP (1) + body of {pairs} pairs ({2 * pairs}) + 2 iterations "
                         f"({4 * pairs}) + stall ({STALL}) = {cycles}")


def array_depth(rows, cols, mac_stages, weight_rows=1):
    """Two tiles loaded back to back (the weight queue full), the second
    switching in (2), its wave reaching the last PE (the array's latency),
    and a stall (and one cycle for the result to leave)."""
    beats = weight_load_cycles(rows, weight_rows)
    latency = array_latency(rows, cols, mac_stages)
    cycles = 2 * beats + 2 + latency + STALL + 1
    return Depth(cycles, f"2 tiles x {beats} beats + switch (2) + latency ({latency}) + "
                         f"stall ({STALL}) + 1 = {cycles}")


def vector_depth(alu_latency, registered=False):
    """A VECTOR taken (1), into the issue stage (1), its reads and their rows
    into the buffers (2), the ALU (with `registered` handshakes, its input
    stage and output queue: 2 more), the write (1), and a stall."""
    around = 2 if registered else 0
    cycles = 1 + 1 + 2 + alu_latency + around + 1 + STALL
    return Depth(cycles, f"intake (2) + reads (2) + ALU ({alu_latency}"
                         + (f" + {around} registered" if registered else "")
                         + f") + write (1) + stall ({STALL}) = {cycles}")
