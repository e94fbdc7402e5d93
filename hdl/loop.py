"""The loop expander: LOOP instructions become the instruction stream they stand
for, in hardware, so that a program's size does not grow with the problem
(docs/isa.md, "LOOP").

``LOOP count, body`` is followed by ``body`` pairs of words: an instruction and
its *delta*. The expander issues, for i = 0 .. count-1 and each pair j in order,
the instruction ``word_j + i * delta_j`` (a 128-bit sum, modulo 2^128). Because
an instruction is a packed struct, adding a delta whose fields are the per-field
steps advances every address field by its own stride, as long as no field
overflows -- which the compiler checks when it builds the loop.

The chip chains two expanders between `InstructionFetch` and the `Controller`:
the first expands the outer LOOPs, whose bodies may hold an inner LOOP and its
pairs as plain words; the second expands those. So LOOPs nest two deep. Each
issued instruction carries the pc of its word in the program, so that errors
point into the body. A LOOP whose fields are illegal is passed on unexpanded,
and so is a third level of nesting: the decoder does not know the LOOP opcode
and stops the chip with ILLEGAL_INSTR at its pc.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .fetch import FetchedInstr
from .isa import INSTR_BITS, Header, LoopInstr, Opcode

__all__ = ["LoopExpander", "loop_is_legal"]


def loop_is_legal(config, instr, pc, length):
    """The value "`instr` (a `LoopInstr` view at `pc` of a `length`-instruction
    program) is a LOOP the expander runs"."""
    return ((instr.count != 0) & (instr.body != 0) & (instr.body <= config.loop_body_instrs)
            & (instr.deps.as_value() == 0) & (instr.flags == 0) & (instr.reserved == 0)
            & (pc + 2 * instr.body < length))


class LoopExpander(wiring.Component):
    """Expands LOOP instructions of the fetched stream (see the module docstring).

    Parameters
    ----------
    config : ChipConfig
        ``loop_body_instrs`` is the longest body it stores.

    Interface
    ---------
    i : In(stream.Signature(FetchedInstr))
        From `InstructionFetch`.
    o : Out(stream.Signature(FetchedInstr))
        To the `Controller`: every instruction but legal LOOPs and their body
        words, with the bodies repeated ``count`` times.
    length : In(32)
        The program's length in instructions: a LOOP whose body would run past
        it is illegal.

    A synchronous reset (the chip's ``start``) abandons any loop in progress.
    The body store issues one instruction every two cycles.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "i": In(stream.Signature(FetchedInstr)),
            "o": Out(stream.Signature(FetchedInstr)),
            "length": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.config.loop_body_instrs
        entry = data.StructLayout({"word": INSTR_BITS, "delta": INSTR_BITS, "pc": 32})
        m.submodules.body = body = Memory(shape=entry, depth=depth, init=[])
        read, write = body.read_port(), body.write_port()

        fetched = FetchedInstr(self.i.payload)
        loop = LoopInstr(fetched.word)
        is_loop = Header(fetched.word[:16]).opcode == Opcode.LOOP
        count = Signal(32)
        length = Signal(range(depth + 1))
        index = Signal(range(depth))
        iteration = Signal(32)
        held_word = Signal(INSTR_BITS)
        held_pc = Signal(32)
        current = read.data

        with m.FSM():
            with m.State("PASS"):
                take = is_loop & loop_is_legal(self.config, loop, fetched.pc, self.length)
                m.d.comb += [
                    self.o.valid.eq(self.i.valid & ~take),
                    self.o.payload.eq(self.i.payload),
                    self.i.ready.eq(take | self.o.ready),
                ]
                with m.If(self.i.valid & take):
                    m.d.sync += [count.eq(loop.count), length.eq(loop.body), index.eq(0)]
                    m.next = "WORD"
            with m.State("WORD"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [held_word.eq(fetched.word), held_pc.eq(fetched.pc)]
                    m.next = "DELTA"
            with m.State("DELTA"):
                m.d.comb += [
                    self.i.ready.eq(1),
                    write.addr.eq(index),
                    write.data.word.eq(held_word), write.data.delta.eq(fetched.word),
                    write.data.pc.eq(held_pc),
                    write.en.eq(self.i.valid),
                ]
                with m.If(self.i.valid):
                    with m.If(index == length - 1):
                        m.d.sync += [index.eq(0), iteration.eq(0)]
                        m.next = "READ"
                    with m.Else():
                        m.d.sync += index.eq(index + 1)
                        m.next = "WORD"
            with m.State("READ"):
                m.d.comb += read.addr.eq(index)
                m.next = "ISSUE"
            with m.State("ISSUE"):
                m.d.comb += [
                    read.addr.eq(index),
                    self.o.valid.eq(1),
                    self.o.payload.word.eq(current.word),
                    self.o.payload.pc.eq(current.pc),
                    write.addr.eq(index),
                    write.data.word.eq(current.word + current.delta),
                    write.data.delta.eq(current.delta), write.data.pc.eq(current.pc),
                    write.en.eq(self.o.ready),
                ]
                with m.If(self.o.ready):
                    with m.If(index == length - 1):
                        m.d.sync += [index.eq(0), iteration.eq(iteration + 1)]
                        with m.If(iteration == count - 1):
                            m.next = "PASS"
                        with m.Else():
                            m.next = "READ"
                    with m.Else():
                        m.d.sync += index.eq(index + 1)
                        m.next = "READ"
        return m
