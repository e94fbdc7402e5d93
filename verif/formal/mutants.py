"""Mutated designs: the proofs must fail on them (docs/formal.md, "The
properties can fail").

Each mutant is a `Proof` of a harness from `mxu.verif.formal.units` around a
design with one planted bug, bounded (a counterexample is short), and names
the property that must catch it. Bugs are planted either in Amaranth (a
subclass that adds to one section of the design) or in the netlist (Yosys
commands after ``prep``), never by changing the design's own source.
"""

from dataclasses import dataclass

from amaranth.hdl import Signal

from mxu.hdl.array import SystolicArray, _RowFreeWeights, _StaggeredWeights
from mxu.hdl.compute import ComputeEngine
from mxu.hdl.dma import Dma, DmaDir, _Gearbox
from mxu.hdl.fifo import Fifo
from mxu.hdl.regs import SoftReset
from mxu.hdl.vpu import _OperandReader

from .depths import array_depth, dma_depth, quant_load_depth
from .sby import Proof
from .units import (CUT_COMPUTE, CUT_DMA, CUT_MAC, _cut_expander, _two_beat_tiles,
                    array_harness, compute_harness, controller_harness, dma_harness,
                    quant_config, regs_harness, vector_harness)

__all__ = ["Mutant", "mutants"]


class _DropsAwvalidOnStall(Dma):
    """A DMA that drops AWVALID for a cycle when a stall arrives (AWREADY low),
    and offers the same burst again after."""

    def _connect_axi(self, m, *sections):
        super()._connect_axi(m, *sections)
        stalled = Signal()
        m.d.sync += stalled.eq(self.axi.awvalid & ~self.axi.awready)
        with m.If(stalled):
            m.d.comb += self.axi.awvalid.eq(0)


class _ShortGearbox(_Gearbox):
    def _last(self, beat, length):
        return beat + 1 == length


class _ShortBurst(Dma):
    """A DMA whose W beat counter ends each burst one beat short (WLAST on
    beat AWLEN)."""

    def _gearbox_class(self):
        return _ShortGearbox


class _EarlyWeights(_StaggeredWeights):
    """Staggered weights whose rows after the first reach their shadow
    registers a cycle early (a tap one short on each lane's delay line)."""

    def __init__(self, *args):
        super().__init__(*args)
        self._delay = [max(0, d - 1) for d in self._delay]


class _EarlyWeightArray(SystolicArray):
    def _weight_scheme(self):
        return _EarlyWeights


class _EarlyTile(_RowFreeWeights):
    """Row-free weights that admit a tile one row before it is staged
    completely (``staged >= rows - 1``)."""

    def __init__(self, array, m, *args):
        super().__init__(array, m, *args)
        self.ready = (self.staged >= self.rows - 1) & self.pending[0]


class _EarlyTileArray(SystolicArray):
    def _weight_scheme(self):
        return _EarlyTile


class _SlipsOnMeet(Fifo):
    """A queue whose write pointer stays put when a write meets a read: the
    write lands, the level stays, and the entry is read again later."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.w_en & self.w_rdy & self.r_en & self.r_rdy):
            m.d.sync += self.produce.eq(self.produce)
        return m


class _MarksFirst(Fifo):
    """A queue that sets the first register bit of every entry it takes (the
    row queue's ``first`` mark: every row of a contiguous store written from its byte
    ``off``, over the beat that waits)."""

    def __init__(self, width, depth, *, memory_bits):
        super().__init__(width, depth, memory_bits=memory_bits)

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.w_en & self.w_rdy):
            with m.Switch(self.produce):
                for i, entry in enumerate(self.entries):
                    with m.Case(i):
                        m.d.sync += entry[0].eq(1)
        return m


def _replaced(fifo):
    """Mark a queue a mutant replaces as used (Amaranth warns of an
    elaboratable that is never elaborated)."""
    fifo._MustUse__used = True


class _LengthQueueSlips(Dma):
    """A DMA whose W length queue loses its write pointer's step when a
    burst is queued in the cycle a W burst ends."""

    def __init__(self, config):
        super().__init__(config)
        _replaced(self.len_queue)
        self.len_queue = _SlipsOnMeet(8, config.dma_max_outstanding)


class _EveryRowFirst(Dma):
    """A DMA whose row reader's queue marks every row as a range's first."""

    def __init__(self, config):
        super().__init__(config)
        q = self.row_reader.queue
        _replaced(q)
        self.row_reader.queue = _MarksFirst(q.width, q.depth, memory_bits=q.memory_bits)


class _BeatsAllFirst(Dma):
    """A DMA that counts every R beat to the first receive context, also
    those of the next load's bursts (the second context's)."""

    def _responses(self, m, bursts, rc, status):
        super()._responses(m, bursts, rc, status)
        m.d.sync += rc.r_next.eq(0)


class _DropsRowsOnError(Dma):
    """A DMA whose quantized rows offered to VMEM are withdrawn when an error
    response arrives, refused or not (the load before its ``waiting``)."""

    def _quant_path(self, m, rc, status, clear):
        super()._quant_path(m, rc, status, clear)
        lanes = [getattr(self, name) for name in self.vmem_writes[1:]]
        with m.If(status.abort):
            m.d.comb += [self._quant_rows.valid.eq(0), *(lane.valid.eq(0) for lane in lanes)]


class _ResetMidBurst(SoftReset):
    """A soft reset that does not wait for the drain: the core is reset in
    the cycle after the request, bursts in flight or not (the chip before
    issue 49)."""

    def _done(self, pending):
        return pending


class _CompletesEveryRow(ComputeEngine):
    """A compute engine that reports a MATMUL complete at every result row,
    not only at its last."""

    def _result_writer(self, m, array, pending):
        super()._result_writer(m, array, pending)
        with m.If(array.result.valid):
            m.d.comb += self.complete.valid.eq(1)


class _EveryRowLast(_OperandReader):
    """An operand reader that marks every row of operand ``a`` its
    instruction's last (the writer completes a VECTOR at each row)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.a.payload.meta.last.eq(1)
        return m


@dataclass(frozen=True)
class Mutant:
    """A planted bug, the proof that runs on it, and the property (a name
    ending) whose counterexample must show it."""
    name: str
    proof: Proof
    caught_by: str


def mutants(config):
    """The mutants for a (small) chip configuration."""
    c = config
    # The compute engine's "tokens are there" forced true: it ignores its tokens.
    ignore_token = ("flatten", "cd top", r"connect -unset \dut.compute_pop_ok",
                    r"connect -set \dut.compute_pop_ok 1'1", "cd ..")
    vpu = c if c.vpu else c.replace(vpu=True)
    compute = _two_beat_tiles(c)
    quant = quant_config(c)
    compute_depth = array_depth(compute.rows, compute.cols, compute.mac_stages,
                                compute.weight_rows_per_cycle).cycles
    return [
        Mutant("dma_drops_awvalid_on_stall",
               Proof("mutant.dma_drops_awvalid", lambda: dma_harness(c, DmaDir.STORE,
                                                                     dma=_DropsAwvalidOnStall),
                     mode="bmc", depth=10, cover_depth=1, covers=False),
               "dma.axi.aw.valid_held"),
        Mutant("dma_burst_one_beat_short",
               Proof("mutant.dma_short_burst", lambda: dma_harness(c, DmaDir.STORE,
                                                                   dma=_ShortBurst),
                     mode="bmc", depth=10, cover_depth=1, covers=False),
               "dma.axi.w.last_on_awlen"),
        Mutant("dma_length_queue_slips",
               Proof("mutant.dma_length_queue_slips",
                     lambda: dma_harness(c, DmaDir.STORE, dma=_LengthQueueSlips),
                     mode="bmc", depth=10, cover_depth=1, covers=False, script=CUT_DMA),
               "dma.inv.len_queue.pointers"),
        Mutant("dma_every_row_first",
               Proof("mutant.dma_every_row_first",
                     lambda: dma_harness(c, DmaDir.STORE, dma=_EveryRowFirst),
                     mode="bmc", depth=10, cover_depth=1, covers=False, script=CUT_DMA),
               ".marks"),
        Mutant("dma_beats_all_first",
               Proof("mutant.dma_beats_all_first",
                     lambda: dma_harness(c, DmaDir.LOAD, dma=_BeatsAllFirst),
                     mode="bmc", depth=dma_depth(c, True).cycles, cover_depth=1, covers=False,
                     script=CUT_DMA),
               "dma.inv.contexts.late0"),
        Mutant("dma_drops_quantized_rows_on_error",
               Proof("mutant.dma_drops_quantized_rows",
                     lambda: dma_harness(quant, DmaDir.LOAD, dma=_DropsRowsOnError),
                     mode="bmc", depth=quant_load_depth(quant).cycles, cover_depth=1,
                     covers=False, script=_cut_expander(False)),
               "dma.vmem_write.valid_held"),
        Mutant("soft_reset_mid_burst",
               Proof("mutant.soft_reset_mid_burst",
                     lambda: dma_harness(c, DmaDir.STORE, soft_reset=True, soft=_ResetMidBurst),
                     mode="bmc", depth=10, cover_depth=1, covers=False, script=CUT_DMA),
               "dma.soft_reset.drained"),
        Mutant("soft_reset_mid_burst_load",
               Proof("mutant.soft_reset_mid_burst_load",
                     lambda: dma_harness(c, DmaDir.LOAD, soft_reset=True, soft=_ResetMidBurst),
                     mode="bmc", depth=10, cover_depth=1, covers=False, script=CUT_DMA),
               "dma.soft_reset.drained"),
        Mutant("controller_ignores_a_token",
               Proof("mutant.ctrl_ignores_token", lambda: controller_harness(vpu),
                     mode="bmc", depth=8, cover_depth=1, covers=False, script=ignore_token),
               ".pop_available"),
        Mutant("array_weight_lane_a_cycle_early",
               Proof("mutant.array_early_weights",
                     lambda: array_harness(c.rows, c.cols, c.mac_stages,
                                           max(2, c.weight_rows_per_cycle),
                                           array=_EarlyWeightArray),
                     mode="bmc", depth=14, cover_depth=1, covers=False, script=CUT_MAC),
               # (The staggered lemmas fail with it, in the same step: row 1's
               # load, a tap early, writes a shadow register still full.)
               ".no_overwrite"),
        Mutant("array_tile_admitted_a_row_early",
               Proof("mutant.array_early_tile",
                     lambda: array_harness(c.rows, c.cols, 2, 1, array=_EarlyTileArray),
                     mode="bmc", depth=14, cover_depth=1, covers=False, script=CUT_MAC),
               # (The induction lemmas are asserted too and fail first: a switch
               # marker on its way to row 1 finds that row neither written nor next.)
               "array.inv.marker"),
        Mutant("compute_completes_every_row",
               Proof("mutant.compute_completes_every_row",
                     lambda: compute_harness(compute, engine=_CompletesEveryRow),
                     # (A MATMUL's first result comes out after the array's
                     # latency: the compute proof's cover depth.)
                     mode="bmc", depth=compute_depth, cover_depth=1, covers=False,
                     script=CUT_COMPUTE),
               # (The lemma tying the MATMULs open to the rows marked last
               # fails first, in the cycle after the first early completion.)
               "compute.inv.open"),
        Mutant("vector_every_row_last",
               Proof("mutant.vector_every_row_last",
                     lambda: vector_harness(vpu, reader=_EveryRowLast),
                     mode="bmc", depth=6, cover_depth=1, covers=False),
               # (The lemma tying the VECTORs in flight to the rows marked last
               # fails first, as a second row marked last enters the pipeline.)
               "vector.inv.in_flight"),
        Mutant("regs_slverr_for_prog_len",
               Proof("mutant.regs_bresp", lambda: regs_harness(c), mode="bmc", depth=4,
                     cover_depth=1, covers=False,
                     script=("flatten", "cd top",
                             # B answers SLVERR whatever the address.
                             r"connect -unset \dut.bus__bresp",
                             r"connect -set \dut.bus__bresp 2'b10", "cd ..")),
               "regs.host.bresp_map"),
    ]
