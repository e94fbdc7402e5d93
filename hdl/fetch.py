"""Instruction fetch: reads the program from external memory over AXI4.

The program is ``length`` 16-byte instructions at ``base``. After the last one the
fetcher hands out a zero word (opcode 0, illegal), so a program without HALT stops
with ILLEGAL_INSTR at pc = length instead of running into whatever follows.
"""

from amaranth.hdl import C, Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import AXI4Signature, AxiBurst, AxiResp, segment_beats
from .isa import INSTR_BITS, INSTR_BYTES

__all__ = ["FetchedInstr", "InstructionFetch", "FETCH_AXI_ID", "program_alignment"]

FETCH_AXI_ID = 1
_BURST_BEATS = 16
_QUEUE_INSTRS = 64

FetchedInstr = data.StructLayout({"word": INSTR_BITS, "pc": 32})


def program_alignment(config):
    """Byte alignment a program base needs: an instruction, and a whole bus beat."""
    return max(INSTR_BYTES, config.axi_data_bytes)


class InstructionFetch(wiring.Component):
    """AXI4 read master that streams a program's instructions in order.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    start : In(1)
        Pulse: latch ``base``/``length`` and begin.
    base, length : In(32)
        Byte address (aligned to `program_alignment`) and instruction count.
    stop : In(1)
        Issue no further bursts (bursts already issued are drained).
    instr : Out(stream.Signature(FetchedInstr))
    error : Out(1)
        Sticky until ``start``: the program lies outside external memory, is
        misaligned, or a read returned SLVERR/DECERR.
    error_pc : Out(32)
        With ``error``: the pc of the first instruction that was not delivered
        (0 for a misplaced program).
    busy : Out(1)
        A burst is outstanding.
    hungry : Out(1)
        The queue is at most half full (and has room for a whole burst) and
        the program has beats left to request: the chip holds back the load
        DMA's new bursts (`mxu.hdl.top`), so that this one's come back behind
        fewer weight beats.
    axi : Out(AXI4Signature); only AR and R are used, with ARID = FETCH_AXI_ID.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "start": In(1), "base": In(32), "length": In(32), "stop": In(1),
            "instr": Out(stream.Signature(FetchedInstr)),
            "error": Out(1), "error_pc": Out(32), "busy": Out(1), "hungry": Out(1),
            "axi": Out(AXI4Signature(addr_width=config.axi_addr_bits,
                                     data_width=config.axi_data_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        bb = c.axi_data_bytes
        lg = (bb - 1).bit_length()
        axi = self.axi
        queue = fifo.SyncFIFOBuffered(width=INSTR_BITS + 32, depth=_QUEUE_INSTRS)
        # A run that stopped (HALT, error) can leave instructions behind: start afresh.
        m.submodules.queue = ResetInserter(self.start)(queue)
        m.d.comb += [
            self.instr.valid.eq(queue.r_rdy),
            self.instr.payload.as_value().eq(queue.r_data),
            queue.r_en.eq(self.instr.ready),
        ]

        active = Signal()
        addr = Signal(64)          # next burst address
        beats_left = Signal(64)    # bus beats of the program not yet requested (a
                                   # register: no 64-bit subtract into the AR decision)
        emitted = Signal(32)       # instructions handed to the queue (pc of the next)
        length = Signal(32)
        outstanding = Signal(range(_BURST_BEATS + 1))
        end_sent = Signal()
        misaligned = (self.base % program_alignment(c)) != 0
        too_far = (self.base + self.length * INSTR_BYTES) > c.ext_mem_bytes
        with m.If(self.start):
            m.d.sync += [
                active.eq(~misaligned & ~too_far), self.error.eq(misaligned | too_far),
                addr.eq(self.base),
                beats_left.eq(segment_beats(self.base, self.length * INSTR_BYTES, lg)),
                emitted.eq(0), length.eq(self.length), end_sent.eq(0), self.error_pc.eq(0),
            ]

        # ---- AR: one burst at a time, only when the queue has room for all of it.
        per_beat = max(1, bb // INSTR_BYTES)
        # A burst must fit the queue with room to spare (the condition below),
        # or a wide bus (several instructions a beat) would wait for room forever.
        most = min(_BURST_BEATS, (_QUEUE_INSTRS - 2) // per_beat)
        # Unsigned, in a signal of its own: compared with the 64-bit counts as a
        # signed value it became a 65-bit sign extension, which the Verilated
        # model rebuilt bit by bit every cycle (docs/simulation.md).
        to_boundary = Signal(range(4096 // bb + 1))
        m.d.comb += to_boundary.eq((4096 - addr[:12]).as_unsigned() >> lg)
        beats = Signal(range(_BURST_BEATS + 1))
        m.d.comb += beats.eq(Mux(beats_left < most,
                                 Mux(beats_left < to_boundary, beats_left, to_boundary),
                                 Mux(to_boundary < most, to_boundary, most)))
        room = queue.level + (beats * per_beat) + 2 <= _QUEUE_INSTRS
        hungry_level = min(_QUEUE_INSTRS // 2, _QUEUE_INSTRS - most * per_beat - 2)
        want = active & ~self.stop & ~self.error & (beats_left != 0) & (outstanding == 0) & room
        ar_pending = Signal()
        # (Named for the formal proofs' induction lemmas: docs/formal.md.)
        self.lemma_state = {"active": active, "addr": addr, "outstanding": outstanding}
        with m.If(want & ~ar_pending):
            m.d.sync += [ar_pending.eq(1), axi.arlen.eq(beats - 1), axi.araddr.eq(addr),
                         outstanding.eq(beats), addr.eq(addr + beats * bb),
                         beats_left.eq(beats_left - beats)]
        with m.If(axi.arvalid & axi.arready):
            m.d.sync += ar_pending.eq(0)
        m.d.comb += [
            axi.arvalid.eq(ar_pending), axi.arid.eq(FETCH_AXI_ID),
            axi.arsize.eq(C((bb - 1).bit_length(), 3)), axi.arburst.eq(AxiBurst.INCR),
            axi.arcache.eq(0b0011),
            self.busy.eq(outstanding != 0),
            # Responses come in order: a burst requested while a long load's
            # beats are in flight waits behind all of them, so a fetch that
            # competed burst by burst got 16 instructions per weight strip
            # (docs/compiler.md, "Quantized weights"). Only while it has room
            # for a whole burst, which it then requests: a hungry fetch that
            # could not would hold the loads for ever.
            self.hungry.eq(active & ~self.stop & ~self.error & (beats_left != 0)
                           & (queue.level <= hungry_level)),
        ]

        # ---- R -> instructions (gearbox for buses narrower or wider than 128 bits).
        word, word_valid = self._gearbox(m, axi, queue)
        with m.If(axi.rvalid & axi.rready):
            m.d.sync += outstanding.eq(outstanding - 1)
            with m.If((axi.rresp != AxiResp.OKAY) & ~self.error):
                m.d.sync += [self.error.eq(1), self.error_pc.eq(emitted)]
        keep = word_valid & (emitted < length) & ~self.error
        send_end = active & ~end_sent & (emitted == length) & ~self.error & queue.w_rdy & ~word_valid
        with m.If(keep):
            m.d.comb += [queue.w_en.eq(1), queue.w_data.eq(Cat(word, emitted))]
            m.d.sync += emitted.eq(emitted + 1)
        with m.Elif(send_end):
            m.d.comb += [queue.w_en.eq(1), queue.w_data.eq(Cat(C(0, INSTR_BITS), emitted))]
            m.d.sync += end_sent.eq(1)
        return m

    def _gearbox(self, m, axi, queue):
        """(word, word_valid): one instruction per cycle from the R channel; R is
        only accepted when the queue can take what the beat holds."""
        c = self.config
        bits = c.axi_data_bits
        word = Signal(INSTR_BITS)
        word_valid = Signal()
        if bits <= INSTR_BITS:
            parts = INSTR_BITS // bits
            held = Signal(INSTR_BITS - bits) if parts > 1 else None
            idx = Signal(range(parts))
            m.d.comb += axi.rready.eq(queue.w_rdy)
            with m.If(axi.rvalid & axi.rready):
                if parts > 1:
                    m.d.sync += [held.eq(Cat(held[bits:], axi.rdata) if parts > 2 else axi.rdata),
                                 idx.eq(Mux(idx == parts - 1, 0, idx + 1))]
                    m.d.comb += word_valid.eq(idx == parts - 1)
                    m.d.comb += word.eq(Cat(held, axi.rdata))
                else:
                    m.d.comb += [word_valid.eq(1), word.eq(axi.rdata)]
        else:
            parts = bits // INSTR_BITS
            beat = Signal(bits)
            idx = Signal(range(parts))
            holding = Signal()
            m.d.comb += axi.rready.eq(~holding)
            with m.If(axi.rvalid & axi.rready):
                m.d.sync += [beat.eq(axi.rdata), holding.eq(1), idx.eq(0)]
            with m.If(holding & queue.w_rdy):
                m.d.comb += [word_valid.eq(1),
                             word.eq(beat.word_select(idx, INSTR_BITS))]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == parts - 1):
                    m.d.sync += holding.eq(0)
        return word, word_valid
