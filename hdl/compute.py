"""The compute engine: LOADW and MATMUL on the systolic array.

It takes instructions whose tokens the controller has already popped, and runs
two independent streams so that the next tile's weights load while the current
tile computes (docs/architecture.md):

* the weight loader reads LOADW's VMEM rows and feeds the array's weight port;
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
from .array import SystolicArray
from .isa import Deps, ErrorCode, Opcode, SeedMode
from .vmem import ReadPortSignature, WritePortSignature, _addr_shape, vmem_row_layout

__all__ = ["ComputeCommand", "ComputeEngine"]


def ComputeCommand(config):
    """A decoded LOADW, MATMUL or SYNC for the compute engine."""
    vrow = _addr_shape(config.vmem_rows)
    arow = _addr_shape(config.acc_rows)
    return data.StructLayout({
        "opcode": Opcode,
        "deps": Deps,
        "seed_mode": SeedMode,
        "new_weights": 1,
        "vmem_row": vrow,           # LOADW: first weight row; MATMUL: first activation row
        "count": 16,                # LOADW: k_rows; MATMUL: m_rows
        "out_row": arow,
        "seed_row": arow,
    })


def _pow2_at_least(n):
    return 1 << max(1, (n - 1).bit_length())


class _PendingRows(wiring.Component):
    """In-order record of MATMUL rows issued to the array whose results are not yet
    in the accumulator: their output row, whether it is the MATMUL's last, and its
    push flags. ``hit`` tells whether `probe` is among the pending output rows."""

    def __init__(self, depth, addr_shape):
        self.depth = depth
        entry = data.StructLayout({"addr": addr_shape, "last": 1, "push": Deps})
        self._entry = entry
        super().__init__({
            "add": In(stream.Signature(entry)),
            "head": Out(entry),          # oldest pending row
            "empty": Out(1),
            "retire": In(1),
            "probe": In(addr_shape),
            "hit": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        entries = Array(Signal(self._entry, name=f"entry{i}") for i in range(n))
        valid = Signal(n)
        wp, rp = Signal(range(n)), Signal(range(n))
        count = Signal(range(n + 1))
        m.d.comb += [
            self.add.ready.eq(count < n),
            self.empty.eq(count == 0),
            self.head.eq(entries[rp]),
        ]
        add = self.add.valid & self.add.ready
        with m.If(add):
            m.d.sync += [entries[wp].eq(self.add.payload), wp.eq(wp + 1)]
        with m.If(self.retire):
            m.d.sync += rp.eq(rp + 1)
        m.d.sync += count.eq(count + add - self.retire)
        set_bits = Mux(add, C(1, n) << wp, 0)
        clear_bits = Mux(self.retire, C(1, n) << rp, 0)
        m.d.sync += valid.eq((valid | set_bits) & ~clear_bits)
        m.d.comb += self.hit.eq(Cat(valid[i] & (entries[i].addr == self.probe)
                                    for i in range(n)).any())
        return m


class ComputeEngine(wiring.Component):
    """Runs LOADW, MATMUL and SYNC on a `SystolicArray` (docs/architecture.md).

    Parameters
    ----------
    config : ChipConfig
    pe_module : str or None
        Passed to `SystolicArray`: a Verilog module name to instantiate for each
        PE instead of elaborating it (simulation builds use it for speed).

    Interface
    ---------
    cmd : In(stream.Signature(ComputeCommand(config)))
        Instructions in program order, tokens already taken.
    complete : Out(stream.Signature(Deps), always ready)
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
    seed_read : Out(ReadPortSignature) to the accumulator, always ready.
    result_write : Out(WritePortSignature) to the accumulator, always ready.
    array_accept : Out(1)
        An activation beat entered the array this cycle (the utilisation counter).
    loadw_done : Out(1)
        The weight loader has issued a LOADW's last row (for the trace).
    """

    SKID_DEPTH = 4

    def __init__(self, config, *, pe_module=None):
        self.config = config
        c = config
        vaddr, aaddr = _addr_shape(c.vmem_rows), _addr_shape(c.acc_rows)
        self.array = SystolicArray(c.rows, c.cols, c.mac_stages, pe_module=pe_module)
        self.pending_depth = _pow2_at_least(self.array.latency + self.SKID_DEPTH + 4)
        super().__init__({
            "cmd": In(stream.Signature(ComputeCommand(c))),
            "complete": Out(stream.Signature(Deps, always_ready=True)),
            "error": Out(ErrorCode),
            "idle": Out(1),
            "act_read": Out(ReadPortSignature(vaddr, vmem_row_layout(c), always_ready=True)),
            "weight_read": Out(ReadPortSignature(vaddr, vmem_row_layout(c))),
            "seed_read": Out(ReadPortSignature(aaddr, acc_row_layout(c), always_ready=True)),
            "result_write": Out(WritePortSignature(aaddr, acc_row_layout(c), always_ready=True)),
            "array_accept": Out(1),
            "loadw_done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = self.array
        m.submodules.loadw_q = loadw_q = fifo.SyncFIFOBuffered(
            width=len(self.cmd.payload.as_value()), depth=2)
        m.submodules.matmul_q = matmul_q = fifo.SyncFIFOBuffered(
            width=len(self.cmd.payload.as_value()), depth=2)

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
        self._sync_push = cmd.deps

    # ---- weights: VMEM rows -> array.weight, zero rows past k_rows ----------------
    def _weight_loader(self, m, loadw_q, array):
        c = self.config
        cmd = ComputeCommand(c)(loadw_q.r_data)
        k = Signal(range(c.rows + 1))
        busy = Signal()
        m.submodules.wskid = skid = fifo.SyncFIFO(width=16 * c.cols, depth=self.SKID_DEPTH)
        inflight = Signal()     # a read (or a zero row) was issued last cycle
        inflight_zero = Signal()
        room = skid.level + inflight < self.SKID_DEPTH
        real = k < cmd.count
        port = self.weight_read
        issue = Signal()
        m.d.comb += [
            port.req.payload.eq(cmd.vmem_row + k),
            port.req.valid.eq(loadw_q.r_rdy & room & real),
            issue.eq(loadw_q.r_rdy & room & Mux(real, port.req.ready, 1)),
            busy.eq(inflight),
        ]
        m.d.sync += [inflight.eq(issue), inflight_zero.eq(issue & ~real)]
        with m.If(issue):
            with m.If(k == c.rows - 1):
                m.d.sync += k.eq(0)
                m.d.comb += [loadw_q.r_en.eq(1), self.loadw_done.eq(1)]
            with m.Else():
                m.d.sync += k.eq(k + 1)
        row = port.resp.payload.as_value()[:16 * c.cols]
        m.d.comb += [
            skid.w_en.eq(inflight),
            skid.w_data.eq(Mux(inflight_zero, 0, row)),
            array.weight.valid.eq(skid.r_rdy),
            array.weight.payload.eq(skid.r_data),
            skid.r_en.eq(array.weight.ready),
        ]
        return busy | skid.r_rdy

    # ---- activations and seeds: VMEM/accumulator rows -> array.act/seed ----------
    def _activation_streamer(self, m, matmul_q, array):
        c = self.config
        cmd = ComputeCommand(c)(matmul_q.r_data)
        m.submodules.pending = pending = _PendingRows(self.pending_depth, _addr_shape(c.acc_rows))
        act_bits, seed_bits = 16 * c.rows, 32 * c.cols
        m.submodules.askid = skid = fifo.SyncFIFO(width=act_bits + seed_bits + 1,
                                                   depth=self.SKID_DEPTH)
        i = Signal(16)
        last = i == cmd.count - 1
        seed_addr = Signal.like(self.seed_read.req.payload)
        m.d.comb += seed_addr.eq(Mux(cmd.seed_mode == SeedMode.ACC, cmd.seed_row + i, cmd.seed_row))
        reads_seed = cmd.seed_mode != SeedMode.ZERO
        m.d.comb += pending.probe.eq(seed_addr)
        inflight = Signal()
        inflight_zero_seed = Signal()
        inflight_first = Signal()
        room = skid.level + inflight < self.SKID_DEPTH
        issue = Signal()
        m.d.comb += [
            issue.eq(matmul_q.r_rdy & room & pending.add.ready & ~(reads_seed & pending.hit)),
            self.act_read.req.valid.eq(issue),
            self.act_read.req.payload.eq(cmd.vmem_row + i),
            self.seed_read.req.valid.eq(issue & reads_seed),
            self.seed_read.req.payload.eq(seed_addr),
            pending.add.valid.eq(issue),
            pending.add.payload.addr.eq(cmd.out_row + i),
            pending.add.payload.last.eq(last),
            pending.add.payload.push.eq(cmd.deps),
        ]
        m.d.sync += [
            inflight.eq(issue),
            inflight_zero_seed.eq(~reads_seed),
            inflight_first.eq(cmd.new_weights & (i == 0)),
        ]
        with m.If(issue):
            with m.If(last):
                m.d.sync += i.eq(0)
                m.d.comb += matmul_q.r_en.eq(1)
            with m.Else():
                m.d.sync += i.eq(i + 1)
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
        return inflight | skid.r_rdy, pending

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
