"""The compute engine: LOADW and MATMUL on the systolic array.

It takes instructions whose tokens the controller has already popped, and runs
two independent streams so that the next tile's weights load while the current
tile computes (docs/architecture.md):

* the weight loader reads LOADW's VMEM rows, ``config.weight_rows_per_cycle``
  lanes of them, and feeds the array's weight port a beat of one row per lane;
* the activation streamer reads MATMUL's activation rows (VMEM) and seed rows
  (accumulator), and the result writer puts the array's results into the
  accumulator and reports the MATMUL complete after its last row is written.

Read-after-write through the accumulator is interlocked row by row: a seed row
is not read while a result for that row is still in flight (`_PendingRows`).
"""

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .accmem import acc_row_layout
from .array import SystolicArray, array_latency
from .blackbox import black_box
from .fifo import BufferedFifo, Fifo
from .hooks import BuildHooks
from .isa import ErrorCode, Opcode, Pushes, SeedMode
from .vmem import ReadPortSignature, WritePortSignature, _addr_shape, lane_port_names, vmem_row_layout

__all__ = ["ComputeCommand", "ComputeEngine", "pending_entry_layout", "pending_rows_depth",
           "pending_rows_signature"]


def ComputeCommand(config):
    """A decoded LOADW, MATMUL or SYNC for the compute engine."""
    vrow = _addr_shape(config.vmem_rows)
    arow = _addr_shape(config.acc_rows)
    return data.StructLayout({
        "opcode": Opcode,
        "push": Pushes,             # the push flags (pops are the controller's) and the link
        "seed_mode": SeedMode,
        "new_weights": 1,
        "vmem_row": vrow,           # LOADW: first weight row; MATMUL: first activation row
        "count": 16,                # LOADW: k_rows; MATMUL: m_rows
        "out_row": arow,
        "seed_row": arow,
    })


def _pow2_at_least(n):
    return 1 << max(1, (n - 1).bit_length())


def pending_rows_depth(config):
    """Entries of the compute engine's record of pending rows: every row that
    can be in the array or in its skid buffer, with room to spare, rounded up
    to a power of two."""
    return _pow2_at_least(array_latency(config.rows, config.cols, config.mac_stages)
                          + ComputeEngine.SKID_DEPTH + 4)


def pending_entry_layout(addr_shape):
    """A pending row: its accumulator row, whether it is its MATMUL's last,
    and its push flags."""
    return data.StructLayout({"addr": addr_shape, "last": 1, "push": Pushes})


def pending_rows_signature(depth, addr_shape):
    """The ports of `_PendingRows` (and of a simulation model that stands in for
    it, `ComputeEngine`'s ``pending_module``)."""
    entry = pending_entry_layout(addr_shape)
    return wiring.Signature({
        "add": In(stream.Signature(entry)),
        "head": Out(entry),          # oldest pending row
        "empty": Out(1),
        "retire": In(1),
        "probe": In(addr_shape),
        "probe_load": In(1),
        "hit": Out(1),
    })


class _PendingRows(wiring.Component):
    """In-order record of MATMUL rows issued to the array whose results are not yet
    in the accumulator (their output row, whether it is the MATMUL's last, and its
    push flags), and the read-after-write probe of the row about to be issued.

    Everything the rest of the engine sees is a register, so that no path runs
    from a counter through the comparators into a memory port (docs/synth.md):

    * ``head`` is the oldest pending row, kept in a register (the next one is
      looked up a cycle ahead).
    * The probe is looked up a cycle ahead: ``probe`` is the seed row of the
      row that may move into the issue slot; in a cycle with ``probe_load`` it
      moves there, and from the next cycle on, for as long as it is held,
      ``hit`` (a register) tells whether that row is among the pending rows --
      exactly, in every cycle: the held probe keeps one match bit per entry,
      so an entry that retires clears ``hit`` in the next cycle. A row added
      in a ``probe_load`` cycle is compared with the new probe as it is added;
      the caller adds rows only in such cycles or when nothing is held (the
      issued row is the held one).
    """

    def __init__(self, depth, addr_shape):
        assert depth & (depth - 1) == 0
        self.depth = depth
        self._entry = pending_entry_layout(addr_shape)
        super().__init__(pending_rows_signature(depth, addr_shape))

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        entries = Array(Signal(self._entry, name=f"entry{i}") for i in range(n))
        valid = Signal(n)
        wp, rp = Signal(range(n)), Signal(range(n))
        rp1 = Signal(range(n), init=1 % n)      # rp + 1
        count = Signal(range(n + 1))
        full = Signal()                      # count == n, registered
        m.d.comb += [
            self.add.ready.eq(~full),
            self.empty.eq(count == 0),
        ]
        add = self.add.valid & self.add.ready
        retire = self.retire
        with m.If(add):
            m.d.sync += [entries[wp].eq(self.add.payload), wp.eq(wp + 1)]
        with m.If(retire):
            m.d.sync += [rp.eq(rp1), rp1.eq(rp1 + 1)]
        count_next = count + add - retire
        m.d.sync += [count.eq(count_next), full.eq(count_next == n)]
        # The head register: after a retire the entry behind it (or the row added
        # in the same cycle, if it becomes the head); into an empty record the
        # added row.
        with m.If(retire):
            m.d.sync += self.head.eq(Mux(add & (wp == rp1), self.add.payload, entries[rp1]))
        with m.Elif(add & (count == 0)):
            m.d.sync += self.head.eq(self.add.payload)

        add_bits = Mux(add, C(1, n) << wp, 0)
        keep = ~Mux(retire, C(1, n) << rp, C(0, n))      # entries that stay pending
        m.d.sync += valid.eq((valid | add_bits) & keep)

        # The probe, one cycle ahead. An entry being added has no valid bit yet
        # (and its slot holds a stale row): it is compared with the added row.
        match = Signal(n)                    # per entry: it holds the held probe's row
        eq = Cat(entries[i].addr == self.probe for i in range(n))
        add_eq = self.add.payload.addr == self.probe
        with m.If(self.probe_load):
            m.d.sync += [
                match.eq((eq & ~add_bits) | Mux(add_eq, add_bits, 0)),
                self.hit.eq((eq & valid & keep).any() | (add & add_eq)),
            ]
        with m.Else():
            # The held probe's row: rows added now cannot be it (rows are only
            # added when the probe moves on, see the caller), retired ones drop.
            m.d.sync += self.hit.eq((match & valid & keep).any())
        return m


class ComputeEngine(wiring.Component):
    """Runs LOADW, MATMUL and SYNC on a `SystolicArray` (docs/architecture.md).

    Parameters
    ----------
    config : ChipConfig
    hooks : BuildHooks or None
        Its ``pe_module`` and ``datapath_module`` go to the `SystolicArray`;
        its ``pending_module`` is a Verilog module to instantiate for the
        record of pending rows (`_PendingRows`, `pending_rows_signature`): a
        simulation model with its ports and its behaviour, cycle for cycle.

    Interface
    ---------
    cmd : In(stream.Signature(ComputeCommand(config)))
        Instructions in program order, tokens already taken.
    complete : Out(stream.Signature(Pushes), always ready)
        A MATMUL's push flags once its last result is in the accumulator; a SYNC's
        once everything before it has finished.
    error : Out(ErrorCode)
        NO_WEIGHTS when a MATMUL switches to weights no LOADW staged,
        WEIGHT_OVERFLOW for a LOADW while another staged tile is unused; the
        engine then refuses further commands.
    idle : Out(1)
        No instruction in progress and nothing in flight.
    act_read, weight_read : Out(ReadPortSignature) to VMEM
        ``act_read`` must be always ready; ``weight_read`` may be refused.
    weight_read1, ... : Out(ReadPortSignature) to VMEM
        The weight loader's further lanes (``config.weight_rows_per_cycle`` in
        all, `lane_port_names`): lane i reads the LOADW's rows ``k = i mod
        lanes``, each lane at its own pace, and may be refused.
    seed_read : Out(ReadPortSignature) to the accumulator, always ready.
    result_write : Out(WritePortSignature) to the accumulator, always ready.
    array_accept : Out(1)
        An activation beat entered the array this cycle (the utilisation counter).
    loadw_done : Out(1)
        The weight loader has issued a LOADW's last row (for the trace).
    """

    SKID_DEPTH = 4

    def __init__(self, config, *, hooks=None):
        hooks = BuildHooks() if hooks is None else hooks
        self.config = config
        self.pending_module = hooks.pending_module
        c = config
        vaddr, aaddr = _addr_shape(c.vmem_rows), _addr_shape(c.acc_rows)
        self.array = SystolicArray(c.rows, c.cols, c.mac_stages,
                                   weight_rows=c.weight_rows_per_cycle, hooks=hooks)
        self.pending_depth = pending_rows_depth(c)
        self.weight_reads = lane_port_names("weight_read", c.weight_rows_per_cycle)
        super().__init__({
            "cmd": In(stream.Signature(ComputeCommand(c))),
            "complete": Out(stream.Signature(Pushes, always_ready=True)),
            "error": Out(ErrorCode),
            "idle": Out(1),
            "act_read": Out(ReadPortSignature(vaddr, vmem_row_layout(c), always_ready=True)),
            **{name: Out(ReadPortSignature(vaddr, vmem_row_layout(c))) for name in self.weight_reads},
            "seed_read": Out(ReadPortSignature(aaddr, acc_row_layout(c), always_ready=True)),
            "result_write": Out(WritePortSignature(aaddr, acc_row_layout(c), always_ready=True)),
            "array_accept": Out(1),
            "loadw_done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = self.array
        # Command queues: `SyncFIFOBuffered`'s cycles, with the entries the
        # proofs' lemmas name (`BufferedFifo`, docs/formal.md).
        self.loadw_q = loadw_q = BufferedFifo(len(self.cmd.payload.as_value()), 2)
        self.matmul_q = matmul_q = BufferedFifo(len(self.cmd.payload.as_value()), 2)
        m.submodules.loadw_q, m.submodules.matmul_q = loadw_q, matmul_q

        self._dispatch(m, loadw_q, matmul_q)
        weights_busy = self._weight_loader(m, loadw_q, array)
        acts_busy, pending = self._activation_streamer(m, matmul_q, array)
        self._result_writer(m, array, pending)

        # `level`, not `r_rdy`: a buffered FIFO shows a new entry at its output a
        # cycle after the entry is counted, and a SYNC must not slip into that gap.
        m.d.comb += self.idle.eq((loadw_q.level == 0) & (matmul_q.level == 0) & ~weights_busy
                                 & ~acts_busy & pending.empty & ~array.busy)
        return m

    # ---- dispatch: route commands, count staged tiles, run SYNC -------------------
    def _dispatch(self, m, loadw_q, matmul_q):
        cmd = ComputeCommand(self.config)(self.cmd.payload)
        staged = Signal(range(1 << 16))   # LOADWs dispatched minus tiles claimed
        failed = Signal()
        is_loadw = cmd.opcode == Opcode.LOADW
        is_matmul = cmd.opcode == Opcode.MATMUL
        is_sync = ~is_loadw & ~is_matmul
        no_weights = is_matmul & cmd.new_weights & (staged == 0)
        # One staged tile at most: it always fits in the array, so a program that
        # never uses it still finishes (the tile is dropped at the next start).
        overflow = is_loadw & (staged != 0)
        ready = Signal()
        m.d.comb += ready.eq(~failed & Mux(is_loadw, loadw_q.w_rdy | overflow,
                                           Mux(is_matmul, matmul_q.w_rdy | no_weights, self.idle)))
        m.d.comb += [
            self.cmd.ready.eq(ready),
            loadw_q.w_data.eq(self.cmd.payload),
            matmul_q.w_data.eq(self.cmd.payload),
        ]
        take = self.cmd.valid & ready
        with m.If(take):
            with m.If(no_weights):
                m.d.sync += [failed.eq(1), self.error.eq(ErrorCode.NO_WEIGHTS)]
            with m.Elif(overflow):
                m.d.sync += [failed.eq(1), self.error.eq(ErrorCode.WEIGHT_OVERFLOW)]
            with m.Else():
                m.d.comb += [loadw_q.w_en.eq(is_loadw), matmul_q.w_en.eq(is_matmul)]
                m.d.sync += staged.eq(staged + is_loadw - (is_matmul & cmd.new_weights))
        self._sync_done = Signal()
        m.d.comb += self._sync_done.eq(take & is_sync)
        self._sync_push = cmd.push

    # ---- weights: VMEM rows -> array.weight, zero rows past k_rows ----------------
    def _weight_loader(self, m, loadw_q, array):
        """One lane per weight row of a beat: lane i reads the LOADW's rows
        ``k = b*lanes + i`` (zero rows past k_rows and past the tile) into a skid
        buffer of its own, at its own pace (a lane waits while the activations
        read its bank), and the array takes a beat once every lane has its row.
        The LOADW leaves the queue when its last lane issues its last row."""
        c = self.config
        lanes = c.weight_rows_per_cycle
        beats = c.weight_load_cycles
        cmd = ComputeCommand(c)(loadw_q.r_data)
        busy, ready_rows, finishing, issues = [], [], [], []
        skids = []
        for lane, name in enumerate(self.weight_reads):
            tag = f"{lane}" if lanes > 1 else ""
            b = Signal(range(beats), name=f"wbeat{tag}" if lanes > 1 else "k")
            # This lane issued the LOADW's last row (one lane: the LOADW is done then).
            done = Signal(name=f"wdone{tag}") if lanes > 1 else C(0, 1)
            skid = fifo.SyncFIFO(width=16 * c.cols, depth=self.SKID_DEPTH)
            m.submodules[f"wskid{tag}"] = skid
            inflight = Signal(name=f"inflight{tag}")  # a read (or a zero row) was issued last cycle
            inflight_zero = Signal(name=f"inflight_zero{tag}")
            room = skid.level + inflight < self.SKID_DEPTH
            k = b * lanes + lane if lanes > 1 else b
            real = k < cmd.count
            port = getattr(self, name)
            issue = Signal(name=f"issue{tag}")
            m.d.comb += [
                port.req.payload.eq(cmd.vmem_row + k),
                port.req.valid.eq(loadw_q.r_rdy & ~done & room & real),
                issue.eq(loadw_q.r_rdy & ~done & room & Mux(real, port.req.ready, 1)),
            ]
            m.d.sync += [inflight.eq(issue), inflight_zero.eq(issue & ~real)]
            last = b == beats - 1
            with m.If(issue):
                m.d.sync += b.eq(Mux(last, 0, b + 1))
            finishing.append(done | (issue & last))
            issues.append((issue, last, done))
            row = port.resp.payload.as_value()[:16 * c.cols]
            m.d.comb += [skid.w_en.eq(inflight), skid.w_data.eq(Mux(inflight_zero, 0, row))]
            busy.append(inflight | skid.r_rdy)
            ready_rows.append(skid.r_rdy)
            skids.append(skid)
        # The LOADW is done when every lane has issued its last row.
        complete = Cat(*finishing).all()
        with m.If(complete):
            m.d.comb += [loadw_q.r_en.eq(1), self.loadw_done.eq(1)]
        for issue, last, done in issues:
            if lanes > 1:
                with m.If(complete):
                    m.d.sync += done.eq(0)
                with m.Elif(issue & last):
                    m.d.sync += done.eq(1)
        take = array.weight.valid & array.weight.ready
        m.d.comb += [
            array.weight.valid.eq(Cat(*ready_rows).all()),
            array.weight.payload.eq(Cat(*(skid.r_data for skid in skids))),
        ]
        for skid in skids:
            m.d.comb += skid.r_en.eq(take)
        return Cat(*busy).any()

    # ---- activations and seeds: VMEM/accumulator rows -> array.act/seed ----------
    def _activation_streamer(self, m, matmul_q, array):
        """Three register stages, one row per cycle:

        * *next*: the row counter of the MATMUL at the queue's head computes the
          row's VMEM, seed and output rows into registers;
        * *issue*: the row waits here until it may be read. Its interlock hit
          (`_PendingRows`) was looked up while it moved in, so the read requests
          come from registers: no path runs from the counter through the adders
          and comparators into a memory port (docs/synth.md);
        * the skid buffer takes the rows read (one cycle later) and feeds the array.
        """
        c = self.config
        cmd = ComputeCommand(c)(matmul_q.r_data)
        if self.pending_module is None:
            m.submodules.pending = pending = _PendingRows(self.pending_depth,
                                                          _addr_shape(c.acc_rows))
        else:
            pending = black_box(m, "pending", self.pending_module,
                                pending_rows_signature(self.pending_depth, _addr_shape(c.acc_rows)),
                                clocked=True)
        act_bits, seed_bits = 16 * c.rows, 32 * c.cols
        # (A `Fifo`, `SyncFIFO`'s cycles: the rows in a memory, each row's
        # `first` bit in a register that the proofs' lemmas name.)
        m.submodules.askid = skid = self.askid = Fifo(act_bits + seed_bits + 1, self.SKID_DEPTH,
                                                      memory_bits=act_bits + seed_bits)
        vaddr, aaddr = _addr_shape(c.vmem_rows), _addr_shape(c.acc_rows)
        row = data.StructLayout({
            "act": vaddr, "seed": aaddr, "out": aaddr, "last": 1, "first": 1,
            "reads_seed": 1, "push": Pushes,
        })
        nxt, nxt_valid = Signal(row), Signal()      # stage "next"
        cur, cur_valid = Signal(row), Signal()      # stage "issue"

        # Skid credits: free skid entries minus reads in flight, a register.
        credits = Signal(range(self.SKID_DEPTH + 1), init=self.SKID_DEPTH)
        issue = Signal()
        m.d.comb += issue.eq(cur_valid & ~(cur.reads_seed & pending.hit) & (credits != 0)
                             & pending.add.ready)
        advance = Signal()          # next -> issue
        m.d.comb += advance.eq(nxt_valid & (~cur_valid | issue))
        fill = Signal()             # queue head -> next
        m.d.comb += fill.eq(matmul_q.r_rdy & (~nxt_valid | advance))

        # Stage "next": counter and address adders.
        i = Signal(16)
        last = i == cmd.count - 1
        reads_seed = cmd.seed_mode != SeedMode.ZERO
        with m.If(fill):
            m.d.sync += [
                nxt.act.eq(cmd.vmem_row + i),
                nxt.seed.eq(Mux(cmd.seed_mode == SeedMode.ACC, cmd.seed_row + i, cmd.seed_row)),
                nxt.out.eq(cmd.out_row + i),
                nxt.last.eq(last),
                nxt.first.eq(cmd.new_weights & (i == 0)),
                nxt.reads_seed.eq(reads_seed),
                nxt.push.eq(cmd.push),
            ]
            with m.If(last):
                m.d.sync += i.eq(0)
                m.d.comb += matmul_q.r_en.eq(1)
            with m.Else():
                m.d.sync += i.eq(i + 1)
        with m.If(fill):
            m.d.sync += nxt_valid.eq(1)
        with m.Elif(advance):
            m.d.sync += nxt_valid.eq(0)

        # Stage "issue": the interlock was probed as the row moved in.
        m.d.comb += [pending.probe.eq(nxt.seed), pending.probe_load.eq(advance)]
        with m.If(advance):
            m.d.sync += [cur.eq(nxt), cur_valid.eq(1)]
        with m.Elif(issue):
            m.d.sync += cur_valid.eq(0)

        inflight = Signal()
        inflight_zero_seed = Signal()
        m.d.comb += [
            self.act_read.req.valid.eq(issue),
            self.act_read.req.payload.eq(cur.act),
            self.seed_read.req.valid.eq(issue & cur.reads_seed),
            self.seed_read.req.payload.eq(cur.seed),
            pending.add.valid.eq(issue),
            pending.add.payload.addr.eq(cur.out),
            pending.add.payload.last.eq(cur.last),
            pending.add.payload.push.eq(cur.push),
        ]
        inflight_first = Signal()
        m.d.sync += [
            inflight.eq(issue),
            inflight_zero_seed.eq(~cur.reads_seed),
            inflight_first.eq(cur.first),
            credits.eq(credits - issue + skid.r_en),
        ]
        act = self.act_read.resp.payload.as_value()[:act_bits]
        seed = Mux(inflight_zero_seed, 0, self.seed_read.resp.payload.as_value()[:seed_bits])
        m.d.comb += [
            skid.w_en.eq(inflight),
            skid.w_data.eq(Cat(act, seed, inflight_first)),
            array.act.valid.eq(skid.r_rdy),
            array.seed.valid.eq(skid.r_rdy),
            array.act.payload.data.eq(skid.r_data[:act_bits]),
            array.seed.payload.eq(skid.r_data[act_bits:act_bits + seed_bits]),
            array.act.payload.first.eq(skid.r_data[-1]),
            skid.r_en.eq(array.act.valid & array.act.ready),
            self.array_accept.eq(array.act.valid & array.act.ready),
        ]
        return nxt_valid | cur_valid | inflight | skid.r_rdy, pending

    # ---- results: array.result -> accumulator; completion after the last row -----
    def _result_writer(self, m, array, pending):
        write = self.result_write
        m.d.comb += [
            array.result.ready.eq(1),
            write.valid.eq(array.result.valid),
            write.payload.addr.eq(pending.head.addr),
            write.payload.data.eq(array.result.payload),
            pending.retire.eq(array.result.valid),
        ]
        matmul_done = array.result.valid & pending.head.last
        m.d.comb += [
            self.complete.valid.eq(matmul_done | self._sync_done),
            self.complete.payload.eq(Mux(matmul_done, pending.head.push, self._sync_push)),
        ]
