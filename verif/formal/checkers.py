"""Protocol checkers: Amaranth components made of `Assert`, `Assume` and `Cover`
that attach to an interface (docs/formal.md).

A checker observes every member of its interface as an input (``tap``), and
is told which side of the interface is the design under proof (``dut``): the
rules that side must keep are asserted, the rules of the other side (the
environment) are assumed, so that one checker serves every port of its kind
and the proof of a component is assume-guarantee: its outputs keep the rules
as long as its inputs do. Every assert comes with a cover of the situation it
is about (a stall that ends in a transfer, a full burst, ...), so that a proof
cannot pass because the situation never arises.

Property names are the ``message`` of each `Assert`/`Assume`/`Cover`
(``"aw.valid_held"``); `mxu.verif.formal.sby` names the proved cells after
them, so that results, tables and traces carry these names.

Reset: "after reset" is the first cycle of the proof and the cycle after
``rst`` was high (the checkers' own registers are in the same ``sync``
domain as the design, so a reset clears both).
"""

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In

from mxu.hdl.axi import AXI4LiteSignature, AXI4Signature, AxiBurst

__all__ = ["tap_signature", "attach", "Past", "prop", "StreamChecker", "AXI4ManagerChecker",
           "AXI4LiteSubordinateChecker", "DUT", "ENV"]

DUT = "dut"     # the side whose rules are asserted
ENV = "env"     # the side whose rules are assumed


def tap_signature(signature):
    """The members of `signature` (recursively), each as an ``In`` of its shape:
    what a checker that observes the interface takes."""
    members = {}
    for name, member in signature.members.items():
        if member.is_port:
            members[name] = In(member.shape)
        else:
            members[name] = In(tap_signature(member.signature))
    return wiring.Signature(members)


def attach(m, tap, interface):
    """Drive every member of the checker port `tap` from `interface` (the same
    member names); constant members (``always_ready``) are driven too."""
    for name in tap.signature.members:
        source = getattr(interface, name)
        target = getattr(tap, name)
        if isinstance(source, (Value, int)) or hasattr(source, "as_value"):
            m.d.comb += target.eq(source)
        else:
            attach(m, target, source)


def _role(side, name):
    if side not in (DUT, ENV):
        raise ValueError(f"{name} must be {DUT!r} or {ENV!r}, not {side!r}")
    return side


class Past:
    """Registers of a checker: ``past(value)`` is `value` one cycle ago, and
    ``after_reset`` is high in the first cycle and in the cycle after a reset
    (where there is no past)."""

    def __init__(self, m, prefix):
        self.m = m
        self.prefix = prefix
        self.started = Signal(name=f"{prefix}_started")
        m.d.sync += self.started.eq(1)
        self.after_reset = ~self.started
        self._count = 0

    def __call__(self, value, name=None, *, reset_less=False):
        value = Value.cast(value)
        self._count += 1
        reg = Signal(len(value), name=f"{self.prefix}_past_{name or self._count}",
                     reset_less=reset_less)
        self.m.d.sync += reg.eq(value)
        return reg


def prop(m, side, name, test, *, when=1, witness=None, cover=True):
    """The rule `test`, checked in cycles where `when` holds: asserted if `side`
    is the design, assumed if it is the environment. An asserted rule gets a
    cover of the same name: `witness`, by default `when` (the situation the
    rule is about), so that a proof which passes because the situation never
    arises shows up as an unreached cover. Induction invariants (lemmas about
    a design's inside, which hold in every cycle) take ``cover=False``."""
    with m.If(when):
        m.d.comb += (Assert if side == DUT else Assume)(test, name)
    if side == DUT and cover:
        m.d.comb += Cover(when if witness is None else witness, name)


class _Channel:
    """One VALID/READY channel seen by a checker: its handshake, hold and
    stability rules (AXI A3.2.1, Amaranth stream RFC 61).

    ``exempt``: in a cycle where it is high the source may withdraw (a
    documented flush): the hold rules do not apply."""

    def __init__(self, m, past, name, valid, ready, payload, source, *, exempt=None):
        self.name, self.valid, self.ready = name, valid, ready
        self.fire = valid & ready
        stalled = past(valid & ~ready, f"{name}_stalled") & ~past.after_reset
        if exempt is not None:
            stalled &= ~exempt
        held = past(payload, f"{name}_payload")
        self.stalled = stalled
        # Not vacuous: a stall happens and ends in a transfer.
        witness = stalled & self.fire
        prop(m, source, f"{name}.valid_held", valid, when=stalled, witness=witness)
        prop(m, source, f"{name}.payload_stable", Value.cast(payload) == held, when=stalled,
             witness=witness)


def _low_after_reset(m, past, side, name, valid):
    """VALID low in the first cycle and after a reset; the cover is a reset
    that came while VALID was high."""
    was_valid = past(valid, f"{name}_valid_rl", reset_less=True)
    prop(m, side, f"{name}.valid_low_after_reset", ~valid, when=past.after_reset,
         witness=past.after_reset & was_valid)


class StreamChecker(wiring.Component):
    """The rules of an Amaranth ``stream.Signature`` (RFC 61): once ``valid`` is
    high it stays high until ``ready``, and ``payload`` does not change while a
    transfer waits; an ``always_ready`` stream is ready in every cycle.

    Parameters
    ----------
    signature : stream.Signature
        The stream observed (its payload shape and ``always_ready``).
    source, sink : DUT or ENV
        Which side is the design under proof. The source's rules are asserted
        when it is the DUT, assumed otherwise; likewise ``always_ready`` for the
        sink.
    name : str
        Prefix of the property names (``"<name>.valid_held"``).
    exempt : Value or None
        In a cycle where it is high the source may withdraw (a documented
        flush, e.g. the controller dropping its queues after an error): the
        hold rules do not apply.

    Interface: ``tap``: `tap_signature` of `signature`.

    Properties: ``valid_held`` and ``payload_stable`` (covered by a stall that
    ends in a transfer); on an ``always_ready`` stream, which never stalls,
    ``ready`` instead (covered by a transfer).
    """

    def __init__(self, signature, *, source, sink, name, exempt=None):
        if not isinstance(signature, stream.Signature):
            raise TypeError(f"StreamChecker needs a stream.Signature, not {signature!r}")
        self.stream_signature = signature
        self.source = _role(source, "source")
        self.sink = _role(sink, "sink")
        self.name = name
        self.exempt = exempt
        super().__init__({"tap": In(tap_signature(signature))})

    def elaborate(self, platform):
        m = Module()
        t = self.tap
        past = Past(m, self.name.replace(".", "_"))
        if self.stream_signature.always_ready:
            # Never stalled, so the hold rules hold trivially: only readiness.
            prop(m, self.sink, f"{self.name}.ready", t.ready, witness=t.valid & t.ready)
        else:
            _Channel(m, past, self.name, t.valid, t.ready, t.payload, self.source,
                     exempt=self.exempt)
        return m


def _burst_in_page(addr, length, size):
    """An INCR burst of ``length + 1`` beats of ``2**size`` bytes from `addr`
    stays inside one 4 KiB page (AXI A3.4.1)."""
    ok = Const(0)
    for s in reversed(range(8)):
        start = addr[:12] & ~((1 << s) - 1)
        ok = Mux(size == s, start + ((length + 1) << s) <= 4096, ok)
    return ok


class AXI4ManagerChecker(wiring.Component):
    """The AXI4 rules (AMBA AXI and ACE, issue H) on a manager port whose
    transactions use one ID (responses in order), such as the DMA and the
    instruction fetch.

    Asserted of the manager (when it is the DUT):

    * after reset AWVALID, WVALID and ARVALID are low;
    * AW, W and AR: VALID held until READY, the payload stable meanwhile;
    * AxBURST is INCR, AxSIZE is the bus width, AxLEN + 1 <= ``max_burst``,
      the manager's ID, and no burst crosses a 4 KiB boundary;
    * W beats follow the AW order and lengths: WLAST exactly on beat
      AWLEN + 1 of its burst (W may run ahead of AW);
    * at most ``max_outstanding`` bursts outstanding per direction (from the
      AW handshake, or the last W beat if it comes first, to the B; from the
      AR handshake to the last R).

    Assumed of the subordinate (asserted when it is the DUT):

    * after reset BVALID and RVALID are low; B and R: VALID held until READY,
      the payload stable meanwhile;
    * no B before both its AW and its last W beat, no R beat without an
      outstanding AR; RLAST exactly on beat ARLEN + 1; BID/RID the manager's ID.

    Parameters
    ----------
    signature : AXI4Signature
    manager : DUT or ENV
        Which side is proved; the other side's rules are assumed.
    max_outstanding : int
        The bound on bursts in flight per direction.
    max_burst : int
        Longest burst, in beats (a power of two, 1..256).
    reads, writes : bool
        Check the read (AR, R) and write (AW, W, B) channels.
    manager_id : int
        The ID the manager uses on both directions.
    name : str
        Prefix of the property names.

    Interface: ``tap``: `tap_signature` of `signature`.

    Ghost state, for the induction invariants a harness states about the
    design: ``aw_count`` and ``w_bursts`` (AW handshakes and completed W
    bursts not yet answered by a B), ``lens`` (oldest first, the lengths of
    the bursts one of whose halves is done and the other not: AW lengths while
    AW leads, W burst lengths while W leads), ``w_beat`` (beats of the W burst
    in progress), ``ar_count``, ``rlens`` and ``r_beat`` for reads.
    """

    def __init__(self, signature, *, manager, max_outstanding, max_burst, reads=True,
                 writes=True, manager_id=0, name="axi"):
        if not isinstance(signature, AXI4Signature):
            raise TypeError(f"AXI4ManagerChecker needs an AXI4Signature, not {signature!r}")
        if not isinstance(max_outstanding, int) or not 1 <= max_outstanding <= 64:
            raise ValueError(f"max_outstanding must be an integer from 1 to 64, "
                             f"not {max_outstanding!r}")
        if max_burst not in [1 << i for i in range(9)]:
            raise ValueError(f"max_burst must be a power of two from 1 to 256, not {max_burst!r}")
        self.axi_signature = signature
        self.manager = _role(manager, "manager")
        self.subordinate = ENV if self.manager == DUT else DUT
        self.max_outstanding = max_outstanding
        self.max_burst = max_burst
        self.reads, self.writes = reads, writes
        self.manager_id = manager_id
        self.name = name
        self.size = (signature.data_width // 8 - 1).bit_length()
        n = max_outstanding
        self.aw_count = Signal(range(n + 2), name=f"{name}_aw_count")
        self.w_bursts = Signal(range(n + 2), name=f"{name}_w_bursts")
        self.w_beat = Signal(9, name=f"{name}_w_beat")
        self.lens = [Signal(8, name=f"{name}_len{i}") for i in range(n)]
        self.ar_count = Signal(range(n + 2), name=f"{name}_ar_count")
        self.r_beat = Signal(9, name=f"{name}_r_beat")
        self.rlens = [Signal(8, name=f"{name}_rlen{i}") for i in range(n)]
        super().__init__({"tap": In(tap_signature(signature))})

    def elaborate(self, platform):
        m = Module()
        t = self.tap
        nm = self.name
        past = Past(m, nm)
        man, sub = self.manager, self.subordinate
        if self.writes:
            aw = self._address(m, past, "aw")
            w = _Channel(m, past, f"{nm}.w", t.wvalid, t.wready, Cat(t.wdata, t.wstrb, t.wlast),
                         man)
            _low_after_reset(m, past, man, f"{nm}.w", t.wvalid)
            b = _Channel(m, past, f"{nm}.b", t.bvalid, t.bready, Cat(t.bid, t.bresp), sub)
            _low_after_reset(m, past, sub, f"{nm}.b", t.bvalid)
            self._write_order(m, aw, w, b)
        if self.reads:
            ar = self._address(m, past, "ar")
            r = _Channel(m, past, f"{nm}.r", t.rvalid, t.rready,
                         Cat(t.rid, t.rdata, t.rresp, t.rlast), sub)
            _low_after_reset(m, past, sub, f"{nm}.r", t.rvalid)
            self._read_order(m, ar, r)
        return m

    def _address(self, m, past, ch):
        """An AW or AR channel: handshake rules and a legal burst."""
        t, nm, man = self.tap, self.name, self.manager
        valid, addr = getattr(t, f"{ch}valid"), getattr(t, f"{ch}addr")
        length, size = getattr(t, f"{ch}len"), getattr(t, f"{ch}size")
        burst, ident = getattr(t, f"{ch}burst"), getattr(t, f"{ch}id")
        payload = Cat(addr, length, size, burst, ident, getattr(t, f"{ch}lock"),
                      getattr(t, f"{ch}cache"), getattr(t, f"{ch}prot"))
        channel = _Channel(m, past, f"{nm}.{ch}", valid, getattr(t, f"{ch}ready"), payload, man)
        _low_after_reset(m, past, man, f"{nm}.{ch}", valid)
        longest = valid & (length == self.max_burst - 1)
        prop(m, man, f"{nm}.{ch}.burst_incr", burst == AxiBurst.INCR, when=valid)
        prop(m, man, f"{nm}.{ch}.size_full", size == self.size, when=valid)
        prop(m, man, f"{nm}.{ch}.len_max", length < self.max_burst, when=valid, witness=longest)
        # The cover: a burst that ends exactly at a 4 KiB boundary.
        at_edge = valid & (addr[:12] + ((length + 1) << self.size) == 4096)
        prop(m, man, f"{nm}.{ch}.no_4k_cross", _burst_in_page(addr, length, size), when=valid,
             witness=at_edge)
        prop(m, man, f"{nm}.{ch}.id", ident == self.manager_id, when=valid)
        return channel

    def _write_order(self, m, aw, w, b):
        """W bursts against AW lengths, in order; B against both."""
        t, nm, man, sub = self.tap, self.name, self.manager, self.subordinate
        n = self.max_outstanding
        aw_count, w_bursts, w_beat, lens = self.aw_count, self.w_bursts, self.w_beat, self.lens
        aw_leads = aw_count > w_bursts
        w_leads = w_bursts > aw_count
        depth = Signal(range(n + 2), name=f"{nm}_lens_depth")
        m.d.comb += depth.eq(Mux(aw_leads, aw_count - w_bursts, w_bursts - aw_count))
        w_done = w.fire & t.wlast

        # The W burst in progress belongs to the oldest AW not yet matched by
        # a W burst: queued if AW leads, the AW of this cycle if none leads.
        known = aw_leads | (aw.fire & ~w_leads)
        want = Mux(aw_leads, lens[0], t.awlen)
        full = t.wvalid & known & (want == self.max_burst - 1) & t.wlast
        prop(m, man, f"{nm}.w.last_on_awlen", t.wlast == (w_beat == want),
             when=t.wvalid & known, witness=full)
        # W ahead of its AW: no longer than the longest legal burst.
        prop(m, man, f"{nm}.w.last_within_max", t.wlast | (w_beat < self.max_burst - 1),
             when=t.wvalid & ~known, witness=t.wvalid & ~known & t.wlast)
        # An AW that comes after its W burst has that burst's length.
        prop(m, man, f"{nm}.aw.len_matches_w", t.awlen == lens[0], when=aw.fire & w_leads)
        with m.If(w.fire):
            m.d.sync += w_beat.eq(Mux(t.wlast, 0, w_beat + 1))

        prop(m, man, f"{nm}.write.outstanding_max", (aw_count <= n) & (w_bursts <= n),
             witness=(aw_count == n) & (w_bursts == n))
        prop(m, sub, f"{nm}.b.after_aw_and_w", (aw_count != 0) & (w_bursts != 0), when=t.bvalid,
             witness=b.fire)
        prop(m, sub, f"{nm}.b.id", t.bid == self.manager_id, when=t.bvalid)
        m.d.sync += [aw_count.eq(aw_count + aw.fire - b.fire),
                     w_bursts.eq(w_bursts + w_done - b.fire)]

        # The length queue: the leading half pushes, the other half pops. An AW
        # and the end of its own W burst in one cycle leave it as it is.
        aw_push = aw.fire & ~w_leads & ~(w_done & ~aw_leads)
        w_push = w_done & ~aw_leads & ~(aw.fire & ~w_leads)
        pop = (aw.fire & w_leads) | (w_done & aw_leads)
        value = Mux(aw_push, t.awlen, w_beat)
        slot = Mux(pop, depth - 1, depth)
        for i in range(n):
            with m.If((aw_push | w_push) & (slot == i)):
                m.d.sync += lens[i].eq(value)
            with m.Elif(pop):
                m.d.sync += lens[i].eq(lens[i + 1] if i + 1 < n else 0)

    def _read_order(self, m, ar, r):
        """R beats against AR lengths, in order."""
        t, nm, man, sub = self.tap, self.name, self.manager, self.subordinate
        n = self.max_outstanding
        ar_count, r_beat, rlens = self.ar_count, self.r_beat, self.rlens
        r_done = r.fire & t.rlast
        prop(m, sub, f"{nm}.r.after_ar", ar_count != 0, when=t.rvalid, witness=r.fire)
        prop(m, sub, f"{nm}.r.last_on_arlen", t.rlast == (r_beat == rlens[0]), when=t.rvalid,
             witness=r_done & (r_beat == self.max_burst - 1))
        prop(m, sub, f"{nm}.r.id", t.rid == self.manager_id, when=t.rvalid)
        prop(m, man, f"{nm}.read.outstanding_max", ar_count <= n, witness=ar_count == n)
        with m.If(r.fire):
            m.d.sync += r_beat.eq(Mux(t.rlast, 0, r_beat + 1))
        m.d.sync += ar_count.eq(ar_count + ar.fire - r_done)
        slot = Mux(r_done, ar_count - 1, ar_count)
        for i in range(n):
            with m.If(ar.fire & (slot == i)):
                m.d.sync += rlens[i].eq(t.arlen)
            with m.Elif(r_done):
                m.d.sync += rlens[i].eq(rlens[i + 1] if i + 1 < n else 0)


class AXI4LiteSubordinateChecker(wiring.Component):
    """The AXI4-Lite rules on a subordinate port (the register file).

    Assumed of the manager: VALIDs low after reset, AW, W and AR held until
    READY with a stable payload. Asserted of the subordinate:

    * after reset BVALID and RVALID are low; B and R held until READY with a
      stable payload;
    * one response per request: a B only for an AW and a W both taken and not
      yet answered, an R only for an AR not yet answered; at most
      ``max_outstanding`` requests of each kind taken and not answered.

    The response codes depend on the register map: the harness of the design
    states them (`mxu.verif.formal.units`).

    Parameters
    ----------
    signature : AXI4LiteSignature
    max_outstanding : int
    name : str

    Ghost state: ``aw_out``, ``w_out``, ``ar_out`` (requests taken and not
    answered).
    """

    def __init__(self, signature, *, max_outstanding=1, name="axil"):
        if not isinstance(signature, AXI4LiteSignature):
            raise TypeError(f"AXI4LiteSubordinateChecker needs an AXI4LiteSignature, "
                            f"not {signature!r}")
        self.lite_signature = signature
        self.max_outstanding = max_outstanding
        self.name = name
        n = max_outstanding
        self.aw_out = Signal(range(n + 2), name=f"{name}_aw_out")
        self.w_out = Signal(range(n + 2), name=f"{name}_w_out")
        self.ar_out = Signal(range(n + 2), name=f"{name}_ar_out")
        super().__init__({"tap": In(tap_signature(signature))})

    def elaborate(self, platform):
        m = Module()
        t = self.tap
        nm = self.name
        n = self.max_outstanding
        past = Past(m, nm)
        aw = _Channel(m, past, f"{nm}.aw", t.awvalid, t.awready, Cat(t.awaddr, t.awprot), ENV)
        w = _Channel(m, past, f"{nm}.w", t.wvalid, t.wready, Cat(t.wdata, t.wstrb), ENV)
        ar = _Channel(m, past, f"{nm}.ar", t.arvalid, t.arready, Cat(t.araddr, t.arprot), ENV)
        b = _Channel(m, past, f"{nm}.b", t.bvalid, t.bready, t.bresp, DUT)
        r = _Channel(m, past, f"{nm}.r", t.rvalid, t.rready, Cat(t.rdata, t.rresp), DUT)
        for ch in ("aw", "w", "ar"):
            _low_after_reset(m, past, ENV, f"{nm}.{ch}", getattr(t, f"{ch}valid"))
        for ch in ("b", "r"):
            _low_after_reset(m, past, DUT, f"{nm}.{ch}", getattr(t, f"{ch}valid"))
        aw_out, w_out, ar_out = self.aw_out, self.w_out, self.ar_out
        m.d.sync += [aw_out.eq(aw_out + aw.fire - b.fire), w_out.eq(w_out + w.fire - b.fire),
                     ar_out.eq(ar_out + ar.fire - r.fire)]
        prop(m, DUT, f"{nm}.b.one_per_request", (aw_out != 0) & (w_out != 0), when=t.bvalid,
             witness=b.fire)
        prop(m, DUT, f"{nm}.r.one_per_request", ar_out != 0, when=t.rvalid, witness=r.fire)
        prop(m, DUT, f"{nm}.write.outstanding_max", (aw_out <= n) & (w_out <= n),
             witness=(aw_out == n) & (w_out == n))
        prop(m, DUT, f"{nm}.read.outstanding_max", ar_out <= n, witness=ar_out == n)
        return m
