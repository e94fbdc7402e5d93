"""The controller: decode, per-engine command queues, dependency tokens, status,
error handling and performance counters (docs/architecture.md, docs/isa.md).

Fetched instructions are checked and sent, in program order, to the queue of
the engine that runs them. An engine takes its queue's head once the tokens the
head pops are there, and returns tokens when the instruction completes. The
first error (in time) is recorded with the pc of its instruction; from then on
no engine takes a new instruction, what is in flight drains, and ``done`` rises.
"""

from amaranth.hdl import C, Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .fetch import FetchedInstr
from .isa import (BINARY_VPU_OPS, INSTR_BITS, TOKEN_BITS, TOKEN_LINKS, VECTOR_LINK_BIT, BMode, DmaInstr,
                  Engine, ErrorCode, Header, HaltInstr, LinkInstr, LoadWInstr, MatmulInstr, Opcode, Pushes,
                  SeedMode, SyncInstr, VectorInstr, VpuOp, engines_of)
from .compute import ComputeCommand
from .dma import dma_descriptor_layout
from .regs import COUNTERS
from .slice import RegisterSlice
from .trace import EngineTrace

__all__ = ["Decoder", "Controller", "token_links"]


_ENGINE_LETTER = {"l": Engine.LOAD, "c": Engine.COMPUTE, "s": Engine.STORE, "v": Engine.VECTOR}


def token_links(engines):
    """The dependency-token counters of a chip with `engines` (`TOKEN_LINKS`
    between engines it has), their names sorted, and for each engine its
    links: ``[(side, flag, push counter, pop counter, shared)]``, `shared`
    when the vector link flag chooses between two links on that side."""
    names = {n for pair in TOKEN_LINKS.values() for n in pair
             if all(_ENGINE_LETTER[x] in engines for x in n.split("2"))}
    links = {}
    for e in engines:
        rows = []
        for side in ("prev", "next"):
            for flag in (0, 1):
                pair = TOKEN_LINKS.get((e, side, flag))
                if pair is None or pair[0] not in names:
                    continue
                other = TOKEN_LINKS.get((e, side, 1 - flag))
                shared = other is not None and other[0] in names
                rows.append((side, flag, pair[0], pair[1], shared))
        links[e] = rows
    return sorted(names), links


class Decoder(wiring.Component):
    """Static checks of one instruction (combinational): the engine it runs on and
    the first error, in the order of `mxu.verif.isa_model.check_instruction`.

    Interface: ``word``: In(128); ``engine``: Out(Engine); ``halt``: Out(1);
    ``error``: Out(ErrorCode).
    """

    def __init__(self, config):
        self.config = config
        super().__init__({"word": In(INSTR_BITS), "engine": Out(Engine), "halt": Out(1),
                          "error": Out(ErrorCode)})

    def elaborate(self, platform):
        m = Module()
        c = self.config
        w = self.word
        h = Header(w[:16])
        dma, lw, mm, link = DmaInstr(w), LoadWInstr(w), MatmulInstr(w), LinkInstr(w)
        sync, halt, vec = SyncInstr(w), HaltInstr(w), VectorInstr(w)
        op = h.opcode
        last_engine = Engine.VECTOR if c.vpu else Engine.STORE
        deps = h.deps

        engine = Signal(Engine)
        known = Signal()
        reserved = Signal()
        with m.Switch(op):
            with m.Case(Opcode.LOAD, Opcode.STORE):
                m.d.comb += [known.eq(1),
                             engine.eq(Mux(op == Opcode.LOAD, Engine.LOAD, Engine.STORE))]
            with m.Case(Opcode.SEND, Opcode.RECV):
                m.d.comb += [known.eq(1),
                             reserved.eq((link.flags.quant.as_value() != 0) | (link.reserved != 0)),
                             engine.eq(Mux(op == Opcode.RECV, Engine.LOAD, Engine.STORE))]
            with m.Case(Opcode.LOADW):
                m.d.comb += [known.eq(1), engine.eq(Engine.COMPUTE),
                             reserved.eq((lw.flags.reserved != 0) | (lw.reserved != 0))]
            with m.Case(Opcode.MATMUL):
                m.d.comb += [known.eq(1), engine.eq(Engine.COMPUTE),
                             reserved.eq((mm.flags.reserved != 0) | (mm.reserved != 0)
                                         | (mm.flags.seed_mode.as_value() > SeedMode.BIAS.value))]
            with m.Case(Opcode.SYNC):
                m.d.comb += [known.eq(1), engine.eq(sync.flags.engine),
                             reserved.eq((sync.flags.reserved != 0) | (sync.reserved != 0)
                                         | (sync.flags.engine.as_value() > last_engine.value))]
            if c.vpu:
                with m.Case(Opcode.VECTOR):
                    m.d.comb += [known.eq(1), engine.eq(Engine.VECTOR),
                                 reserved.eq((vec.flags.reserved != 0)
                                             | (vec.op.as_value() > VpuOp.RMAX.value)
                                             | (vec.flags.b_mode.as_value() > BMode.SCALAR.value)
                                             | (vec.flags.transpose & ~vec.flags.to_vmem)
                                             # lanes pair up only on an even row
                                             | (vec.flags.swap if c.cols % 2 else 0))]
            with m.Case(Opcode.HALT):
                m.d.comb += [known.eq(1), self.halt.eq(1),
                             reserved.eq((deps.as_value() != 0) | (halt.flags != 0)
                                         | (halt.reserved != 0))]
        bad_deps = Mux(engine == Engine.LOAD, deps.pop_prev | deps.push_prev,
                       Mux(engine == Engine.STORE, deps.pop_next | deps.push_next, 0))
        bad_deps |= (op == Opcode.LOADW) & (deps.push_prev | deps.push_next)
        # The vector link (flag bit 7) exists on compute and store instructions only.
        linkable = (engine == Engine.COMPUTE) | (engine == Engine.STORE) if c.vpu else 0
        bad_link = w[VECTOR_LINK_BIT] & ~(linkable & ~self.halt)
        illegal = ~known | reserved | (~self.halt & bad_deps) | bad_link

        desc = dma_descriptor_layout(c)
        too_wide = lambda value, name: value >= (1 << desc[name].width)
        dma_bad = (too_wide(dma.rows, "rows") | too_wide(dma.row_bytes, "row_bytes")
                   | too_wide(dma.chip_row, "chip_row") | too_wide(dma.ext_addr, "ext_base")
                   | too_wide(dma.ext_stride, "ext_stride")
                   # a chip without the expander takes no format (the DMA checks the rest)
                   | ((dma.flags.quant.as_value() != 0) if not c.quant_formats else 0))
        dma_empty = (dma.rows == 0) | (dma.row_bytes == 0)

        is_link = (op == Opcode.SEND) | (op == Opcode.RECV)
        is_dma = (op == Opcode.LOAD) | (op == Opcode.STORE) | is_link
        mode = mm.flags.seed_mode
        seed_end = mm.seed_row + Mux(mode == SeedMode.ACC, mm.m_rows, 1)
        with m.If(illegal | (is_dma & dma_empty)):
            m.d.comb += self.error.eq(ErrorCode.ILLEGAL_INSTR)
        with m.Elif(op == Opcode.LOADW):
            with m.If(lw.k_rows > c.rows):
                m.d.comb += self.error.eq(ErrorCode.ILLEGAL_INSTR)
            with m.Elif(lw.vmem_row + lw.k_rows > c.vmem_rows):
                m.d.comb += self.error.eq(ErrorCode.VMEM_RANGE)
        with m.Elif(op == Opcode.MATMUL):
            with m.If(mm.m_rows == 0):
                m.d.comb += self.error.eq(ErrorCode.ILLEGAL_INSTR)
            with m.Elif(mm.act_row + mm.m_rows > c.vmem_rows):
                m.d.comb += self.error.eq(ErrorCode.VMEM_RANGE)
            with m.Elif((mm.out_row + mm.m_rows > c.acc_rows)
                        | ((mode != SeedMode.ZERO) & (seed_end > c.acc_rows))):
                m.d.comb += self.error.eq(ErrorCode.ACC_RANGE)
        with m.Elif(is_link & (link.link >= c.links)):
            m.d.comb += self.error.eq(ErrorCode.LINK_INDEX)
        with m.Elif(is_dma & dma_bad):
            m.d.comb += self.error.eq(ErrorCode.DMA_DESCRIPTOR)
        if c.vpu:
            with m.Elif(op == Opcode.VECTOR):
                m.d.comb += self.error.eq(_vector_error(c, vec))
        m.d.comb += self.engine.eq(engine)
        return m


def _vector_error(config, vec):
    """The static error of a legal VECTOR word (docs/isa.md), as a value.

    Beyond the ranges: the rows written to the accumulator must be the rows of
    ``a`` (in place) or apart from them, and likewise for ``b``'s rows, because
    the engine reads ahead of its writes."""
    c = config
    n = vec.rows
    binary = Cat(*(vec.op == o for o in BINARY_VPU_OPS)).any()
    b_len = Mux(vec.flags.b_mode == BMode.ROW, n, 1)
    reads_b = binary & (vec.flags.b_mode != BMode.SCALAR)
    dst_end = vec.dst_row + n
    to_acc = ~vec.flags.to_vmem

    def partial(lo, length):
        overlap = (lo < dst_end) & (vec.dst_row < lo + length)
        return overlap & ((lo != vec.dst_row) | (length != n))

    illegal = ((n == 0) | (vec.flags.transpose & (n > c.vmem_row_elems))
               | (to_acc & (partial(vec.a_row, n) | (reads_b & partial(vec.b_row, b_len)))))
    acc_range = ((vec.a_row + n > c.acc_rows) | (reads_b & (vec.b_row + b_len > c.acc_rows))
                 | (to_acc & (dst_end > c.acc_rows)))
    vmem_end = vec.dst_row + Mux(vec.flags.transpose, c.cols, n)
    vmem_range = vec.flags.to_vmem & (vmem_end > c.vmem_rows)
    return Mux(illegal, ErrorCode.ILLEGAL_INSTR,
               Mux(acc_range, ErrorCode.ACC_RANGE,
                   Mux(vmem_range, ErrorCode.VMEM_RANGE, ErrorCode.NONE)))


def _compute_command(config, word, m):
    """The `ComputeCommand` of a LOADW/MATMUL/SYNC word."""
    cmd = Signal(ComputeCommand(config))
    lw, mm = LoadWInstr(word), MatmulInstr(word)
    is_loadw = Header(word[:16]).opcode == Opcode.LOADW
    m.d.comb += [
        cmd.opcode.eq(Header(word[:16]).opcode),
        cmd.push.deps.eq(Header(word[:16]).deps),
        cmd.push.vector.eq(word[VECTOR_LINK_BIT]),
        cmd.seed_mode.eq(mm.flags.seed_mode),
        cmd.new_weights.eq(mm.flags.new_weights),
        cmd.vmem_row.eq(Mux(is_loadw, lw.vmem_row, mm.act_row)),
        cmd.count.eq(Mux(is_loadw, lw.k_rows, mm.m_rows)),
        cmd.out_row.eq(mm.out_row),
        cmd.seed_row.eq(mm.seed_row),
    ]
    return cmd


class Controller(wiring.Component):
    """Decode, queues, tokens, status and counters around three engines.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    start : In(1)
        Pulse to run the fetched program (from the register file).
    instr : In(stream.Signature(FetchedInstr))
        From `InstructionFetch`.
    fetch_error, fetch_busy : In(1)
    fetch_error_pc : In(32)
    fetch_stop : Out(1)
    load_cmd, store_cmd : Out(stream.Signature(DmaInstr))
    compute_cmd : Out(stream.Signature(ComputeCommand(config)))
    vector_cmd : Out(stream.Signature(VectorInstr)), with ``config.vpu``
    <engine>_complete : In(stream of Pushes, always ready)
    <engine>_error : In(ErrorCode)
    <engine>_idle : In(1)
        For each engine (load, compute, store, and vector with ``config.vpu``).
    array_accept, dma_read_beat, dma_write_beat, vector_accept : In(1)
        Events counted by the performance counters.
    busy, done : Out(1)
    error : Out(ErrorCode)
    error_pc : Out(32)
    counters : Out(ArrayLayout(64, len(COUNTERS)))
    engine_trace : Out(ArrayLayout(EngineTrace, len(Engine))), with ``trace=True`` only
        Per engine (load, compute, store, vector): takes, completions, pc,
        opcode and token waits (`mxu.hdl.trace`); zero for an engine the chip lacks.
    """

    def __init__(self, config, *, trace=False, token_bits=TOKEN_BITS):
        if not isinstance(token_bits, int) or not 1 <= token_bits <= TOKEN_BITS:
            raise ValueError(f"token_bits must be an integer from 1 to {TOKEN_BITS}, "
                             f"not {token_bits!r}")
        self.config = config
        self.trace = trace
        self.token_bits = token_bits
        self.engines = engines_of(config)
        done_stream = stream.Signature(Pushes, always_ready=True)
        commands = {Engine.LOAD: DmaInstr, Engine.COMPUTE: ComputeCommand(config),
                    Engine.STORE: DmaInstr, Engine.VECTOR: VectorInstr}
        members = {}
        for e in self.engines:
            name = e.name.lower()
            members.update({f"{name}_cmd": Out(stream.Signature(commands[e])),
                            f"{name}_complete": In(done_stream), f"{name}_error": In(ErrorCode),
                            f"{name}_idle": In(1)})
        super().__init__({
            "start": In(1),
            "instr": In(stream.Signature(FetchedInstr)),
            "fetch_error": In(1), "fetch_error_pc": In(32), "fetch_busy": In(1),
            "fetch_stop": Out(1),
            **members,
            "array_accept": In(1), "dma_read_beat": In(1), "dma_write_beat": In(1),
            "vector_accept": In(1),
            "busy": Out(1), "done": Out(1),
            "error": Out(ErrorCode), "error_pc": Out(32),
            "counters": Out(data.ArrayLayout(64, len(COUNTERS))),
            **({"engine_trace": Out(data.ArrayLayout(EngineTrace, len(Engine)))} if trace else {}),
        })

    @staticmethod
    def _trace_engine(m, out, taken, head, hdr, blocked, complete):
        waited = Signal(32)
        with m.If(taken):
            m.d.sync += waited.eq(0)
        with m.Elif(blocked):
            m.d.sync += waited.eq(waited + 1)
        m.d.comb += [out.take.eq(taken), out.complete.eq(complete), out.pc.eq(head.pc),
                     out.opcode.eq(hdr.opcode), out.waited.eq(waited)]

    def elaborate(self, platform):
        # The parts, each a method: the queues, the issue of decoded
        # instructions to them, the engines taking their heads with the tokens,
        # the deadlock check, the first error, the run state and the counters.
        # `record` collects the errors in the order they rank.
        m = Module()
        c = self.config
        m.submodules.decoder = decoder = Decoder(c)
        failed = Signal()
        halted = Signal()
        running = Signal()
        record = []   # (condition, code, pc) in priority order: the first error wins

        queues = self._queues(m)
        instr, ok, decoder_stalled = self._issue(m, decoder, queues, running, halted, failed, record)
        tokens, blocked = self._engines(m, queues, failed, record)
        # For the formal proofs' invariants (docs/formal.md).
        self.queues, self.tokens, self.failed = queues, tokens, failed
        all_idle = Cat(*(getattr(self, f"{e.name.lower()}_idle") for e in queues)).all()
        self._deadlock(m, queues, blocked, all_idle, running, halted | decoder_stalled,
                       instr.payload.instr.pc, record)
        record.append((self.fetch_error, C(ErrorCode.FETCH_ERROR.value, 4), self.fetch_error_pc))
        self._first_error(m, record, running, failed)
        self._run_state(m, queues, all_idle, running, halted, failed)
        self._counters(m, running, blocked, instr.valid & instr.ready & ok)
        return m

    # ---- engine queues ------------------------------------------------------------------
    def _queues(self, m):
        """One command queue per engine: {Engine: FIFO of (word, pc)}."""
        queues = {}
        for e in self.engines:
            q = fifo.SyncFIFOBuffered(width=INSTR_BITS + 32, depth=self.config.cmd_queue_depth)
            m.submodules[f"{e.name.lower()}_queue"] = q
            queues[e] = q
        return queues

    def _issue(self, m, decoder, queues, running, halted, failed, record):
        """Decode the fetched instruction and send it to its engine's queue, in
        program order; a HALT sets `halted`, a static error is recorded.
        Returns (the registered instruction stream, its no-error flag, whether
        it waits for a full queue)."""
        # The decoder, then a register slice: every decision below starts from
        # registers. Without the slice the loop expanders' body memories and pc
        # comparisons, then the decoder's range checks, ran into the error, halt
        # and deadlock logic (docs/synth.md).
        m.d.comb += decoder.word.eq(FetchedInstr(self.instr.payload).word)
        decoded = data.StructLayout({"instr": FetchedInstr, "engine": Engine, "halt": 1,
                                     "error": ErrorCode})
        m.submodules.instr_slice = instr_slice = ResetInserter(self.start)(
            RegisterSlice(decoded))
        m.d.comb += [
            instr_slice.i.valid.eq(self.instr.valid),
            instr_slice.i.payload.instr.eq(self.instr.payload),
            instr_slice.i.payload.engine.eq(decoder.engine),
            instr_slice.i.payload.halt.eq(decoder.halt),
            instr_slice.i.payload.error.eq(decoder.error),
            self.instr.ready.eq(instr_slice.i.ready),
        ]
        instr = instr_slice.o
        ins = instr.payload.instr
        dec = instr.payload           # the decoder's engine, halt and error, registered
        target_ready = Cat(*((dec.engine == e) & q.w_rdy for e, q in queues.items())).any()
        ok = dec.error == ErrorCode.NONE
        accept = running & ~halted & ~failed & instr.valid
        m.d.comb += instr.ready.eq(accept & (~ok | dec.halt | target_ready))
        for e, q in queues.items():
            m.d.comb += [
                q.w_data.eq(instr.payload.instr),
                q.w_en.eq(accept & ok & ~dec.halt & (dec.engine == e) & q.w_rdy),
            ]
        with m.If(accept & ok & dec.halt):
            m.d.sync += halted.eq(1)
        decoder_stalled = accept & ok & ~dec.halt & ~target_ready
        record.append((accept & ~ok, dec.error, ins.pc))
        return instr, ok, decoder_stalled

    # ---- tokens ---------------------------------------------------------------------------
    def _engines(self, m, queues, failed, record):
        """Each engine takes its queue's head once the tokens the head pops are
        there; completions push tokens. Records each engine's error, then each
        token counter's overflow. Returns (the token counters by name, whether
        each engine's head waits for a token)."""
        names, links = token_links(list(queues))
        tokens = {name: Signal(self.token_bits, name=f"tokens_{name}") for name in names}
        inc = {name: [] for name in tokens}
        dec = {name: [] for name in tokens}
        blocked, last_pc, pusher = {}, {}, {}
        for e, q in queues.items():
            name = e.name.lower()
            complete, error = getattr(self, f"{name}_complete"), getattr(self, f"{name}_error")
            head = FetchedInstr(q.r_data)
            hdr = Header(head.word[:16])
            pop_ok = Signal(name=f"{name}_pop_ok")
            taken = Signal(name=f"{name}_taken")
            conds = self._token_links(e, links[e], hdr, head.word[VECTOR_LINK_BIT], complete, taken,
                                      tokens, inc, dec, pusher)
            m.d.comb += pop_ok.eq(Cat(*conds).all() if conds else 1)
            self._take(m, e, q, head, pop_ok, failed, taken)
            pc = Signal(32, name=f"{name}_pc")
            with m.If(taken):
                m.d.sync += pc.eq(head.pc)
            # A SYNC completes in the cycle it is taken, before `pc` holds it.
            last_pc[e] = Mux(taken, head.pc, pc)
            # A head waiting for a token (not for its engine to finish).
            blocked[e] = q.r_rdy & ~pop_ok
            if self.trace:
                self._trace_engine(m, self.engine_trace[e.value], taken, head, hdr, blocked[e],
                                   complete.valid)
            record.append((error != ErrorCode.NONE, error, pc))
        for full, engine in self._token_counters(m, tokens, inc, dec, pusher):
            record.append((full, C(ErrorCode.TOKEN_OVERFLOW.value, 4), last_pc[engine]))
        return tokens, blocked

    @staticmethod
    def _token_links(e, links, hdr, link, complete, taken, tokens, inc, dec, pusher):
        """The conditions under which engine `e`'s head has the tokens it pops
        (one per token link of `links`, see `token_links`); adds its pops to
        `dec` and its completions' pushes to `inc` (by counter name), and
        itself as the pusher of the counters it pushes."""
        conds = []
        for side, flag, push_name, pop_name, shared in links:
            want = getattr(hdr.deps, f"pop_{side}")
            pushed = complete.valid & getattr(complete.payload.deps, f"push_{side}")
            mine = (link == flag) if shared else 1
            gives = (complete.payload.vector == flag) if shared else 1
            conds.append(~(want & mine) | (tokens[pop_name] != 0))
            dec[pop_name].append(taken & want & mine)
            inc[push_name].append(pushed & gives)
            pusher[push_name] = e
        return conds

    def _take(self, m, e, q, head, pop_ok, failed, taken):
        """Offer engine `e` its queue's head once its tokens are there
        (`pop_ok`) and no error stopped the run; `taken` when the engine
        takes it."""
        cmd = getattr(self, f"{e.name.lower()}_cmd")
        go = q.r_rdy & pop_ok & ~failed
        if e == Engine.COMPUTE:
            m.d.comb += cmd.payload.eq(_compute_command(self.config, head.word, m))
        else:
            m.d.comb += cmd.payload.eq(head.word)
        m.d.comb += [cmd.valid.eq(go), q.r_en.eq(go & cmd.ready), taken.eq(go & cmd.ready)]

    def _token_counters(self, m, tokens, inc, dec, pusher):
        """Count each token link's pushes and pops. A push onto a full counter
        is an error (the run stops); the counter keeps its value rather than
        wrap to zero. Returns [(overflow, the engine that pushed)]."""
        overflow = []
        for name, counter in tokens.items():
            pushed, popped = Cat(*inc[name]).any(), Cat(*dec[name]).any()
            full = (counter == (1 << self.token_bits) - 1) & pushed & ~popped
            overflow.append((full, pusher[name]))
            with m.If(~full):
                m.d.sync += counter.eq(counter + pushed - popped)
        return overflow

    # ---- deadlock, errors, run state, counters ------------------------------------------------
    @staticmethod
    def _deadlock(m, queues, blocked, all_idle, running, fetch_stuck, pc, record):
        """Record a deadlock: while running, nothing in flight, every waiting
        head lacks a token, and the fetch is stuck (`fetch_stuck`: halted, or
        waiting for a full queue)."""
        heads_stuck = Cat(*((queues[e].level == 0) | blocked[e] for e in queues)).all()
        any_waiting = Cat(*(queues[e].level != 0 for e in queues)).any()
        deadlock = running & all_idle & heads_stuck & any_waiting & fetch_stuck
        # Two cycles in a row, from registers (the idle and token logic stays out
        # of the error path): a real deadlock never ends, so a cycle later is fine.
        deadlock_q, deadlock_qq = Signal(), Signal()
        m.d.sync += [deadlock_q.eq(deadlock), deadlock_qq.eq(deadlock_q)]
        record.append((deadlock_q & deadlock_qq, C(ErrorCode.DEADLOCK.value, 4), pc))

    def _first_error(self, m, record, running, failed):
        """The first error (in time; at once, in `record`'s order) stops the
        run: `failed`, with its code and pc."""
        with m.If(running & ~failed):
            for i, (cond, code, pc) in enumerate(record):
                with (m.If if i == 0 else m.Elif)(cond):
                    m.d.sync += [failed.eq(1), self.error.eq(code), self.error_pc.eq(pc)]

    def _run_state(self, m, queues, all_idle, running, halted, failed):
        """``start`` begins a run; it is done once halted or failed with every
        engine idle, the queues empty and the fetch stopped."""
        empty = Cat(*(q.level == 0 for q in queues.values())).all()
        finished = running & all_idle & empty & ~self.fetch_busy & (halted | failed)
        with m.If(self.start):
            m.d.sync += [running.eq(1), halted.eq(0), failed.eq(0), self.done.eq(0),
                         self.error.eq(ErrorCode.NONE), self.error_pc.eq(0)]
        with m.Elif(finished):
            m.d.sync += [running.eq(0), self.done.eq(1)]
        m.d.comb += [self.busy.eq(running), self.fetch_stop.eq(halted | failed)]
        # A failed run drops what is still queued: nothing else will take it.
        with m.If(failed):
            for q in queues.values():
                m.d.comb += q.r_en.eq(1)

    def _counters(self, m, running, stalls, instructions):
        """The performance counters (`mxu.hdl.regs.COUNTERS`), cleared by
        ``start``; `stalls`: each engine's head waiting for a token."""
        c = self.config
        events = {
            "cycles": running,
            "array_active": self.array_accept,
            "load_stall": running & stalls[Engine.LOAD],
            "compute_stall": running & stalls[Engine.COMPUTE],
            "store_stall": running & stalls[Engine.STORE],
            "vector_active": self.vector_accept,
            "vector_stall": running & stalls[Engine.VECTOR] if c.vpu else 0,
            "dma_read_bytes": self.dma_read_beat,
            "dma_write_bytes": self.dma_write_beat,
            "instructions": instructions,
        }
        step = {"dma_read_bytes": c.axi_data_bytes, "dma_write_bytes": c.axi_data_bytes}
        for i, name in enumerate(COUNTERS):
            counter = self.counters[i]
            with m.If(self.start):
                m.d.sync += counter.eq(0)
            with m.Elif(events[name]):
                m.d.sync += counter.eq(counter + step.get(name, 1))
