"""The formal proofs of the chip, unit by unit (docs/formal.md): a harness per
design (its checkers, the assumptions on its inputs, and the invariants that
make k-induction go through), and `PROOFS`, what ``mxu prove`` runs.

A harness brings the design's ports out as its own (the prover drives every
input freely, within the assumptions) and attaches checkers to the design's
interfaces. Invariants about a design's inside (ghost state of a checker
equals a counter of the design) are "glue": they are asserted too, so they
are proved, and they make the induction step see only reachable states.
"""

import weakref

from amaranth.hdl import Array, C, Cat, Const, Elaboratable, Fragment, Module, Mux, Signal, Value
from amaranth.asserts import AnySeq, Cover
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from mxu.hdl.axi import AXI4LiteSignature, AxiResp
from mxu.hdl.config import ChipConfig
from mxu.hdl.isa import VECTOR_LINK_BIT, Engine, ErrorCode
from mxu.hdl.regs import COUNTERS, HOST_ADDR_BITS, REG, RegisterFile

from .checkers import (DUT, ENV, AXI4LiteSubordinateChecker, Past, StreamChecker,
                       _burst_in_page, attach, prop)
from .sby import Proof

__all__ = ["Harness", "After", "UNITS", "small_config", "proofs_for", "stream_check"]


class After(Elaboratable):
    """Properties about the inside of a design: `build(m)` runs when this is
    elaborated, after the design added before it as a sibling submodule, so it
    can reach the signals the design's ``elaborate`` created."""

    def __init__(self, build):
        self.build = build

    def elaborate(self, platform):
        m = Module()
        self.build(m)
        return m


class _Elaborated(Elaboratable):
    """A design already elaborated (its `Fragment`)."""

    def __init__(self, fragment):
        self.fragment = fragment

    def elaborate(self, platform):
        return self.fragment


# The fragment of each design a `Harness` holds (`inner`).
_FRAGMENTS = weakref.WeakKeyDictionary()


def inner(dut, *path):
    """The signals that `dut`'s section at `path` (submodule names from the
    design down) assigns, by name: the local registers of an ``elaborate``
    (the DMA's descriptor register and state, a section's counters), which
    induction lemmas must name and the design need not expose. A name that
    is not there (or twice) raises, so that a renamed register fails the
    proof's elaboration, not the proof."""
    fragment = _FRAGMENTS[dut]
    for name in path:
        fragment = fragment.find_subfragment(name)
    found = {}
    for statements in fragment.statements.values():
        for statement in statements:
            for signal in statement._lhs_signals():
                same = found.setdefault(signal.name, [])
                if not any(signal is other for other in same):
                    same.append(signal)

    class Signals(dict):
        def __getitem__(self, name):
            if name not in self:
                raise KeyError(f"{'.'.join(path) or 'the design'} assigns no signal {name!r}")
            signals = dict.__getitem__(self, name)
            if len(signals) != 1:
                raise KeyError(f"{'.'.join(path) or 'the design'} assigns {len(signals)} "
                               f"signals named {name!r}")
            return next(iter(signals))

        def unnamed(self, width, of=1, nth=0):
            """The `nth` (in the order first assigned) of the `of` signals of
            `width` bits that its section left unnamed (registers created in
            a tuple assignment, ``ia, ib = Signal(16), Signal(16)``, which
            Amaranth names only by the last); another count raises."""
            signals = [s for s in self.get("$signal", []) if len(s) == width]
            if len(signals) != of:
                raise KeyError(f"{'.'.join(path) or 'the design'} assigns {len(signals)} "
                               f"unnamed signals of {width} bits, not {of}")
            return signals[nth]
    return Signals(found)


def fsm_state(signal, name):
    """``signal`` (an FSM's state, from `inner`) is in the state `name`."""
    def decoded(value):
        try:
            return signal.decoder(value).split("/")[0]
        except KeyError:            # (a value no state has)
            return None
    values = [v for v in range(1 << len(signal)) if decoded(v) == name]
    if len(values) != 1:
        raise KeyError(f"{signal.name} has no state {name!r}")
    return signal == values[0]


class Harness(Elaboratable):
    """`dut` with every input driven freely by the prover (``AnySeq``: any value
    in every cycle, within the assumptions), and what `extra(m, dut)` adds
    (checkers, assumptions, invariants). An `After` returned by `extra` is
    elaborated after the design. Outputs nothing observes are optimised away.

    Parameters
    ----------
    dut : wiring.Component
    extra : callable
    """

    def __init__(self, dut, extra):
        self._dut = dut
        self._extra = extra

    def elaborate(self, platform):
        m = Module()
        dut = self._dut
        # Elaborated here, once, so that lemmas can name its registers (`inner`).
        _FRAGMENTS[dut] = fragment = Fragment.get(dut, platform)
        m.submodules.dut = _Elaborated(fragment)
        for path, member, value in dut.signature.flatten(dut):
            value = Value.cast(value)
            if member.flow == In and isinstance(value, Signal):
                m.d.comb += value.eq(AnySeq(len(value)))
        late = self._extra(m, dut)
        if late is not None:
            m.submodules.after = late
        return m


def stream_check(m, port, *, source, sink, name, exempt=None):
    """A `StreamChecker` on the stream interface `port`."""
    signature = port.signature
    if isinstance(signature, wiring.FlippedSignature):
        signature = signature.flip()
    checker = StreamChecker(signature, source=source, sink=sink, name=name, exempt=exempt)
    m.submodules[name.replace(".", "_")] = checker
    attach(m, checker.tap, port)
    return checker


def small_config(**changes):
    """The reduced chip the proofs in ``make test`` use: a 2x2 array, a 64-bit
    bus, short memories, two-entry queues (docs/formal.md says why each
    reduction keeps what is proved)."""
    base = dict(rows=2, cols=2, mac_stages=2, vmem_bytes=64, vmem_banks=2, acc_bytes=64,
                acc_banks=2, axi_data_bits=64, axi_addr_bits=32, ext_mem_bytes=1 << 16,
                dma_max_outstanding=2, dma_max_burst_beats=2, cmd_queue_depth=2,
                loop_body_instrs=2)
    base.update(changes)
    return ChipConfig(**base)


# ---- regs: the host register file (AXI4-Lite subordinate) -------------------------

# Access of each register as docs/isa.md lists it ("Host registers").
REGISTER_ACCESS = {"ID": "RO", "CTRL": "WO", "STATUS": "RO", "ERROR_PC": "RO",
                   "PROG_BASE": "RW", "PROG_LEN": "RW", "SHAPE": "RO"}


def _word_in(index, words):
    return Cat(*(index == w for w in words)).any()


def regs_harness(config):
    """`RegisterFile`: the AXI4-Lite rules, the documented response codes (a
    write to a register with W access answers OKAY, any other SLVERR; a read
    of a mapped register OKAY, of an unmapped address SLVERR), start only
    from a CTRL write while not busy or resetting, and a soft reset's drain
    only from a CTRL write, its reset of the core only after a cycle with no
    burst in flight."""
    dut = RegisterFile(config)

    def extra(m, dut):
        bus = dut.bus
        checker = AXI4LiteSubordinateChecker(AXI4LiteSignature(addr_width=HOST_ADDR_BITS),
                                             max_outstanding=1, name="regs.host")
        m.submodules.host = checker
        attach(m, checker.tap, bus)
        counters = range(REG["COUNTERS"] >> 2, (REG["COUNTERS"] >> 2) + 2 * len(COUNTERS))
        writable = [REG[n] >> 2 for n, a in REGISTER_ACCESS.items() if "W" in a]
        readable = [REG[n] >> 2 for n in REGISTER_ACCESS] + list(counters)
        want_b, want_r = Signal(2), Signal(2)
        aw_fire = bus.awvalid & bus.awready
        ar_fire = bus.arvalid & bus.arready
        with m.If(aw_fire):
            m.d.sync += want_b.eq(Mux(_word_in(bus.awaddr[2:], writable), AxiResp.OKAY,
                                      AxiResp.SLVERR))
        with m.If(ar_fire):
            m.d.sync += want_r.eq(Mux(_word_in(bus.araddr[2:], readable), AxiResp.OKAY,
                                      AxiResp.SLVERR))
        # AW and W are taken together (one request at a time, checked above).
        prop(m, DUT, "regs.host.aw_with_w", bus.wvalid & bus.wready, when=aw_fire)
        prop(m, DUT, "regs.host.bresp_map", bus.bresp == want_b, when=bus.bvalid,
             witness=bus.bvalid & (want_b == AxiResp.SLVERR))
        prop(m, DUT, "regs.host.rresp_map", bus.rresp == want_r, when=bus.rvalid,
             witness=bus.rvalid & (want_r == AxiResp.SLVERR))
        past = Past(m, "regs")
        ctrl_write = aw_fire & (bus.awaddr[2:] == REG["CTRL"] >> 2)
        was_start = past(ctrl_write & bus.wdata[0] & ~dut.busy & ~dut.draining, "start_write")
        prop(m, DUT, "regs.start_from_ctrl", was_start, when=dut.start)
        # A soft reset: a drain from a CTRL write until the core's reset, which
        # comes only after a cycle in which no bus user had a burst in flight.
        asked = Signal()
        # (A request in the reset's cycle starts the next drain.)
        with m.If(dut.soft_reset & ~past(ctrl_write & bus.wdata[1], "soft_write")):
            m.d.sync += asked.eq(0)
        with m.If(ctrl_write & bus.wdata[1]):
            m.d.sync += asked.eq(1)
        prop(m, DUT, "regs.soft_reset_from_ctrl", asked, when=dut.draining)
        quiet_before = past(dut.draining & (dut.bus_busy == 0), "quiet")
        waited = Signal()       # the drain waited for a burst in flight
        with m.If(dut.draining & (dut.bus_busy != 0)):
            m.d.sync += waited.eq(1)
        with m.If(dut.soft_reset):
            m.d.sync += waited.eq(0)
        prop(m, DUT, "regs.soft_reset_when_quiet", quiet_before, when=dut.soft_reset,
             witness=dut.soft_reset & waited)
        prop(m, DUT, "regs.inv.draining", dut.draining == asked, cover=False)
        prop(m, DUT, "regs.inv.reset_once", ~(dut.soft.pending & dut.soft_reset), cover=False)
        # Invariants: one request answered at a time.
        k = checker
        prop(m, DUT, "regs.inv.b_pending", bus.bvalid == (k.aw_out != 0), cover=False)
        prop(m, DUT, "regs.inv.r_pending", bus.rvalid == (k.ar_out != 0), cover=False)
        prop(m, DUT, "regs.inv.aw_w", k.aw_out == k.w_out, cover=False)

    return Harness(dut, extra)


# ---- streams: the handshakes of the stream ports inside the chip --------------------

def slice_harness(width=8):
    """`RegisterSlice` on a `width`-bit payload (the slice only moves its
    payload: any width behaves bit for bit the same)."""
    from mxu.hdl.slice import RegisterSlice
    dut = RegisterSlice(width)

    def extra(m, dut):
        stream_check(m, dut.i, source=ENV, sink=DUT, name="slice.i")
        stream_check(m, dut.o, source=DUT, sink=ENV, name="slice.o")

    return Harness(dut, extra)


def transfer_harness(config):
    """`TransferEngine` (load side): its DMA command stream, at most two DMA
    commands in flight (the DMA overlaps two loads), idle exactly when none
    is."""
    from mxu.hdl.dma import DmaDir
    from mxu.hdl.transfer import TransferEngine
    dut = TransferEngine(config, DmaDir.LOAD)

    def extra(m, dut):
        stream_check(m, dut.cmd, source=ENV, sink=DUT, name="transfer.cmd")
        # After an error completion the engine refuses further commands; one
        # it offered stays offered until taken (docs/formal.md).
        stream_check(m, dut.dma_cmd, source=DUT, sink=ENV, name="transfer.dma_cmd")
        stream_check(m, dut.dma_done, source=ENV, sink=DUT, name="transfer.dma_done")
        stream_check(m, dut.complete, source=DUT, sink=ENV, name="transfer.complete")
        # The DMA answers each command once.
        out = Signal(range(4))
        fired = dut.dma_cmd.valid & dut.dma_cmd.ready
        done = dut.dma_done.valid & dut.dma_done.ready
        m.d.sync += out.eq(out + fired - done)
        prop(m, ENV, "transfer.dma_done_after_cmd", out != 0, when=dut.dma_done.valid)
        prop(m, DUT, "transfer.dma_commands_max", out <= 2, witness=out == 2)
        prop(m, DUT, "transfer.inv.idle", dut.idle == (out == 0), cover=False)
        return After(lambda m: prop(m, DUT, "transfer.inv.inflight", dut.inflight == out,
                                    cover=False))

    return Harness(dut, extra)


def fetch_harness(config):
    """`InstructionFetch`: the AXI4 manager rules on its read channels (one
    burst outstanding, at most 16 beats, its ID; the write channels unused),
    and the stream rules on its instruction stream, except in the cycle after a
    ``start``, which empties its queue (the controller starts afresh with it).
    ``start`` comes only while it is not busy (the register file's rule)."""
    from mxu.hdl.axi import AXI4Signature
    from mxu.hdl.fetch import FETCH_AXI_ID, InstructionFetch
    from .checkers import AXI4ManagerChecker
    dut = InstructionFetch(config)
    c = config

    def extra(m, dut):
        axi = AXI4ManagerChecker(AXI4Signature(addr_width=c.axi_addr_bits,
                                               data_width=c.axi_data_bits),
                                 manager=DUT, max_outstanding=1, max_burst=16, reads=True,
                                 writes=False, manager_id=FETCH_AXI_ID, name="fetch.axi")
        m.submodules.axi = axi
        attach(m, axi.tap, dut.axi)
        for ch in ("aw", "w"):
            prop(m, DUT, f"fetch.axi.{ch}.unused", ~getattr(dut.axi, f"{ch}valid"), cover=False)
        prop(m, ENV, "fetch.env.no_b", ~dut.axi.bvalid)
        prop(m, ENV, "fetch.env.start_when_idle", ~dut.busy, when=dut.start)
        past = Past(m, "fetch")
        stream_check(m, dut.instr, source=DUT, sink=ENV, name="fetch.instr",
                     exempt=past(dut.start, "start"))
        # Induction lemmas: the AR register always holds a legal burst (it is
        # only written with one), and the next burst's address is beat-aligned
        # while the fetch is active (so the beats to the 4 KiB boundary are
        # at least 1).
        from .checkers import _burst_in_page
        lg = (c.axi_data_bytes - 1).bit_length()
        prop(m, DUT, "fetch.inv.ar_legal", (dut.axi.arlen < 16)
             & _burst_in_page(dut.axi.araddr, dut.axi.arlen, dut.axi.arsize), cover=False)

        def inside(m):
            state = dut.lemma_state
            prop(m, DUT, "fetch.inv.addr_aligned", ~state["active"] | (state["addr"][:lg] == 0),
                 cover=False)
            # One burst at a time: the beats the fetch still expects are its
            # AR's (while it waits) or what the checker's burst has left.
            left = state["outstanding"]
            prop(m, DUT, "fetch.inv.one_burst",
                 (axi.ar_count + dut.axi.arvalid) == (left != 0), cover=False)
            prop(m, DUT, "fetch.inv.beats_left",
                 Mux(dut.axi.arvalid, left == dut.axi.arlen + 1,
                     (axi.ar_count == 0) | (left == axi.rlens[0] + 1 - axi.r_beat)),
                 cover=False)
            prop(m, DUT, "fetch.inv.no_beat", (axi.ar_count != 0) | (axi.r_beat == 0),
                 cover=False)
        return After(inside)

    return Harness(dut, extra)


def loop_harness(config):
    """`LoopExpander`: the stream rules on its output (and assumed on its
    input): a LOOP's expansion never withdraws an instruction it offered.
    The program's length is constant (the chip latches it at start; before it
    did, a host write to PROG_LEN during a run could turn an offered LOOP word
    from illegal, passed on, into legal, taken: this proof found it)."""
    from mxu.hdl.loop import LoopExpander
    dut = LoopExpander(config)

    def extra(m, dut):
        stream_check(m, dut.i, source=ENV, sink=DUT, name="loop.i")
        stream_check(m, dut.o, source=DUT, sink=ENV, name="loop.o")
        # The chip latches the length at start (hdl/top.py): constant in a run.
        past = Past(m, "loop")
        prop(m, ENV, "loop.env.length_constant", dut.length == past(dut.length, "length"),
             when=~past.after_reset)

    return Harness(dut, extra)


def memory_harness(config, which):
    """`Vmem` or `AccMem` (``which``): the arbitration of its banks. For every
    pair of write (read) requestors, two never write (read) one bank in the
    same cycle (``one_writer_per_bank``), and a requestor is refused exactly
    when one before it in the documented priority order uses its bank
    (``priority``); a read answers one cycle after it is taken
    (``read_one_cycle``)."""
    from mxu.hdl.accmem import AccMem
    from mxu.hdl.vmem import Vmem, lane_port_names
    dut = Vmem(config, weight_port=True) if which == "vmem" else AccMem(config)
    banks = config.vmem_banks if which == "vmem" else config.acc_banks
    lg = (banks - 1).bit_length()
    # The documented priority orders (docs/memory.md; hdl/vmem.py, hdl/accmem.py).
    if which == "vmem":
        lanes = config.weight_rows_per_cycle
        reads = ["array_read"] + lane_port_names("weight_read", lanes) + ["dma_read"]
        writes = lane_port_names("dma_write", lanes) + (["vector_write"] if config.vpu else [])
    else:
        reads = ["array_read", "dma_read"] + (["vector_read_a", "vector_read_b"]
                                               if config.vpu else [])
        writes = ["array_write", "dma_write"] + (["vector_write"] if config.vpu else [])

    def extra(m, dut):
        past = Past(m, which)

        def bank(addr):
            return addr[:lg] if lg else 0

        for kind, names in (("write", writes), ("read", reads)):
            ports = []
            for n in names:
                p = getattr(dut, n)
                s = p if kind == "write" else p.req
                addr = s.payload.addr if kind == "write" else s.payload
                ports.append((n, s, addr))
                stream_check(m, s, source=ENV, sink=DUT, name=f"{which}.{n}")
            for j, (nj, sj, aj) in enumerate(ports):
                higher = [(si.valid & (bank(ai) == bank(aj))) for _, si, ai in ports[:j]]
                if higher:          # the first port is refused by nobody
                    blocked = Cat(*higher).any()
                    prop(m, DUT, f"{which}.{nj}.priority", sj.ready == ~blocked, when=sj.valid,
                         witness=sj.valid & blocked)
                for i, (ni, si, ai) in enumerate(ports[:j]):
                    both = si.valid & si.ready & sj.valid & sj.ready
                    prop(m, DUT, f"{which}.{ni}_{nj}.one_{kind}r_per_bank",
                         ~both | (bank(ai) != bank(aj)), witness=both)
            if kind == "read":
                for n, s, _ in ports:
                    resp = getattr(dut, n).resp
                    was = past(s.valid & s.ready, n) & ~past.after_reset
                    prop(m, DUT, f"{which}.{n}.read_one_cycle", resp.valid == was, witness=was)

    return Harness(dut, extra)


# ---- controller: dependency tokens ------------------------------------------------

def controller_harness(config, token_bits=2):
    """`Controller`: ghost token counters, kept from what the engines report
    (completions with push flags) and what they take (commands with pop
    flags), against which:

    * no instruction issues unless every token it pops was pushed, by a
      completion in an earlier cycle, and not yet popped (``pop_available``);
    * more than ``2**token_bits - 1`` tokens outstanding on a link stops the
      run with an error (``overflow_stops``): the counter never wraps;
    * an instruction at the head of its queue whose tokens are there is
      offered to its engine in the same cycle, unless the run has failed
      (``issue_when_ready``);
    * the command streams keep the stream rules, except that a failed run
      withdraws them (docs/isa.md: after an error no engine starts another
      instruction).

    The engines are free: any completion at any time, any idle or error
    signal; the fetched instructions are any words that keep the stream rules.
    The counters are `token_bits` wide (16 in the chip): their logic does not
    depend on the width, and 2 bits let the prover reach a full counter.
    """
    from mxu.hdl.controller import Controller, token_links
    from mxu.hdl.fetch import FetchedInstr
    from mxu.hdl.isa import Header
    dut = Controller(config, token_bits=token_bits)
    names, links = token_links(dut.engines)
    top = (1 << token_bits) - 1

    def extra(m, dut):
        stream_check(m, dut.instr, source=ENV, sink=DUT, name="ctrl.instr")
        past = Past(m, "ctrl")
        # The engines: idle after reset, idle until they take an instruction,
        # completing only while busy (or a SYNC, as it is taken); start only
        # while the controller is not busy (the register file ignores it then).
        prop(m, ENV, "ctrl.env.start_when_idle", ~dut.busy, when=dut.start)
        for e in dut.engines:
            lower = e.name.lower()
            cmd, idle = getattr(dut, f"{lower}_cmd"), getattr(dut, f"{lower}_idle")
            taken = cmd.valid & cmd.ready
            prop(m, ENV, f"ctrl.env.{lower}_idle_after_reset", idle, when=past.after_reset)
            prop(m, ENV, f"ctrl.env.{lower}_stays_idle", idle,
                 when=past(idle & ~taken, f"{lower}_idle") & ~past.after_reset)
            prop(m, ENV, f"ctrl.env.{lower}_completes_when_busy", ~idle | taken,
                 when=getattr(dut, f"{lower}_complete").valid)
        # Tokens outstanding per link, saturating one above the limit (an
        # overflow has happened).
        ghost = {n: Signal(range(top + 2), name=f"ghost_{n}") for n in names}
        inc = {n: [] for n in names}
        dec = {n: [] for n in names}
        failed = dut.error != ErrorCode.NONE
        for e in dut.engines:
            lower = e.name.lower()
            cmd = getattr(dut, f"{lower}_cmd")
            complete = getattr(dut, f"{lower}_complete")
            stream_check(m, cmd, source=DUT, sink=ENV, name=f"ctrl.{lower}_cmd", exempt=failed)
            if e == Engine.COMPUTE:
                deps, link = cmd.payload.push.deps, cmd.payload.push.vector
            else:
                deps, link = cmd.payload.deps, cmd.payload.as_value()[VECTOR_LINK_BIT]
            taken = cmd.valid & cmd.ready
            for side, flag, push_name, pop_name, shared in links[e]:
                mine = (link == flag) if shared else 1
                gives = (complete.payload.vector == flag) if shared else 1
                dec[pop_name].append(taken & getattr(deps, f"pop_{side}") & mine)
                inc[push_name].append(complete.valid & getattr(complete.payload.deps, f"push_{side}")
                                      & gives)
        for n in names:
            g = ghost[n]
            pushed, popped = Cat(*inc[n]).any(), Cat(*dec[n]).any()
            with m.If(g != top + 1):
                m.d.sync += g.eq(g + pushed - popped)
            prop(m, DUT, f"ctrl.tokens.{n}.pop_available", g != 0, when=popped,
                 witness=popped & (g == 1))
            prop(m, DUT, f"ctrl.tokens.{n}.overflow_stops", failed, when=g == top + 1)
            prop(m, DUT, f"ctrl.inv.ghost_{n}", g <= top + 1, cover=False)
        # After an overflow the count is lost: the next run needs a (soft) reset,
        # as after any error (docs/isa.md), before its start.
        overflowed = Cat(*(g == top + 1 for g in ghost.values())).any()
        prop(m, ENV, "ctrl.env.reset_after_overflow", ~dut.start, when=overflowed)

        def inside(m):
            stopped = Cat(*(dut.queues[e].level == 0 for e in dut.engines),
                          *(getattr(dut, f"{e.name.lower()}_idle") for e in dut.engines)).all()
            prop(m, DUT, "ctrl.inv.idle_when_stopped", stopped, when=~dut.busy, cover=False)
            prop(m, DUT, "ctrl.inv.failed", dut.failed == failed, cover=False)
            for n in names:
                prop(m, DUT, f"ctrl.inv.tokens_{n}",
                     dut.tokens[n] == Mux(ghost[n] > top, top, ghost[n]), cover=False)
            for e in dut.engines:
                lower = e.name.lower()
                q = dut.queues[e]
                cmd = getattr(dut, f"{lower}_cmd")
                word = FetchedInstr(q.r_data).word
                head, link = Header(word[:16]), word[VECTOR_LINK_BIT]
                have = []
                for side, flag, push_name, pop_name, shared in links[e]:
                    mine = (link == flag) if shared else 1
                    have.append(~(getattr(head.deps, f"pop_{side}") & mine)
                                | (ghost[pop_name] != 0))
                ready = q.r_rdy & Cat(*have).all() & ~failed
                prop(m, DUT, f"ctrl.{lower}.issue_when_ready", cmd.valid, when=ready)
        return After(inside)

    return Harness(dut, extra)


# ---- array: the weight queue and tile admission -----------------------------------

# The multiply-add's arithmetic is cut out (its result is any value; the valid
# bits and every register stay): the weight path and the handshakes do not
# depend on the numbers (docs/formal.md).
CUT_MAC = ("cutpoint top.dut.pe_*.mac.round", "flatten", "opt_clean")
CUT_COMPUTE = ("cutpoint top.dut.array.pe_*.mac.round", "flatten", "opt_clean")


def array_harness(rows, cols, mac_stages, weight_rows=1, array=None):
    """`SystolicArray` (`weight_rows` weight rows a beat): at every PE, a shadow
    weight that holds a row not yet switched in is never overwritten
    (``no_overwrite``), and a switch always takes a loaded shadow row
    (``switch_loaded``: the tile switched in was staged completely); the
    stream rules on its ports, and one result per accepted activation beat.
    `array`: a `SystolicArray` subclass to check instead (a mutant)."""
    from mxu.hdl.array import SystolicArray
    dut = (array or SystolicArray)(rows, cols, mac_stages, weight_rows=weight_rows)

    def extra(m, dut):
        for name in ("act", "seed", "weight"):
            stream_check(m, getattr(dut, name), source=ENV, sink=DUT, name=f"array.{name}")
        stream_check(m, dut.result, source=DUT, sink=ENV, name="array.result")
        taken = dut.act.valid & dut.act.ready
        prop(m, DUT, "array.act_with_seed", dut.seed.valid & dut.seed.ready, when=taken)
        flight, ghost = _beat_ghost(m, dut)
        prop(m, DUT, "array.result_per_beat", flight != 0, when=dut.result.valid)
        prop(m, DUT, "array.first_when_ready", dut.weights_ready,
             when=taken & dut.act.payload.first)

        def inside(m):
            for r in range(rows):
                for c in range(cols):
                    pe = dut.pes[r][c]
                    full = Signal(name=f"shadow_full_{r}_{c}")
                    load = pe.en & pe.weight.load
                    switch = pe.en & pe.west.switch
                    with m.If(load):
                        m.d.sync += full.eq(1)
                    with m.Elif(switch):
                        m.d.sync += full.eq(0)
                    prop(m, DUT, f"array.pe_{r}_{c}.no_overwrite", ~full | switch, when=load,
                         witness=load & full & switch)
                    prop(m, DUT, f"array.pe_{r}_{c}.switch_loaded", full, when=switch)
                    fulls[r, c] = full
            _weight_lemmas(m, dut, fulls)
            _staggered_lemmas(m, dut, fulls)
            _valid_lemmas(m, dut, flight, ghost)
        fulls = {}
        return After(inside)

    return Harness(dut, extra)


def _beat_ghost(m, array):
    """Ghost state of a `SystolicArray`'s beats: their count in flight
    (taken, not yet out), and the beats taken delayed by the global enable as
    the array's valid bits are (``ghost[d]``: the beat taken ``d`` enabled
    cycles ago), for `_valid_lemmas`."""
    taken = array.act.valid & array.act.ready
    flight = Signal(range(array.latency + 3))
    m.d.sync += flight.eq(flight + taken - (array.result.valid & array.result.ready))
    en = ~array.result.valid | array.result.ready
    ghost = [taken]
    for i in range(array.latency):
        reg = Signal(name=f"ghost_beat_{i + 1}")
        with m.If(en):
            m.d.sync += reg.eq(ghost[-1])
        ghost.append(reg)
    return flight, ghost


def _valid_lemmas(m, dut, flight, ghost):
    """Induction lemmas of the array's beat count (any weight scheme): every
    valid register of the array (the seed's
    skew, each MAC's stages) holds the beat taken as many enabled cycles
    ago as it is deep, and the count of beats in flight is the number of
    those in the ghost delay line."""
    S = dut.mac_stages
    for r in range(dut.rows):
        for c in range(dut.cols):
            stages = dut.pes[r][c].mac.valid_stages
            for j, reg in enumerate(stages, 1):
                prop(m, DUT, f"array.inv.valid_{r}_{c}_{j}", reg == ghost[c + r * S + j],
                     cover=False)
    for c in range(1, dut.cols):
        prop(m, DUT, f"array.inv.seed_valid_{c}", dut.pes[0][c].north.valid == ghost[c],
             cover=False)
    prop(m, DUT, "array.inv.flight", flight == sum(ghost[1:]), cover=False)


def _column_lemmas(m, dut, fulls):
    """Column c > 0 sees column 0's loads and switches c steps of the global
    enable later (the weight bus and the switch marker move one column a
    step, in every weight scheme): a PE's ghost "shadow full" bit is its west
    neighbour's, undone by the load and the switch on their way between them
    (the PE's inputs now, ``shadow_*``); a switch marker between two columns
    finds its PE's shadow loaded (``switch_*``), a row on the weight bus
    finds it free or switching (``load_*``)."""
    for r in range(dut.rows):
        for c in range(1, dut.cols):
            pe = dut.pes[r][c]
            west = Mux(pe.weight.load, 1, Mux(pe.west.switch, 0, fulls[r, c]))
            prop(m, DUT, f"array.inv.shadow_{r}_{c}", fulls[r, c - 1] == west, cover=False)
            # A switch marker on its way (also while the array stalls) finds
            # the shadow register loaded.
            prop(m, DUT, f"array.inv.switch_{r}_{c}", ~pe.west.switch | fulls[r, c], cover=False)
            prop(m, DUT, f"array.inv.load_{r}_{c}",
                 ~pe.weight.load | ~fulls[r, c] | pe.west.switch, cover=False)


def _staggered_lemmas(m, dut, fulls):
    """Induction lemmas of `_StaggeredWeights` (``mac_stages`` >= 3, or more
    than one weight row a beat). A tile leaves the queue beat by beat
    (``beat``: the next beat to leave); row k, of beat ``b = k // w``, is
    loaded ``d_k = k * mac_stages - b`` steps after its beat left, and its
    switch arrives ``k * mac_stages`` steps after row 0's:

    * ``pending0`` is row 0's ghost "shadow full" bit at column 0;
      ``loaded`` (a whole tile out of the queue, not switched in) is
      ``pending0`` with the next beat 0, and without ``pending0`` no beat
      of a tile has left (``tile``);
    * row k's bit at column 0, advanced by the loads and switches on their
      way to it in the order they arrive (the taps of the weight bus's valid
      and beat lines and of the switch skew), is "the tile's beat b has
      left and the tile has not switched in at row 0": ``pending0`` and
      (``beat`` > b or ``loaded``) (``row_*``); every switch on its way
      finds the row loaded when it arrives, every load finds it free or
      switching (``ahead_*``);
    * the columns as `_column_lemmas`."""
    from mxu.hdl.array import _StaggeredWeights
    weights = dut.weights
    if not isinstance(weights, _StaggeredWeights):
        return
    top = inner(dut)
    pending0, loaded = top["pending0"], top["loaded"]
    beat = top["row" if dut.weight_rows == 1 else "beat"]
    S, w, valid, switch = dut.mac_stages, dut.weight_rows, weights._valid, dut.switch_taps
    on_bus = weights._beat
    prop(m, DUT, "array.inv.pending0", fulls[0, 0] == pending0, cover=False)
    prop(m, DUT, "array.inv.tile", (loaded == (pending0 & (beat == 0)))
         & (pending0 | (beat == 0)), cover=False)
    for k in range(1, dut.rows):
        b, d = k // w, weights._delay[k]
        state = fulls[k, 0]
        for i in range(k * S):                  # the events arriving in i steps
            load = valid[d - i] & (on_bus[d - i] == b) if d - i >= 1 else C(0, 1)
            sw = switch[k * S - i]
            prop(m, DUT, f"array.inv.ahead_{k}_{i}",
                 (~sw | state) & (~load | ~state | sw), cover=False)
            state = Mux(load, 1, Mux(sw, 0, state))
        prop(m, DUT, f"array.inv.row_{k}", state == (pending0 & ((beat > b) | loaded)),
             cover=False)
    _column_lemmas(m, dut, fulls)


def _weight_lemmas(m, dut, fulls):
    """Induction lemmas of the array's weight path (`_RowFreeWeights`, two
    rows, two MAC stages: the proofs' array):

    * column 0's ghost "shadow full" bit is the admission's ``pending`` bit
      of its row (``pending_*``), the other columns' as `_column_lemmas`;
    * the queue holds at most its depth (``queue_level``: its own
      counter's range is larger); ``staged`` counts the rows in the queue,
      plus the drained rows of the tile not yet switched in at row 0
      (``pending[0]``), less the rows of a switched-in tile still in the
      queue (``staged``); that tile's drained rows are all pending
      (``drained_*``);
    * a switch marker on its way to row 1 finds row 1 written, or written in
      the next step: its tile's row 1 is pending (and no earlier marker
      reaches row 1 now), or it is at the queue's head (no later tile's
      row 0 written yet) and row 1 is free (``marker``); none is on its way while a whole tile waits
      (``no_marker``).

    With them and `_valid_lemmas` every property of ``array.weights_s2`` is
    inductive."""
    from mxu.hdl.array import _RowFreeWeights
    weights = dut.weights
    if not isinstance(weights, _RowFreeWeights):
        return
    rows = dut.rows
    pending, d, level = weights.pending, weights.drain_row, weights.queue.level
    for r in range(rows):
        prop(m, DUT, f"array.inv.pending_{r}", fulls[r, 0] == pending[r], cover=False)
        if r:
            prop(m, DUT, f"array.inv.switch_{r}_0",
                 ~dut.switch_taps[r * dut.mac_stages] | pending[r], cover=False)
    _column_lemmas(m, dut, fulls)
    prop(m, DUT, "array.inv.queue_level", level <= dut.weight_queue_depth, cover=False)
    drained = Mux(pending[0], Mux(d == 0, rows, d), Mux(d == 0, 0, d - rows))
    # The tile not yet switched in at row 0 has its drained rows pending.
    for k in range(1, rows):
        prop(m, DUT, f"array.inv.drained_{k}", ~pending[0] | ((d != 0) & (d <= k)) | pending[k],
             cover=False)
    prop(m, DUT, "array.inv.staged", weights.staged == level + drained, cover=False)
    if rows == 2 and dut.mac_stages == 2:
        t1, t2 = dut.switch_taps[1], dut.switch_taps[2]
        prop(m, DUT, "array.inv.marker",
             ~t1 | (pending[1] & ~t2)
             | ((d == 1) & ~pending[0] & (level != 0) & (~pending[1] | t2)),
             cover=False)
        # A whole tile written and not switched in: its row 1 was written after
        # the tile before it switched in there, so no marker is on its way.
        prop(m, DUT, "array.inv.no_marker", ~(pending[0] & (d == 0)) | ~(t1 | t2), cover=False)


# ---- compute: the compute engine's streams ---------------------------------------------

def compute_harness(config, engine=None):
    """`ComputeEngine` (the array's arithmetic cut out, as in the array
    proofs): the stream rules on its command stream (assumed: the
    controller's), its weight read port, and the streams it drives into the
    array (activations, seeds, weight rows), whose results it always takes; a
    completion only for a MATMUL or SYNC taken, a SYNC taken only when every
    MATMUL before it has completed, and ``idle`` only then. The memories
    answer a read one cycle after it is taken; LOADW and MATMUL counts are
    at least 1 (the decoder's rules, docs/isa.md). `engine`: a
    `ComputeEngine` subclass to check instead (a mutant)."""
    from mxu.hdl.compute import ComputeEngine
    from mxu.hdl.isa import Opcode
    dut = (engine or ComputeEngine)(config)

    def extra(m, dut):
        past = Past(m, "compute")
        cmd = dut.cmd.payload
        is_sync = (cmd.opcode != Opcode.LOADW) & (cmd.opcode != Opcode.MATMUL)
        stream_check(m, dut.cmd, source=ENV, sink=DUT, name="compute.cmd")
        prop(m, ENV, "compute.env.legal",
             is_sync & (cmd.opcode == Opcode.SYNC) | ~is_sync & (cmd.count != 0)
             & (cmd.count <= config.rows), when=dut.cmd.valid)
        for port in ("act_read", *dut.weight_reads, "seed_read"):
            p = getattr(dut, port)
            prop(m, ENV, f"compute.env.{port}_one_cycle",
                 p.resp.valid == (past(p.req.valid & p.req.ready, port) & ~past.after_reset))
        for port in dut.weight_reads:
            stream_check(m, getattr(dut, port).req, source=DUT, sink=ENV, name=f"compute.{port}")
        for name in ("act", "seed", "weight"):
            stream_check(m, getattr(dut.array, name), source=DUT, sink=DUT,
                         name=f"compute.array.{name}")
        # The accumulator's result port never refuses: results never wait.
        prop(m, DUT, "compute.array.result_taken", dut.array.result.ready,
             when=dut.array.result.valid)
        # MATMULs and SYNCs taken and not yet completed (a ghost count, wide
        # enough for a command a cycle through any bound: at the formula's 16
        # cycles a 3-bit count wrapped, after seven MATMULs open).
        open_ = Signal(range(64))
        counted = dut.cmd.valid & dut.cmd.ready & (cmd.opcode != Opcode.LOADW) & (dut.error.as_value() == 0)
        done = dut.complete.valid
        m.d.sync += open_.eq(open_ + counted - done)
        prop(m, DUT, "compute.complete_after_cmd", (open_ != 0) | counted, when=done)
        prop(m, DUT, "compute.sync_when_done", open_ == 0,
             when=dut.cmd.valid & dut.cmd.ready & is_sync)
        prop(m, DUT, "compute.idle_when_done", open_ == 0, when=dut.idle & (dut.error.as_value() == 0))
        flight, ghost = _beat_ghost(m, dut.array)
        return After(lambda m: _compute_lemmas(m, dut, open_, flight, ghost))

    return Harness(dut, extra)


def _compute_lemmas(m, dut, open_, flight, ghost):
    """The induction lemmas of `ComputeEngine` (docs/formal.md): the MATMULs
    open (the harness's count) are those in the command queue, the rows
    marked last in the activation streamer's two stages and in the record of
    pending rows, and a MATMUL refused for want of weights (it never
    completes); the record's pointers, valid bits and head register agree
    with its count, which is the rows read and not yet in the array (the
    read in flight, the skid buffer) and the array's beats (`_valid_lemmas`:
    its valid registers against a ghost delay line)."""
    from amaranth.lib import data
    from mxu.hdl.compute import pending_entry_layout
    from mxu.hdl.isa import ErrorCode, Pushes
    from mxu.hdl.vmem import _addr_shape
    pend = inner(dut, "pending")
    top = inner(dut)
    n = dut.pending_depth
    count, rp, valid = pend["count"], pend["rp"], pend["valid"]
    wp = pend.unnamed(len(rp))                  # (`wp, rp = Signal(...), Signal(...)`)
    c = dut.config
    entry = pending_entry_layout(_addr_shape(c.acc_rows))
    entries = [pend[f"entry{i}"] for i in range(n)]

    def lemma(name, test):
        prop(m, DUT, f"compute.inv.{name}", test, cover=False)

    lg = (n - 1).bit_length()
    lemma("pending.count", (count <= n) & (pend["full"] == (count == n))
          & (pend["rp1"] == (rp + 1)[:lg]) & ((wp - rp)[:lg] == count[:lg]))
    for i in range(n):
        lemma(f"pending.valid{i}", valid[i] == ((i - rp)[:lg] < count))
    head = Array(entries)[rp]
    lemma("pending.head", (count == 0) | (pend["head"] == head))
    _valid_lemmas(m, dut.array, flight, ghost)
    skid = dut.askid
    lemma("askid.pointers", skid.lemma())
    lemma("matmul_q.pointers", dut.matmul_q.lemma())
    lemma("loadw_q.pointers", dut.loadw_q.lemma())
    lemma("credits", top["credits"] + skid.level + top["inflight"] == skid.depth)
    lemma("rows", count == top["inflight"] + skid.level + flight)
    lasts = sum(valid[i] & entry(entries[i]).last for i in range(n))
    # (`nxt, nxt_valid = Signal(row), Signal()`, and `cur` likewise: the two
    # unnamed rows, the stage "next" assigned first.)
    row = data.StructLayout({       # (`_activation_streamer`'s row)
        "act": _addr_shape(c.vmem_rows), "seed": _addr_shape(c.acc_rows),
        "out": _addr_shape(c.acc_rows), "last": 1, "first": 1, "reads_seed": 1, "push": Pushes})
    nxt, cur = (row(top.unnamed(row.size, of=2, nth=k)) for k in (0, 1))
    failed = top["failed"]
    lemma("failed", failed == (dut.error.as_value() != ErrorCode.NONE))
    lemma("open", open_ == dut.matmul_q.level + (top["nxt_valid"] & nxt.last)
          + (top["cur_valid"] & cur.last) + lasts + (dut.error == ErrorCode.NO_WEIGHTS))


# ---- vector: the vector engine's streams ----------------------------------------------

# The stand-in ALU's depth: the engine's issue, interlock and write logic do
# not depend on the ALU's latency (the FIFO of the rows' meta beside it is
# sized from it), and a 28-stage pipeline would make every bound 25 cycles
# longer and that FIFO 64 entries deep.
FREE_ALU_LATENCY = 3


class _FreeAlu(wiring.Component):
    """`VectorAlu`'s handshake without its arithmetic: a stallable pipeline of
    `FREE_ALU_LATENCY` stages whose result is any value (chosen as a row
    enters a stage, held while it stalls)."""

    def __init__(self, config):
        from mxu.hdl.vpu import vector_alu_signature
        self.config = config
        super().__init__(vector_alu_signature(config))

    def elaborate(self, platform):
        from mxu.hdl.vpu import _valid_chain     # the lanes' own valid pipeline
        m = Module()
        enable = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(enable)
        valid = _valid_chain(m, enable, self.i.valid, FREE_ALU_LATENCY)
        with m.If(enable):
            m.d.sync += self.o.payload.eq(AnySeq(len(self.o.payload.as_value())))
        m.d.comb += self.o.valid.eq(valid)
        return m


def vector_harness(config, reader=None):
    """`VectorUnit` with a stand-in ALU (`_FreeAlu`): the stream rules on its
    command stream (assumed: the controller's), its read and write ports, and
    between its sections (operand rows, the ALU's input and output, the rows'
    meta); a completion only for a VECTOR taken, at most `RANGES` in flight,
    a SYNC taken only when none is, and ``idle`` only then. The memories
    answer a read one cycle after it is taken; the commands keep the
    decoder's rules (docs/isa.md: ``rows`` >= 1, ``b_mode`` not 3, a
    transposed VECTOR goes to VMEM with at most ``vmem_row_elems`` rows).
    `reader`: an `_OperandReader` subclass to use instead (a mutant)."""
    from mxu.hdl.isa import Opcode
    from mxu.hdl.vpu import VectorUnit

    class FreeAluVectorUnit(VectorUnit):
        def __init__(self, config):
            super().__init__(config)
            if reader is not None:
                self.reader._MustUse__used = True       # (replaced)
                self.reader = reader(config, self.BUFFER_DEPTH)

        def _make_alu(self):
            return _FreeAlu(self.config)

        def _alu_latency(self):
            return FREE_ALU_LATENCY

    dut = FreeAluVectorUnit(config)
    c = config

    def extra(m, dut):
        past = Past(m, "vector")
        ins = dut.cmd.payload
        is_sync = ins.opcode == Opcode.SYNC
        stream_check(m, dut.cmd, source=ENV, sink=DUT, name="vector.cmd")
        prop(m, ENV, "vector.env.legal",
             ((ins.opcode == Opcode.VECTOR) & (ins.rows != 0) & (ins.flags.b_mode.as_value() != 3)
              & (~ins.flags.transpose | (ins.flags.to_vmem & (ins.rows <= c.vmem_row_elems))))
             | is_sync, when=dut.cmd.valid)
        for port in ("read_a", "read_b"):
            p = getattr(dut, port)
            stream_check(m, p.req, source=DUT, sink=ENV, name=f"vector.{port}")
            prop(m, ENV, f"vector.env.{port}_one_cycle",
                 p.resp.valid == (past(p.req.valid & p.req.ready, port) & ~past.after_reset))
        for port in ("acc_write", "vmem_write"):
            stream_check(m, getattr(dut, port), source=DUT, sink=ENV, name=f"vector.{port}")
        for name, port in (("reader.a", dut.reader.a), ("reader.b", dut.reader.b),
                           ("alu.i", dut.alu.i), ("alu.o", dut.alu.o),
                           ("writer.meta", dut.writer.meta)):
            stream_check(m, port, source=DUT, sink=DUT, name=f"vector.{name}")
        # VECTORs taken and not yet completed (a ghost count).
        most = VectorUnit.RANGES
        open_ = Signal(range(most + 2))
        started = dut.cmd.valid & dut.cmd.ready & ~is_sync
        m.d.sync += open_.eq(open_ + started - dut.writer.retire)
        prop(m, DUT, "vector.complete_after_cmd", open_ != 0, when=dut.writer.retire)
        prop(m, DUT, "vector.in_flight_max", open_ <= most, witness=open_ == most)
        prop(m, DUT, "vector.sync_when_done", open_ == 0,
             when=dut.cmd.valid & dut.cmd.ready & is_sync)
        prop(m, DUT, "vector.idle_when_done", open_ == 0, when=dut.idle)
        return After(lambda m: _vector_lemmas(m, dut, open_))

    return Harness(dut, extra)


def _vector_lemmas(m, dut, open_):
    """The induction lemmas of `VectorUnit` (docs/formal.md): the VECTORs in
    flight (the harness's count, the write-range table's) are those still
    reading ``a`` in the issue stage, the rows marked last in the pipeline
    (the read in flight, operand buffer ``a``, the meta FIFO beside the
    ALU), and a transposed block draining; the rows of one instruction are
    contiguous in the pipeline with the same flags, and a transposed one's
    rows (those the `RowTranspose` took, those in the pipeline, those the
    issue stage has still to read) are at most its ``rows`` <=
    ``vmem_row_elems``, so that a block ends on its last row."""
    from mxu.hdl.isa import VectorInstr
    from mxu.hdl.vpu import _row_meta_layout
    c = dut.config
    height = c.vmem_row_elems
    rd, wr = inner(dut, "reader"), inner(dut, "writer")
    tr = inner(dut, "writer", "transpose")
    ranges = inner(dut, "ranges")
    cur, cur_valid = VectorInstr(rd["cur"]), rd["cur_valid"]
    ia, ib = rd.unnamed(16), rd["ib"]       # (`ia, ib = Signal(16), Signal(16)`)
    inflight_a = rd.unnamed(1)              # (`inflight_a, inflight_b = ...`)
    a_left = cur_valid & (ia != cur.rows)
    meta_q = _row_meta_layout(c)(rd["meta_q"])
    fill, drain = fsm_state(tr["fsm_state"], "FILL"), fsm_state(tr["fsm_state"], "DRAIN")
    filled = tr["filled"]
    buf_a, beside = dut.reader.buf_a, dut.beside

    def lemma(name, test):
        prop(m, DUT, f"vector.inv.{name}", test, cover=False)

    # The pipeline's rows, oldest first: (valid, last, transpose, to_vmem).
    rows = []
    for fifo in (beside, buf_a):
        for i in range(fifo.depth):
            flags = fifo.entry(i)       # (to_vmem, transpose, swap, last, ...)
            rows.append((i < fifo.level, flags[3], flags[1], flags[0]))
    rows.append((inflight_a, meta_q.last, meta_q.transpose, meta_q.to_vmem))
    lemma("beside.pointers", beside.lemma())
    if dut._registered():
        lemma("out.pointers", dut.out.lemma())
    lemma("buf_a.pointers", buf_a.lemma())
    lemma("credits_a", rd["credits_a"] + buf_a.level + inflight_a == buf_a.depth)
    lemma("credits_b", rd["credits_b"] + inner(dut, "reader", "buf_b")["level"]
          + rd["inflight_b"] == buf_a.depth)
    lemma("issue", Mux(cur_valid, (ia <= cur.rows) & (ib <= cur.rows) & (cur.rows != 0)
                       & (~cur.flags.transpose | (cur.flags.to_vmem & (cur.rows <= height))),
                       (ia == 0) & (ib == 0)))
    # VECTORs in flight.
    lasts = sum(v & last for v, last, _, _ in rows)
    lemma("ranges", (ranges["count"] == open_) & (open_ <= dut.RANGES))
    lemma("in_flight", open_ == lasts + a_left + drain)
    lemma("drain", ~drain | (wr["t_col"] == tr["column"]))
    lemma("fill", ~fill | (filled < height))
    # Rows of one instruction: contiguous, with the same flags (a transposed
    # one goes to VMEM). Walking the rows oldest first, `open_seg` is "the
    # rows so far end in an instruction whose last row is still to come"
    # (from the start: a block the transpose has begun), `flags` its flags;
    # at the end such an instruction is the issue stage's, still reading.
    # (Each step is a signal of its own, so that the lemmas share them.)
    open_seg, flags = fill & (filled != 0), Cat(C(1, 1), C(1, 1))
    for p, (v, last, t, vm) in enumerate(rows):
        lemma(f"row{p}.to_vmem", ~v | ~t | vm)
        lemma(f"row{p}.same", ~(v & open_seg) | (Cat(t, vm) == flags))
        nxt_open, nxt_flags = Signal(name=f"seg_open{p}"), Signal(2, name=f"seg_flags{p}")
        m.d.comb += [nxt_open.eq(Mux(v, ~last, open_seg)), nxt_flags.eq(Mux(v, Cat(t, vm), flags))]
        open_seg, flags = nxt_open, nxt_flags
    lemma("issue_seg", ~open_seg | (a_left & (Cat(cur.flags.transpose, cur.flags.to_vmem) == flags)))
    # A transposed instruction's rows: taken by the transpose (the oldest),
    # in the pipeline, still to read; at most `height`. `before[p]`: its rows
    # before row p (those taken, then the pipeline's since the last row
    # marked last); `ahead[p]`: row p and the rows after it up to its last
    # (those still to read when it is the issue stage's).
    wide = 17
    before = [Mux(fill, filled, 0)]
    for v, last, _, _ in rows:
        step = Signal(wide, name=f"rows_before{len(before)}")
        m.d.comb += step.eq(Mux(v & last, 0, before[-1] + v))
        before.append(step)
    ahead = [Mux(a_left, cur.rows - ia, 0)]
    for v, last, _, _ in reversed(rows):
        step = Signal(wide, name=f"rows_ahead{len(rows) - len(ahead)}")
        m.d.comb += step.eq(Mux(v & last, 1, ahead[-1] + v))
        ahead.append(step)
    ahead = ahead[::-1]
    for p, (v, _, t, _) in enumerate(rows):
        lemma(f"row{p}.height", ~(v & t) | (before[p] + ahead[p] <= height))
    lemma("issue_rows", ~(a_left & cur.flags.transpose) | (ia == before[-1]))


# ---- dma: the AXI4 manager ------------------------------------------------------------

class SoftResetDma(wiring.Component):
    """A `Dma` behind the chip's soft reset (`mxu.hdl.regs.SoftReset`, as
    `MxuChip` has it): ``soft_request`` starts a drain (the DMA's ``drain``),
    and the DMA is reset once it is ``quiet``. The ports are the DMA's but
    ``drain``, with ``soft_request`` (In) and ``core_reset`` (Out: the reset
    pulse) added; the sections are reached as on the `Dma`.

    Parameters
    ----------
    dut : Dma
    soft : SoftReset (a mutant's subclass in `mxu.verif.formal.mutants`)
    """

    def __init__(self, dut, soft):
        self.dut, self.soft = dut, soft
        members = {k: v for k, v in dut.signature.members.items() if k != "drain"}
        super().__init__({**members, "soft_request": In(1), "core_reset": wiring.Out(1)})
        for name in ("bursts", "load_path", "contexts", "row_reader", "gearbox", "aw_queue",
                     "len_queue", "config"):
            setattr(self, name, getattr(dut, name))

    def elaborate(self, platform):
        from amaranth.hdl import ResetInserter
        m = Module()
        m.submodules.soft = soft = self.soft
        m.submodules.dma = ResetInserter(soft.reset)(self.dut)
        dut = self.dut
        m.d.comb += [soft.request.eq(self.soft_request), soft.quiet.eq(dut.quiet),
                     dut.drain.eq(soft.draining), self.core_reset.eq(soft.reset)]
        for path, member, value in self.signature.flatten(self):
            if path[0] in ("soft_request", "core_reset"):
                continue
            inner = dut
            for part in path:
                inner = inner[part] if isinstance(part, int) else getattr(inner, part)
            target, source = (inner, value) if member.flow == In else (value, inner)
            if not isinstance(Value.cast(target), Const):    # (always_ready members)
                m.d.comb += Value.cast(target).eq(source)
        return m


def dma_harness(config, direction, *, dma=None, soft_reset=False, soft=None):
    """`Dma` with descriptors of one direction (the chip's load DMA only
    loads, its store DMA only stores): the AXI4 manager rules on its bus
    (`AXI4ManagerChecker`, with the subordinate's assumed), the stream rules on
    its descriptor, completion and memory ports, one completion per
    descriptor; the memories answer a read one cycle after it is taken
    (`ReadPortSignature`). `dma` replaces the `Dma` class (mutants).

    With `soft_reset`, the DMA sits behind the chip's soft reset
    (`SoftResetDma`; `soft`: its `SoftReset` class), requested at any cycle:
    the AXI checker is not reset with it, so its rules must hold across the
    reset, and ``dma.soft_reset.drained`` asserts that the reset comes only
    when no burst is in flight (the checker's ghost counts are zero) and no
    VALID is up. The stream rules on the DMA's other ports are not checked in
    the cycle after the reset (their other side is reset with it in the chip).
    """
    from mxu.hdl.axi import AXI4Signature
    from mxu.hdl.dma import Dma, DmaDir
    from mxu.hdl.regs import SoftReset
    from .checkers import AXI4ManagerChecker
    dut = (dma or Dma)(config)
    if soft_reset:
        dut = SoftResetDma(dut, (soft or SoftReset)())
    load = direction == DmaDir.LOAD
    c = config

    def extra(m, dut):
        axi = AXI4ManagerChecker(AXI4Signature(addr_width=c.axi_addr_bits,
                                               data_width=c.axi_data_bits),
                                 manager=DUT, max_outstanding=c.dma_max_outstanding,
                                 max_burst=c.dma_max_burst_beats, reads=load, writes=not load,
                                 name="dma.axi")
        m.submodules.axi = axi
        attach(m, axi.tap, dut.axi)
        # The other direction's channels are never used (nothing to cover), and
        # never answer (in the chip they are not connected).
        for ch in ("aw", "w") if load else ("ar",):
            prop(m, DUT, f"dma.axi.{ch}.unused", ~getattr(dut.axi, f"{ch}valid"), cover=False)
        prop(m, ENV, "dma.env.no_answer_unused", ~(dut.axi.bvalid if load else dut.axi.rvalid))
        past = Past(m, "dma")
        reset = dut.core_reset if soft_reset else C(0, 1)
        # The cycle after a soft reset: the DMA's other sides were reset with it.
        after = past(reset, "core_reset") if soft_reset else None

        def exempt(more=None):
            return after if more is None else (more if after is None else after | more)
        if soft_reset:
            _soft_reset_checks(m, dut, axi, load)
        stream_check(m, dut.cmd, source=ENV, sink=DUT, name="dma.cmd", exempt=exempt())
        prop(m, ENV, "dma.env.direction", dut.cmd.payload.dir == direction, when=dut.cmd.valid)
        stream_check(m, dut.done, source=DUT, sink=ENV, name="dma.done", exempt=exempt())
        # Loads write on-chip rows, stores read them.
        for port in ("vmem_write", "acc_write") if load else ():
            stream_check(m, getattr(dut, port), source=DUT, sink=ENV, name=f"dma.{port}",
                         exempt=exempt())
        for port in ("vmem_read", "acc_read"):
            p = getattr(dut, port)
            if not load:
                stream_check(m, p.req, source=DUT, sink=ENV, name=f"dma.{port}",
                             exempt=exempt())
            prop(m, ENV, f"dma.env.{port}_one_cycle",
                 p.resp.valid == (past(p.req.valid & p.req.ready, port) & ~past.after_reset))
        # Between the DMA's sections (docs/formal.md): a load's bursts
        # (withdrawn only when an error response stops them), rows and
        # completions; a store's bursts (never refused), converted rows and W
        # burst lengths (both queues are emptied when a descriptor completes).
        if load:
            stream_check(m, dut.bursts.burst, source=DUT, sink=DUT, name="dma.bursts.burst",
                         exempt=exempt(dut.bursts.abort))
            stream_check(m, dut.load_path.row, source=DUT, sink=DUT, name="dma.load_path.row",
                         exempt=exempt())
            stream_check(m, dut.contexts.done, source=DUT, sink=DUT, name="dma.contexts.done",
                         exempt=exempt())
            # The load path takes the next load's context in the cycle of the
            # last row (back-to-back loads): the rules above must meet it.
            m.d.comb += Cover(dut.load_path.last & dut.load_path.restart, "dma.load_path.moves_on")
        else:
            # The AW queue has room for every burst the in-flight limit lets out.
            prop(m, DUT, "dma.bursts.store_never_stalls", dut.bursts.burst.ready,
                 when=dut.bursts.burst.valid)
            # (`clear` empties them at the next edge: the rows go a cycle later.)
            stream_check(m, dut.row_reader.rows, source=DUT, sink=DUT,
                         name="dma.row_reader.rows",
                         exempt=exempt(past(dut.row_reader.clear, "rr_clear")))
            stream_check(m, dut.gearbox.lengths, source=DUT, sink=DUT,
                         name="dma.gearbox.lengths",
                         exempt=exempt(past(dut.gearbox.clear, "gb_clear")))
        # One completion per descriptor; a load overlaps three descriptors (its
        # two receive contexts, and one taken into the descriptor register
        # that waits for a context), a store runs one at a time.
        most = 3 if load else 1
        open_ = Signal(range(most + 2))
        taken = dut.cmd.valid & dut.cmd.ready
        done = dut.done.valid & dut.done.ready
        m.d.sync += open_.eq(Mux(reset, 0, open_ + taken - done))
        # (Witness for a load: the third one taken, a cycle within the bound.)
        prop(m, DUT, "dma.descriptors_max", open_ <= most,
             witness=(taken & (open_ == most - 1)) if load else (done & (open_ == most)))
        prop(m, DUT, "dma.done_after_cmd", open_ != 0, when=dut.done.valid)
        if load:
            _load_lemmas(m, dut, axi, open_)
        else:
            _store_lemmas(m, dut, axi, open_, past, after)

    return Harness(dut, extra)


def _load_lemmas(m, dut, axi, open_):
    """The induction lemmas of a load (docs/formal.md): the receive contexts,
    the state machine and the burst generator against the AXI checker's
    ghost state and the harness's count of open descriptors. Counts, not
    addresses: an R beat is rx[0]'s while rx[0] has a burst on the bus
    (`Dma._responses`), so no lemma needs the load path's beat address.

    * One descriptor is open per valid receive context, and one more while
      the descriptor register holds one not yet given a context (CHECK,
      DECIDE, COMPLETE); every one is a load. CHECK and DECIDE work from
      the units taken with it (`Dma._take_units`), and a descriptor DECIDE
      starts passed the checks: it moves bytes. ``abort`` is set exactly
      with its code; COMPLETE comes only with no context.
    * rx[1] only behind an rx[0] whose bursts are all issued; outside RUN
      every context's bursts are issued and the burst generator is idle; in
      RUN the newest context issues. A context not valid is empty.
    * Bursts in flight (`_BurstGenerator.inflight`) = the AR register + the
      ARs the checker counts (no more than the limit) = the contexts' bursts
      less the last beat they take a cycle late (``r_last``), which, with
      an error response's ``r_error``, is rx[1]'s exactly when rx[0] had
      none left.
    * The AR register and the burst generator's next burst are legal.
    * The load path's row register is empty without a context and in a
      quantized one, and the store's queues are empty. Its ``ends``
      register is its compare of the beat's end with the row's (``ld_be >=
      ld_end``), which it keeps from the addresses' next values.
    * Quantized loads (chips with the expander): both contexts of one kind,
      each with whole groups of rows (``quant_rows`` a cycle), and rx[0]'s
      rows written (``_q_written``) whole groups within its rows, all of
      them exactly when ``full``, none outside a quantized rx[0].

    Behind a soft reset (`SoftResetDma`) the same lemmas hold: it comes only
    when nothing is in flight."""
    from mxu.hdl.dma import DmaDir, DmaError, _derived_layout, dma_descriptor_layout
    c = dut.config
    LG, MAXO, MAXB = (c.axi_data_bytes - 1).bit_length(), c.dma_max_outstanding, \
        c.dma_max_burst_beats
    path = ("dma",) if isinstance(dut, SoftResetDma) else ()
    core = dut.dut if isinstance(dut, SoftResetDma) else dut
    top = inner(dut, *path)
    state = top["fsm_state"]
    d = dma_descriptor_layout(c)(top["d"])
    run = fsm_state(state, "RUN")
    idle = fsm_state(state, "IDLE")
    bg = inner(dut, *path, "bursts")
    rc = dut.contexts
    rx0, rx1 = rc.rx0, rc.rx1
    inflight, ar_valid = dut.bursts.inflight, top["ar_valid"]
    row = dut.load_path.row

    def lemma(name, test):
        prop(m, DUT, f"dma.inv.{name}", test, cover=False)

    lemma("open", open_ == rx0.valid + rx1.valid + (~idle & ~run))
    lemma("load", idle | (d.dir == DmaDir.LOAD))
    lemma("no_store_run", ~top["store_run"])
    # CHECK and DECIDE work from the units taken with the descriptor, and
    # DECIDE starts a load from CHECK's registers: one that passed the
    # checks moves bytes.
    derived = _derived_layout(c)(top["derived"])
    check, decide = fsm_state(state, "CHECK"), fsm_state(state, "DECIDE")
    lemma("units", ~(check | decide) | (core._units.n == _units_of(c, d)))
    lemma("checked", ~decide | (top["failed_at"] != 0)
          | ((d.row_bytes != 0) & (core._units.n != 0) & (derived.total != 0)))
    status = core._status
    lemma("abort", status.abort == (status.abort_err != DmaError.OK))
    lemma("complete_alone", ~fsm_state(state, "COMPLETE") | ~rx0.valid)
    lemma("rx1_behind_rx0", ~rx1.valid | (rx0.valid & rx0.issued))
    lemma("rx0_empty", rx0.valid | ((rx0.bursts == 0) & ~rx0.issued))
    lemma("rx1_empty", rx1.valid | (rx1.as_value() == 0))
    lemma("issuing", Mux(run, rx0.valid & Mux(rx1.valid, ~rx1.issued, ~rx0.issued),
                         ~dut.bursts.active & (~rx0.valid | rx0.issued)
                         & (~rx1.valid | rx1.issued)))
    lemma("inflight", (inflight <= MAXO) & (inflight == axi.ar_count + ar_valid))
    lemma("contexts.bursts", (rx0.bursts + rx1.bursts == inflight + rc.r_last)
          & (rx0.bursts <= MAXO) & (rx1.bursts <= MAXO))
    beat = rc.r_last | rc.r_error
    lemma("contexts.late0", ~beat | rc.r_next | (rx0.bursts != 0))
    lemma("contexts.late1", ~beat | ~rc.r_next
          | (rx1.valid & (rx1.bursts != 0) & (rx0.bursts == 0)))
    lemma("r_beat", (axi.ar_count != 0) | (axi.r_beat == 0))
    lemma("ar_legal", ~ar_valid | ((dut.axi.arlen < MAXB)
                                   & _burst_in_page(dut.axi.araddr, dut.axi.arlen, LG)))
    lemma("next_burst", ~dut.bursts.active
          | ((bg["beats"] != 0) & (bg["x"][:LG] == 0) & (bg["seg_len"] != 0)))
    lemma("row_in_context", ~row.valid | (rx0.valid & ~core._qmode))
    lp = inner(dut, *path, "load_path")
    lemma("load_path.ends", lp["ends"] == (lp["ld_be"] >= lp["ld_end"]))
    lemma("no_stores", (dut.aw_queue.level == 0) & (dut.len_queue.level == 0))
    if c.quant_formats:
        written, full = core._q_written, inner(dut, *path)["full"]
        lg = (len(core.vmem_writes) - 1).bit_length()      # rows written a cycle
        lemma("quant.one_kind", ~rx1.valid | (rx1.quant == rx0.quant))
        lemma("quant.whole", ~decide | (top["failed_at"] != 0) | ~core._quant
              | ((d.rows[:lg] == 0) & (d.rows != 0)))
        for i, rx in enumerate((rx0, rx1)):
            lemma(f"quant.whole{i}", ~rx.valid | ~rx.quant
                  | ((rx.rows[:lg] == 0) & (rx.rows != 0)))
        lemma("quant.written", (written[:lg] == 0) & Mux(
            core._qmode, (written <= rx0.rows) & (full == (written == rx0.rows)),
            (written == 0) & ~full))


def _store_lemmas(m, dut, axi, open_, past, after=None):
    """The induction lemmas of a store (docs/formal.md): the DMA's state
    against the AXI checker's ghost state and the harness's count of open
    descriptors.

    * Outside RUN and COMPLETE nothing is in flight and the sections are
      empty; one descriptor is open exactly outside IDLE, and it is a store.
    * Bursts in flight (`_BurstGenerator.inflight`) = the AW queue's level
      + the AWs the checker counts = the W length queue's level + the W
      bursts it counts; the queues' pointers agree with their levels
      (`Fifo.lemma`), and every queued burst is legal.
    * The two queues and the checker's queue of half-done bursts (``lens``)
      hold the same bursts in the same order: the bursts whose AW has gone
      and whose W has not are the oldest of the length queue, and the
      checker's ``lens`` while AW leads; while W leads, they are the oldest
      of the AW queue and ``lens``. The gearbox's beat count is the
      checker's, within its burst.
    * The burst generator's next burst is legal (a beat-aligned address, a
      segment of at least a beat). The store's run register is RUN.
    * The rows (`_row_lemmas`): each marked first and last as its index
      says, so that a gearbox holding part of a beat without a flush never
      takes a first row (written from byte ``off``, into the beat that
      waits).

    Behind a soft reset (`SoftResetDma`, `after`: the cycle after the core's
    reset) the same lemmas hold: the reset comes only when nothing is in
    flight, and a read response to a request taken in the reset's cycle is
    not the row reader's."""
    from mxu.hdl.dma import DmaDir, dma_descriptor_layout
    c = dut.config
    LG, MAXO, MAXB = (c.axi_data_bytes - 1).bit_length(), c.dma_max_outstanding, \
        c.dma_max_burst_beats
    path = ("dma",) if isinstance(dut, SoftResetDma) else ()
    top = inner(dut, *path)
    state = top["fsm_state"]
    d = dma_descriptor_layout(c)(top["d"])
    coalesced = top["derived"][0]           # (`derived`'s first member)
    run = fsm_state(state, "RUN")
    complete = fsm_state(state, "COMPLETE")
    idle = fsm_state(state, "IDLE")
    bg = inner(dut, *path, "bursts")
    rr = inner(dut, *path, "row_reader")
    gb = inner(dut, *path, "gearbox")
    awq, wlq, rdq = dut.aw_queue, dut.len_queue, dut.row_reader.queue
    inflight = dut.bursts.inflight

    def lemma(name, test):
        prop(m, DUT, f"dma.inv.{name}", test, cover=False)

    lemma("open", (open_ == 1) == ~idle)
    lemma("store", idle | (d.dir == DmaDir.STORE))
    lemma("store_run", top["store_run"] == run)
    lemma("no_loads", ~dut.contexts.rx0.valid & ~dut.contexts.rx1.valid & ~top["ar_valid"])
    lemma("quiet_outside_run", (run | complete)
          | ((inflight == 0) & ~dut.bursts.active & (rdq.level == 0) & ~rr["rd_pending"]
             & (gb["gb_n"] == 0) & ~gb["gb_flush"]))
    lemma("idle_after_complete", ~complete | (inflight == 0))
    for name, q in (("aw_queue", awq), ("len_queue", wlq), ("row_queue", rdq)):
        lemma(f"{name}.pointers", q.lemma())
    lemma("inflight", (inflight <= MAXO) & (inflight == awq.level + axi.aw_count)
          & (inflight == wlq.level + axi.w_bursts))
    A = c.axi_addr_bits
    for i in range(MAXO):
        entry = awq.entry(i)
        lemma(f"aw_queue.legal{i}", (i >= awq.level) | (
            (entry[A:] < MAXB) & _burst_in_page(entry[:A], entry[A:], LG)))
        lemma(f"len_queue.legal{i}", (i >= wlq.level) | (wlq.entry(i) < MAXB))
    aw_n, w_n = axi.aw_count, axi.w_bursts
    for i in range(MAXO):
        lemma(f"lens.aw_leads{i}", (aw_n <= w_n) | (i >= aw_n - w_n)
              | (axi.lens[i] == wlq.entry(i)))
        lemma(f"lens.w_leads{i}", (w_n <= aw_n) | (i >= w_n - aw_n)
              | (axi.lens[i] == awq.entry(i)[A:]))
        lemma(f"queues.aw_leads{i}", (aw_n < w_n) | (i >= awq.level)
              | (wlq.entry(aw_n - w_n + i) == awq.entry(i)[A:]))
        lemma(f"queues.w_leads{i}", (w_n <= aw_n) | (i >= wlq.level)
              | (awq.entry(w_n - aw_n + i)[A:] == wlq.entry(i)))
    w_beat = gb["w_beat"]
    lemma("w_beat", (w_beat == axi.w_beat)
          & Mux(wlq.level == 0, w_beat == 0, w_beat <= wlq.entry(0)))
    lemma("next_burst", ~dut.bursts.active
          | ((bg["beats"] != 0) & (bg["x"][:LG] == 0) & (bg["seg_len"] != 0)))
    _row_lemmas(lemma, dut, d, coalesced, rr, gb, past, after)


def _units_of(c, d):
    """The units of descriptor `d` (`Dma._take_units`): its rows, or a
    quantized load's tile-blocks."""
    from mxu.hdl.dma import DmaDir
    from mxu.hdl.quant import QUANT_INFO, QuantFormat
    n = d.rows
    for name in c.quant_formats:
        f = QuantFormat[name]
        n = Mux((d.dir == DmaDir.LOAD) & (d.format == f),
                d.rows >> (QUANT_INFO[f].block - 1).bit_length(), n)
    return n


def _row_lemmas(lemma, dut, d, coalesced, rr, gb, past, after):
    """A store's rows (`_store_lemmas`): the rows read and not yet taken by
    the gearbox, the queue's and then the one whose response arrives next
    cycle, are the rows just before ``rd_r``, marked first and last as
    their index says; a gearbox holding part of a beat without a flush has
    taken a row of a contiguous store."""
    from mxu.hdl.dma import _row_meta_layout
    rdq = dut.row_reader.queue
    rd_r, pending = rr["rd_r"], rr["rd_pending"]
    meta = _row_meta_layout(dut.config)
    lemma("row_queue.room", (rdq.level + pending <= rdq.depth)
          & (rdq.level + pending <= rd_r))
    fired = past(dut.vmem_read.req.valid & dut.vmem_read.req.ready
                 | dut.acc_read.req.valid & dut.acc_read.req.ready, "rd_fire")
    lemma("row_reader.pending", pending == (fired if after is None else fired & ~after))
    taken = rd_r - pending - rdq.level       # rows the gearbox has taken
    for i in range(rdq.depth):
        row = meta(rdq.entry(i))            # (the marks: the rows are in a memory)
        lemma(f"row_queue{i}.marks", (i >= rdq.level)
              | ((row.first == (~coalesced | (taken + i == 0)))
                 & (row.last == (~coalesced | (taken + i + 1 == d.rows)))))
    row = meta(rr["rd_meta"])
    lemma("row_reader.marks", ~pending | ((row.first == (~coalesced | (rd_r == 1)))
                                          & (row.last == (~coalesced | (rd_r == d.rows)))))
    lemma("gearbox.part", (gb["gb_n"] == 0) | gb["gb_flush"] | (coalesced & (taken != 0)))


def _soft_reset_checks(m, dut, axi, load):
    """The soft reset of a `SoftResetDma` keeps the bus rules: at the reset
    no burst is in flight (the AXI checker's ghost counts are zero) and no
    VALID is up, so that nothing on the bus notices it; covered by a reset
    whose request came while a burst was in flight."""
    bus = dut.axi
    if load:
        busy = (axi.ar_count != 0) | bus.arvalid
        clean = (axi.ar_count == 0) & (axi.r_beat == 0) & ~bus.arvalid
    else:
        busy = (axi.aw_count != 0) | (axi.w_bursts != 0) | (axi.w_beat != 0) | bus.awvalid \
            | bus.wvalid
        clean = ((axi.aw_count == 0) & (axi.w_bursts == 0) & (axi.w_beat == 0)
                 & ~bus.awvalid & ~bus.wvalid)
    mid = Signal(name="soft_reset_mid_burst")      # a request came while a burst was out
    with m.If(dut.soft_request & busy):
        m.d.sync += mid.eq(1)
    with m.If(dut.core_reset):
        m.d.sync += mid.eq(0)
    prop(m, DUT, "dma.soft_reset.drained", clean, when=dut.core_reset,
         witness=dut.core_reset & mid)


def quant_config(config):
    """`config` with the weight expander (quantized loads, docs/memory.md):
    the fewest columns (a power of two, at least `config`'s) whose
    tile-blocks are whole beats of its bus, the two formats of the shortest
    block (two code widths, so that two loads in flight differ in their
    beats), and VMEM rows for two of those blocks."""
    from mxu.hdl.quant import QUANT_INFO, QuantFormat
    cols = config.cols
    while not config.replace(cols=cols, quant_formats=None).quant_formats:
        cols *= 2
    wide = config.replace(cols=cols, quant_formats=None)
    infos = {name: QUANT_INFO[QuantFormat[name]] for name in wide.quant_formats}
    block = min(i.block for i in infos.values())
    formats = tuple(name for name, i in infos.items() if i.block == block)[:2]
    vmem = max(wide.vmem_bytes, 2 * block * wide.vmem_row_bytes)
    return wide.replace(quant_formats=formats, vmem_bytes=vmem)


def _cut_expander(soft_reset):
    """The expander's arithmetic cut out (its submodules' outputs are free
    values): a quantized load's handshakes, beat and row counts stay."""
    where = "top.dut.dma.expander" if soft_reset else "top.dut.expander"
    return (f"cutpoint {where}.*",) + CUT_DMA


# ---- the proofs ---------------------------------------------------------------------

# The descriptor's (rows - 1) * stride (the wide product, which only the
# external-range check reads) is cut out: any value, so more descriptors pass
# that check, and the AXI rules must hold for them too (docs/formal.md).
CUT_DMA = ("flatten", "cutpoint t:$mul r:B_WIDTH>=16 %i", "opt_clean")

# The banks' contents are cut out (a read returns any row): the arbitration
# does not depend on them, and a 1 MiB VMEM would be a 16 Mbit array for the solver.
CUT_MEMORY = ("flatten", "cutpoint t:$mem_v2", "opt_clean")


# Induction lengths (each proof succeeds at a k no longer than this).
LOOP_K = 3
FETCH_K = 4
ARRAY_K = 2
DMA_K = 3
VECTOR_K = 2
COMPUTE_K = 2


def _bounded(name, design, depth, why, script=()):
    """A bounded proof at `depth` (a `Depth`: its formula goes into `why`)."""
    return Proof(name, design, mode="bmc", depth=depth.cycles, cover_depth=depth.cycles,
                 script=script, why=f"bounded: {why}: {depth.formula}")


def proofs_for(config, *, depth=None):
    """The `Proof` list for a chip configuration: every unit's harnesses with
    their depths (`mxu.verif.formal.depths`; `depth` overrides every one: the
    induction length or the bound)."""
    from mxu.hdl.dma import DmaDir
    from . import depths
    c = config
    vpu = c if c.vpu else c.replace(vpu=True)
    load, store = depths.dma_depth(c, True), depths.dma_depth(c, False)
    quant = quant_config(c)
    array = _two_beat_tiles(c)
    proofs = [
        # (k-induction; the covers are searched to the longest burst through
        # the pipeline and three descriptors open: `dma_depth`.)
        Proof("dma.load", lambda: dma_harness(c, DmaDir.LOAD), depth=DMA_K,
              cover_depth=load.cycles, script=CUT_DMA,
              why="k-induction; lemmas: the receive contexts' bursts, the in-flight count "
                  "and the AR register against the AXI checker's counts, the open "
                  "descriptors against the contexts and the state"),
        # (k-induction; the covers are searched to the longest burst through
        # the pipeline: `dma_depth`.)
        Proof("dma.store", lambda: dma_harness(c, DmaDir.STORE), depth=DMA_K,
              cover_depth=store.cycles, script=CUT_DMA,
              why="k-induction; lemmas: the queues and the gearbox against the AXI checker's "
                  "counts and lengths, the row reader's rows and marks"),
        Proof("dma.soft_reset_load", lambda: dma_harness(c, DmaDir.LOAD, soft_reset=True),
              depth=DMA_K, cover_depth=depths.soft_reset_depth(c, True).cycles,
              script=CUT_DMA, why="k-induction; the load's lemmas, across the reset"),
        # (Quantized loads, on the fewest columns whose tile-blocks are whole
        # beats: `quant_config`; the covers are searched to the first rows out
        # of the expander and a stall: `quant_load_depth`.)
        Proof("dma.load_quant", lambda: dma_harness(quant, DmaDir.LOAD), depth=DMA_K,
              cover_depth=depths.quant_load_depth(quant).cycles, script=_cut_expander(False),
              why="k-induction; the load's lemmas, and rx[0]'s rows written against its "
                  "rows (the expander's arithmetic cut out)"),
        Proof("dma.soft_reset_load_quant",
              lambda: dma_harness(quant, DmaDir.LOAD, soft_reset=True), depth=DMA_K,
              cover_depth=depths.quant_load_depth(quant).cycles, script=_cut_expander(True),
              why="k-induction; the quantized load's lemmas, across the reset"),
        Proof("dma.soft_reset_store", lambda: dma_harness(c, DmaDir.STORE, soft_reset=True),
              depth=DMA_K, cover_depth=depths.soft_reset_depth(c, False).cycles,
              script=CUT_DMA, why="k-induction; the store's lemmas, across the reset"),
        Proof("regs.host", lambda: regs_harness(c), depth=4, cover_depth=8,
              why="k-induction; the register file answers one request at a time"),
        Proof("streams.slice", lambda: slice_harness(), depth=4, cover_depth=8,
              why="k-induction"),
        Proof("streams.transfer", lambda: transfer_harness(c), depth=4, cover_depth=8,
              why="k-induction"),
        # (k-induction; the covers are searched as deep as a start, the AR, a
        # whole burst through the gearbox and the queue and a stall: `fetch_depth`.)
        Proof("streams.fetch", lambda: fetch_harness(c), depth=FETCH_K,
              cover_depth=depths.fetch_depth(c).cycles,
              why="k-induction; lemmas: the AR register holds a legal burst, the next "
                  "address is beat-aligned"),
        # (k-induction; the covers are searched as deep as a LOOP, its body of
        # two pairs stored, two iterations issued and a stall: `loop_depth`.)
        Proof("streams.loop", lambda: loop_harness(c), depth=LOOP_K,
              cover_depth=depths.loop_depth(c).cycles,
              why="k-induction; the output stage's hold rules need no lemma"),
        Proof("streams.vmem", lambda: memory_harness(vpu, "vmem"), depth=2, cover_depth=4,
              script=CUT_MEMORY, why="k-induction; the arbitration is combinational"),
        Proof("streams.accmem", lambda: memory_harness(vpu, "accmem"), depth=2, cover_depth=4,
              script=CUT_MEMORY, why="k-induction; the arbitration is combinational"),
        _array_proof(f"array.weights_s{c.mac_stages}" + _wide(c.weight_rows_per_cycle),
                     c.rows, c.cols, c.mac_stages, c.weight_rows_per_cycle, ARRAY_WHY),
        Proof("controller.tokens", lambda: controller_harness(vpu), depth=6, cover_depth=12,
              why="k-induction; the ghost counters equal the controller's (an invariant)"),
        # (k-induction; the covers are searched as deep as a VECTOR through
        # the intake, its reads, the stand-in ALU and the write, and a stall.)
        Proof("streams.vector", lambda: vector_harness(vpu), depth=VECTOR_K,
              cover_depth=depths.vector_depth(FREE_ALU_LATENCY, vpu.vpu_stages > 1).cycles,
              why="k-induction; lemmas: the VECTORs in flight against the rows marked last "
                  "in the pipeline, a transposed instruction's rows within its block"),
        # (k-induction; the covers are searched to the array formula on its
        # array.)
        Proof("streams.compute", lambda: compute_harness(array), depth=COMPUTE_K,
              cover_depth=depths.array_depth(array.rows, array.cols, array.mac_stages,
                                             array.weight_rows_per_cycle).cycles,
              script=CUT_COMPUTE,
              why="k-induction; lemmas: the MATMULs open against the command queue and the "
                  "rows marked last, the pending rows against the array's valid registers"),
    ]
    if c.weight_rows_per_cycle > 1:
        proofs.insert(-1, _array_proof(f"array.weights_s{c.mac_stages}", c.rows, c.cols,
                                       c.mac_stages, 1,
                                       ARRAY_WHY + "; the narrow port of one row a beat"))
    if c.mac_stages < 3:
        proofs.insert(-1, _array_proof("array.weights_s3", c.rows, c.cols, 3, 1,
                                       ARRAY_WHY + "; mac_stages >= 3 stagger the weights"))
    if depth is not None:
        from dataclasses import replace
        proofs = [replace(p, depth=depth) for p in proofs]
    return proofs


def _array_proof(name, rows, cols, stages, weight_rows, why):
    """An `array_harness` proof: k-induction where the lemmas of
    `_weight_lemmas` and `_valid_lemmas` apply (one weight row a beat, two
    rows, two MAC stages: `_RowFreeWeights`), else bounded; the covers are
    searched to `depths.array_depth` either way."""
    from . import depths
    depth = depths.array_depth(rows, cols, stages, weight_rows)

    def design():
        return array_harness(rows, cols, stages, weight_rows)
    if weight_rows == 1 and stages == 2 and rows == 2:
        return Proof(name, design, depth=ARRAY_K, cover_depth=depth.cycles, script=CUT_MAC,
                     why="k-induction; lemmas: the weight path's shadow bits, pending rows, "
                         "markers and queue, the valid registers against a ghost delay line")
    if weight_rows > 1 or stages >= 3:
        return Proof(name, design, depth=ARRAY_K + (rows - 1) * stages, cover_depth=depth.cycles,
                     script=CUT_MAC,
                     why="k-induction; lemmas: each row's shadow bit against the queue's beat "
                         "and row 0's through the loads and switches on their way, the valid "
                         "registers against a ghost delay line")
    return _bounded(name, design, depth, why, CUT_MAC)


def _two_beat_tiles(config):
    """`config`, with one row more when its tile is a single weight beat: the
    compute engine stages one tile at most, so the array's weight queue (two
    beats at least) fills, and its stall rules are reached, only when a tile
    is two beats or more."""
    if config.rows <= config.weight_rows_per_cycle:
        return config.replace(rows=config.weight_rows_per_cycle + 1)
    return config


def _wide(weight_rows):
    """A proof name's suffix for a weight port of more than one row a beat."""
    return f"_w{weight_rows}" if weight_rows > 1 else ""


ARRAY_WHY = ("two tiles loaded back to back (the weight queue full), the second switching "
             "in and its wave reaching the last PE, a stall")

UNITS = ("dma", "regs", "streams", "array", "controller")
