"""The weight-stationary systolic array: ``rows x cols`` PEs, fp32 partial sums,
bf16 operands, back-to-back weight tiles with no bubble.

See docs/array.md for the interface contract, the timing in words, the latency
formula and the weight-switch protocol; docs/numerics.md and docs/architecture.md for the numerics
and the microarchitecture this implements.

Data flow (r = PE row = reduction index k, c = PE column = output column j)::

    seed[j] --(skew c)--> PE[0][c] --> PE[1][c] --> ... --> PE[rows-1][c] --(de-skew cols-1-c)--> result[j]
    act[k]  --(skew r*mac_stages)--> PE[r][0] --> PE[r][1] --> ... (one cycle per column)
    weights --> queue --> shadow-weight bus of column c (skew c) --> PE[k][c].shadow

so ``result[i, j] = (...((seed[i, j] + a[i, 0]*w[0, j]) + a[i, 1]*w[1, j]) + ...)``,
the sequential fp32 dot product of docs/numerics.md.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .blackbox import black_box
from .delay import chain, delayed, memory_rings
from .hooks import BuildHooks
from .mac import MAC_STAGES
from .numerics import BF16, FP32
from .pe import PE_SIGNATURE, ProcessingElement

__all__ = ["SystolicArray", "ActivationBeat", "WeightBeat", "array_latency",
           "default_weight_queue_depth", "bubble_free_rows", "datapath_signature",
           "weight_load_cycles"]


def ActivationBeat(rows):
    """Layout of one activation beat: ``data`` (`rows` bf16, element k feeds PE
    row k) and ``first`` (this row starts a new weight tile)."""
    return data.StructLayout({"data": data.ArrayLayout(BF16, rows), "first": 1})


def WeightBeat(cols, weight_rows=1):
    """Layout of one weight beat: `weight_rows` rows of `cols` bf16, row i of the
    beat in elements ``i*cols ... i*cols + cols-1`` (with one row a beat, the
    row itself). Beat b of a tile carries its rows ``b*weight_rows + i``; rows
    past the tile's last in its last beat are ignored."""
    return data.ArrayLayout(BF16, weight_rows * cols)


def weight_load_cycles(rows, weight_rows=1):
    """Weight beats of one tile, ``ceil(rows / weight_rows)``: the cycles in which
    a tile enters the array through its weight port."""
    return -(-rows // weight_rows)


def array_latency(rows, cols, mac_stages):
    """Cycles from the clock edge that accepts an activation beat to the cycle in
    which its result beat is valid: ``rows * mac_stages + cols - 1``.

    A run of N back-to-back activation beats therefore occupies
    ``N + array_latency(...)`` cycles from its first accepted beat to its last
    accepted result, both counted (docs/array.md, "cycle contract").
    """
    return rows * mac_stages + cols - 1


def default_weight_queue_depth(rows, mac_stages, weight_rows=1):
    """Depth (in weight beats) of the queue in front of the shadow registers.

    With one row a beat and ``mac_stages == 1`` the tile-switch wave moves down
    one row per cycle, as fast as weight rows arrive, and two entries suffice
    for back-to-back tiles. Otherwise a queue of one tile's beats holds the
    next tile while the current one is written, which keeps tiles of
    `bubble_free_rows` rows bubble-free (docs/array.md).
    """
    if weight_rows == 1 and mac_stages == 1:
        return 2
    return max(2, weight_load_cycles(rows, weight_rows))


def bubble_free_rows(rows, mac_stages, weight_rows=1):
    """The smallest tile height M that streams back to back with no bubble: a
    tile's weight beats, ``ceil(rows / weight_rows)``, at every depth, since the
    queue takes one beat per cycle and wide ports and ``mac_stages >= 3``
    stagger the weights (docs/array.md, section 4)."""
    _check_positive("rows", rows)
    if mac_stages not in MAC_STAGES:
        raise ValueError(f"mac_stages must be one of {MAC_STAGES}, not {mac_stages!r}")
    _check_positive("weight_rows", weight_rows)
    return weight_load_cycles(rows, weight_rows)


def datapath_signature(rows, cols, weight_rows=1):
    """The ports of the array's datapath as one module (``SystolicArray(...,
    hooks=BuildHooks(datapath_module=name))``): the PE grid with its activation skew, seed skew,
    output de-skew and weight bus.

    Its behaviour, which a replacement must keep cycle for cycle: every beat taken
    (``take``, only while ``en``) produces ``result`` = the fp32 dot product of
    docs/numerics.md, ``seed[j] + act[0]*W[0, j] + ... + act[rows-1]*W[rows-1, j]``
    (each step rounded), with ``result_valid`` set, exactly `array_latency` ``en``
    cycles later; everything holds while ``en`` is low. ``W`` is the tile of
    the last beat taken with ``first`` set: ``first`` claims the next tile
    taken on ``weight`` (``weight_take``: one `WeightBeat` of `weight_rows`
    rows, ``ceil(rows / weight_rows)`` beats a tile, row k of the tile first,
    rows past the last of a tile's last beat ignored; zeros before the first
    such beat). `rst` empties everything.
    """
    return wiring.Signature({
        "en": In(1),
        "take": In(1),
        "first": In(1),
        "act": In(data.ArrayLayout(BF16, rows)),
        "seed": In(data.ArrayLayout(FP32, cols)),
        "weight_take": In(1),
        "weight": In(WeightBeat(cols, weight_rows)),
        "result": Out(data.ArrayLayout(FP32, cols)),
        "result_valid": Out(1),
    })


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")


class SystolicArray(wiring.Component):
    """Weight-stationary ``rows x cols`` systolic array of `ProcessingElement`.

    One activation beat (row i of A: ``rows`` bf16 values, k = 0..rows-1) together
    with one seed beat (``cols`` fp32 values) produces one result beat
    ``result[j] = seed[j] + sum_k act[k] * W[k, j]``, accumulated in fp32 in the
    order k = 0, 1, ..., rows-1, each product and each sum rounded to nearest-even
    (docs/numerics.md). One beat per cycle in, one per cycle out.

    Weights: a tile W (``rows x cols``) arrives on ``weight`` as
    ``ceil(rows / weight_rows)`` beats of `weight_rows` rows, row k = 0 first. It waits in a queue and then in the PEs' shadow registers until
    an activation beat with ``first`` set is accepted; from that beat on, every
    activation beat uses W, until the next beat with ``first`` set. The next tile
    may be streamed in while the current one computes. Before the first tile the
    active weights are zero.

    Parameters
    ----------
    rows : int
        PE rows: the reduction length K of one weight tile (>= 1).
    cols : int
        PE columns: output columns N of one weight tile (>= 1).
    mac_stages : int
        Pipeline depth of each PE's multiply-add, 1 to 7.
    weight_rows : int
        Weight rows per beat of ``weight`` (>= 1; `ChipConfig.weight_rows_per_cycle`
        on the chip): a tile loads in ``ceil(rows / weight_rows)`` cycles.
    weight_queue_depth : int or None
        Weight beats the queue in front of the shadow registers holds (>= 1);
        None picks `default_weight_queue_depth`, which keeps back-to-back tiles
        of `bubble_free_rows` rows bubble-free at every depth.
    hooks : BuildHooks or None
        None (default): the PEs are elaborated as Amaranth submodules. With a
        ``pe_module``, every PE becomes an ``Instance`` of that module, which
        the caller must supply as the Verilog of
        ``ProcessingElement(mac_stages)`` (same port names): generating Verilog
        then costs one PE, not ``rows * cols``; the hardware is the same. With
        a ``datapath_module``, the PE grid with its skew registers and weight
        bus becomes one ``Instance`` of that module, with the ports and
        behaviour of `datapath_signature`; the weight queue, tile admission and
        stall logic stay as they are (simulation models,
        `mxu.sim.backends.fast_array`).

    Interface
    ---------
    act : In(stream.Signature(ActivationBeat(rows)))
        Activation rows. A beat with ``first`` set is held off (``ready`` low)
        until the next weight tile is completely staged (``weights_ready``).
    seed : In(stream.Signature(ArrayLayout(FP32, cols)))
        Partial-sum seeds, in lockstep with ``act``: a beat is taken from both
        streams in the same cycle, never from one alone.
    weight : In(stream.Signature(WeightBeat(cols, weight_rows)))
        Weight rows, `weight_rows` a beat, ``ceil(rows / weight_rows)`` beats per
        tile, k = 0 first.
    result : Out(stream.Signature(ArrayLayout(FP32, cols)))
        One fp32 row per accepted activation beat, in order. While ``valid`` is
        high and ``ready`` low the whole array stalls (global clock enable);
        a consumer that is always ready may tie ``ready`` high.
    weights_ready : Out(1)
        The next weight tile is completely staged: a beat with ``first`` set will
        be accepted. It falls in the cycle such a beat is accepted.
    busy : Out(1)
        At least one accepted activation beat has not left as a result yet.

    Attributes
    ----------
    latency : int
        `array_latency` (rows, cols, mac_stages).
    """

    def __init__(self, rows, cols, mac_stages=2, *, weight_rows=1, weight_queue_depth=None,
                 hooks=None):
        _check_positive("rows", rows)
        _check_positive("cols", cols)
        if mac_stages not in MAC_STAGES:
            raise ValueError(f"mac_stages must be one of {MAC_STAGES}, not {mac_stages!r}")
        _check_positive("weight_rows", weight_rows)
        if weight_queue_depth is None:
            weight_queue_depth = default_weight_queue_depth(rows, mac_stages, weight_rows)
        _check_positive("weight_queue_depth", weight_queue_depth)
        hooks = BuildHooks() if hooks is None else hooks
        self.pe_module = hooks.pe_module
        self.datapath_module = hooks.datapath_module
        self.rows = rows
        self.cols = cols
        self.mac_stages = mac_stages
        self.weight_rows = weight_rows
        self.weight_queue_depth = weight_queue_depth
        self.latency = array_latency(rows, cols, mac_stages)
        super().__init__({
            "act": In(stream.Signature(ActivationBeat(rows))),
            "seed": In(stream.Signature(data.ArrayLayout(FP32, cols))),
            "weight": In(stream.Signature(WeightBeat(cols, weight_rows))),
            "result": Out(stream.Signature(data.ArrayLayout(FP32, cols))),
            "weights_ready": Out(1),
            "busy": Out(1),
        })

    def _pe(self, m, name):
        """Add one PE to `m`: a `ProcessingElement`, or a black-box instance of
        `pe_module` bound to an interface with the same ports. Returns the ports."""
        if self.pe_module is None:
            m.submodules[name] = pe = ProcessingElement(self.mac_stages)
            return pe
        return black_box(m, name, self.pe_module, PE_SIGNATURE, clocked=True)

    def elaborate(self, platform):
        m = Module()
        rows, stages = self.rows, self.mac_stages

        # Global clock enable: the only stall is a result that is not taken.
        en = Signal()
        m.d.comb += en.eq(~self.result.valid | self.result.ready)

        # ---- Input join and tile-switch admission ------------------------------
        act, seed = self.act, self.seed
        first = act.payload.first
        admit = ~first | self.weights_ready
        take = Signal()
        m.d.comb += [
            act.ready.eq(en & seed.valid & admit),
            seed.ready.eq(en & act.valid & admit),
            take.eq(act.valid & act.ready),
        ]
        switch_in = Signal()
        m.d.comb += switch_in.eq(take & first)
        # The switch marker reaches PE row r r*stages cycles after it entered.
        switch_taps = chain(m, en, switch_in, (rows - 1) * stages, "switch_skew")
        switch_at_row = [switch_taps[r * stages] for r in range(rows)]

        weights = self._weight_scheme()(self, m, en, switch_in, switch_at_row)
        # (The formal proofs' induction lemmas read these: docs/formal.md.)
        self.weights, self.switch_taps = weights, switch_taps
        m.d.comb += self.weights_ready.eq(weights.ready)

        if self.datapath_module is None:
            self._grid(m, en, take, switch_taps, weights)
        else:
            dp = black_box(m, "datapath", self.datapath_module,
                           datapath_signature(rows, self.cols, self.weight_rows), clocked=True)
            m.d.comb += [
                dp.en.eq(en), dp.take.eq(take), dp.first.eq(first),
                dp.act.eq(act.payload.data), dp.seed.eq(seed.payload),
                dp.weight_take.eq(self.weight.valid & self.weight.ready),
                dp.weight.eq(self.weight.payload),
                self.result.payload.eq(dp.result),
                self.result.valid.eq(dp.result_valid),
            ]

        # ---- busy: beats in flight ---------------------------------------------
        in_flight = Signal(range(self.latency + 2))
        done = self.result.valid & self.result.ready
        m.d.sync += in_flight.eq(in_flight + take - done)
        m.d.comb += self.busy.eq(in_flight != 0)
        return m

    def _weight_scheme(self):
        """The class of the weight path (docs/array.md, section 4): rows
        written as they free up for one row a beat at ``mac_stages`` <= 2,
        staggered otherwise."""
        if self.weight_rows == 1 and self.mac_stages < STAGGER_FROM:
            return _RowFreeWeights
        return _StaggeredWeights

    def _grid(self, m, en, take, switch_taps, weights):
        """The PEs, the skew and de-skew registers and the weight bus."""
        rows, cols, stages = self.rows, self.cols, self.mac_stages
        act, seed = self.act, self.seed
        pes = [[self._pe(m, f"pe_{r}_{c}") for c in range(cols)] for r in range(rows)]
        self.pes = pes      # the formal proofs watch their weight ports (docs/formal.md)
        for r in range(rows):
            for c in range(cols):
                m.d.comb += pes[r][c].en.eq(en)

        # ---- Activation skew: row r is delayed r*stages cycles -----------------
        # The long skews are memory rings (`delayed`): at the fpga-llm chip's
        # 16 rows of 7 stages, registers were 13.2k flip-flops (docs/synth.md).
        rings = []
        for r in range(rows):
            a = delayed(m, en, act.payload.data[r].as_value(), r * stages, f"act_skew_{r}", rings)
            m.d.comb += [
                pes[r][0].west.data.eq(a),
                pes[r][0].west.switch.eq(switch_taps[r * stages]),
            ]
        for r in range(rows):
            for c in range(1, cols):
                wiring.connect(m, pes[r][c - 1].east, pes[r][c].west)

        # ---- Seed skew: column c is delayed c cycles ---------------------------
        valid_taps = chain(m, en, take, cols - 1, "seed_valid_skew")
        for c in range(cols):
            s = delayed(m, en, seed.payload[c].as_value(), c, f"seed_skew_{c}", rings)
            m.d.comb += [
                pes[0][c].north.data.eq(s),
                pes[0][c].north.valid.eq(valid_taps[c]),
            ]
        for r in range(1, rows):
            for c in range(cols):
                wiring.connect(m, pes[r - 1][c].south, pes[r][c].north)

        # ---- Output de-skew: column c is delayed cols-1-c cycles ---------------
        for c in range(cols):
            out = delayed(m, en, pes[rows - 1][c].south.data.as_value(), cols - 1 - c,
                          f"out_deskew_{c}", rings)
            m.d.comb += self.result.payload[c].eq(out)
        m.d.comb += self.result.valid.eq(pes[rows - 1][cols - 1].south.valid)
        memory_rings(m, en, rings, "skew_")

        # ---- Weights: the shadow-register write ports ------------------------
        for r in range(rows):
            for c in range(cols):
                data, load = weights.port(r, c)
                m.d.comb += [pes[r][c].weight.data.eq(data), pes[r][c].weight.load.eq(load)]


# From this MAC depth on, and with more than one weight row a beat at every
# depth, the weights use `_StaggeredWeights` (docs/array.md, section 4).
STAGGER_FROM = 3


class _WeightQueue:
    """The queue in front of the shadow registers (`weight_queue_depth` beats)."""

    def __init__(self, array, m):
        self.rows, self.cols, self.stages = array.rows, array.cols, array.mac_stages
        self.lanes = array.weight_rows
        m.submodules.weight_queue = self.queue = SyncFIFO(width=16 * self.cols * self.lanes,
                                                          depth=array.weight_queue_depth)
        m.d.comb += [
            self.queue.w_data.eq(array.weight.payload),
            self.queue.w_en.eq(array.weight.valid),
            array.weight.ready.eq(self.queue.w_rdy),
        ]


class _RowFreeWeights(_WeightQueue):
    """Weights for ``mac_stages`` 1 and 2: the queue's head row k is written into
    shadow row k as soon as the previous tile has switched in at row k, through
    one bus per column, skewed like the activations.

    Attributes: ``ready`` (the next tile may be switched in) and ``port(r, c)``
    (the data and load strobe of PE [r][c]'s shadow register)."""

    def __init__(self, array, m, en, switch_in, switch_at_row):
        super().__init__(array, m)
        rows, queue = self.rows, self.queue
        # pending[k]: shadow row k holds weights that have not been switched in at
        # column 0 yet. Column c sees every event c cycles after column 0 (both
        # the shadow bus and the activations move one column per cycle), so the
        # bookkeeping at column 0 holds for every column.
        pending = Signal(rows)
        drain_row = Signal(range(rows))
        row_free = Signal()
        for k in range(rows):
            with m.If(drain_row == k):
                m.d.comb += row_free.eq(~pending[k] | switch_at_row[k])
        drain = Signal()
        m.d.comb += [
            drain.eq(en & queue.r_rdy & row_free),
            queue.r_en.eq(drain),
        ]
        with m.If(en):
            for k in range(rows):
                with m.If(drain & (drain_row == k)):
                    m.d.sync += pending[k].eq(1)
                with m.Elif(switch_at_row[k]):
                    m.d.sync += pending[k].eq(0)
        with m.If(drain):
            m.d.sync += drain_row.eq(Mux(drain_row == rows - 1, 0, drain_row + 1))

        # staged: weight rows accepted but not yet claimed by a `first` beat.
        # A tile is admitted once all its rows are inside the array and its row 0
        # is in the shadow registers: from then on every later row reaches its
        # shadow register before the switch wave does (docs/array.md).
        staged = Signal(range(rows + array.weight_queue_depth + 1))
        accepted = array.weight.valid & array.weight.ready
        m.d.sync += staged.eq(staged + accepted - Mux(switch_in, rows, 0))
        self.ready = (staged >= rows) & pending[0]
        self.pending, self.staged, self.drain_row = pending, staged, drain_row

        self._row = chain(m, en, drain_row, self.cols - 1, "wbus_row")
        self._valid = chain(m, en, drain, self.cols - 1, "wbus_valid")
        self._data = [chain(m, en, queue.r_data[16 * c:16 * (c + 1)], c, f"wbus_data_{c}")[-1]
                      for c in range(self.cols)]

    def port(self, r, c):
        return self._data[c], self._valid[c] & (self._row[c] == r)


class _StaggeredWeights(_WeightQueue):
    """Weights for ``mac_stages`` >= 3, whose switch wave crosses a row in
    ``L = mac_stages`` cycles, slower than the queue could write rows, and for
    weight beats of ``w = weight_rows`` > 1 rows at every depth, which arrive
    faster than the wave moves.

    A tile leaves the queue in beat order, one beat (rows ``b*w ... b*w + w-1``)
    per cycle at most, starting with beat 0 once the previous tile has switched
    in at row 0. Row k reaches its shadow registers ``d_k = k*L - k//w`` cycles
    after its beat left the queue (one shared delay line per lane, a tap per
    row), so if beat 0 left at D, row k (beat k//w, which left at D + k//w or
    later) is written no earlier than ``D + k*L``: after the previous tile's wave
    has passed row k. The tile is ready once its last beat has left the queue,
    so its own wave, which starts after that, reaches row k after the write.
    Tiles of ``ceil(rows / w)`` activation rows or more therefore stream with
    no bubble at any depth (docs/array.md).

    Attributes: as `_RowFreeWeights`."""

    def __init__(self, array, m, en, switch_in, switch_at_row):
        super().__init__(array, m)
        rows, cols, lanes, queue = self.rows, self.cols, self.lanes, self.queue
        beats = weight_load_cycles(rows, lanes)
        beat = Signal(range(beats), name="row" if lanes == 1 else "beat")   # the queue head's beat
        pending0 = Signal()             # shadow row 0 holds a row 0 not yet switched in
        loaded = Signal()               # a whole tile has left the queue, not yet claimed
        drain = Signal()
        m.d.comb += [
            drain.eq(en & queue.r_rdy & ((beat != 0) | ~pending0 | switch_at_row[0])),
            queue.r_en.eq(drain),
        ]
        # A switch and the next tile's first beat can meet in one cycle: the
        # setting statements come last and win.
        with m.If(switch_in):
            m.d.sync += loaded.eq(0)
        with m.If(en & switch_at_row[0]):
            m.d.sync += pending0.eq(0)
        with m.If(drain):
            m.d.sync += beat.eq(Mux(beat == beats - 1, 0, beat + 1))
            with m.If(beat == 0):
                m.d.sync += pending0.eq(1)
            with m.If(beat == beats - 1):
                m.d.sync += loaded.eq(1)
        self.ready = loaded

        # Row k's delay behind its beat, and per lane the longest of its rows.
        self._delay = [k * self.stages - k // lanes for k in range(rows)]
        longest = [max(self._delay[lane::lanes]) for lane in range(min(lanes, rows))]
        # One delay line per lane and column: column c is skewed by c like the
        # activations, row k taps its lane's line d_k cycles further down.
        length = cols - 1 + max(longest)
        self._beat = chain(m, en, beat, length, "wbus_row" if lanes == 1 else "wbus_beat")
        self._valid = chain(m, en, drain, length, "wbus_valid")
        width = 16 * cols
        self._data = [[chain(m, en, queue.r_data[width * lane + 16 * c:width * lane + 16 * (c + 1)],
                              c + longest[lane],
                              f"wbus_data_{c}" if lanes == 1 else f"wbus_data_{lane}_{c}")
                       for c in range(cols)] for lane in range(len(longest))]

    def port(self, r, c):
        tap = c + self._delay[r]
        return (self._data[r % self.lanes][c][tap],
                self._valid[tap] & (self._beat[tap] == r // self.lanes))
