"""The matmul compiler: a list of `MatmulOp` becomes one chip program
(docs/compiler.md). Pure: configuration and operand descriptors in, `Program`
out; no chip, no data.

Schedule. Each op is cut by `plan_op`; its steps run

    for M block: for group of G N tiles: for t in K tiles: for j in group:
        LOADW W(t, j); MATMUL A(block, t) -> C(block, j)

and the steps of all ops of a *segment* form one stream, numbered n. Weight
tiles live in a ring of W VMEM slots shared by the segment; the loads of step
n + W are issued after step n, so that loading overlaps computing, also across
ops. Tokens (docs/isa.md), every push before its pop in program order:

* load -> compute: the last load of step n pushes; LOADW n pops;
* compute -> load: MATMUL n pushes; the first load of step n + W pops (the ring
  slot it refills, and any activation or bias buffer, was last read by step n
  or earlier);
* compute -> store: the MATMUL of the last K tile pushes; its STORE pops;
* store -> compute: the last STORE of a group pushes; the first MATMUL of the
  group two later (which reuses its output buffer) pops.

Ops of one segment get disjoint on-chip regions. A new segment starts when the
next op does not fit beside the others, or reads what an earlier op of the
segment writes; between segments a barrier (STORE -> compute SYNC -> load SYNC)
drains the chip, and the token pipeline starts afresh.

Loops. The steps of a group's middle K tiles repeat with addresses that move by
a constant stride: they become a LOOP (`Program.loop`), and runs of groups
that repeat with a constant stride become a LOOP around those. So a
program's size grows with the number of M blocks, not with M*K*N.
"""

import bisect
import collections
import itertools
import math
from dataclasses import dataclass, replace

from mxu.hdl.isa import INSTR_BITS, Deps, Engine, Opcode, SeedMode, SyncFlags, field_value

from .operands import MatmulOp
from .plan import (MAX_GROUP, ceil_div, chunk_tiles, lead, plan_op, ring_rows, ring_shared,
                   strip_chunks, unit_tiles)
from .program import Program
from .epilogue import Epilogue, FusedGroups, Pending, epilogue_param_loads, is_vector
from .handoff import Preload, plan_handoffs
from .layerops import layer_op
from .vector import tree_order
from .vectorop import VectorOp, emit_vector_op

__all__ = ["CompiledProgram", "compile_matmuls", "plan_segments"]

_MASK = (1 << INSTR_BITS) - 1
# Vector rows of earlier epilogues a fused segment's LOOP may hold back, in
# command queues of `rows`-row VECTORs (measured on SmolLM2's layers: 1 and
# 16 leave a decode step or a prefill a few per cent slower, docs/compiler.md).
_DRAIN_QUEUES = 4
TAIL_CUT = 4
# Cycles a quantized LOAD takes besides its beats when it follows another
# (docs/memory.md, "Quantized loads": none, its bursts go out while the one
# before it streams; 28 alone): the pace of a group's loads (`_Segment._units`).
# 29 (a LOAD alone, before the overlap) gave Q4_1 576x1536 at M = 1 39,472
# cycles against 39,398, Q8_0 65,443 against 64,490 (bench/quant.py).
_QUANT_LOAD_START = 0
# Cycles a step of a block of few rows takes besides its weight port's
# beats: at M = 1 a LOADW/MATMUL pair issues every `weight_load_cycles` + 1
# (9 on the 16x16 presets). The pace of a bus-bound group's loads counts it:
# at 8 cycles a step a Q4_1 unit of 6 tiles (60 beats) came every 8 steps,
# 72 cycles, and the bus idled (docs/compiler.md, "Paced loads"). (At M = 16
# a step is the block's 16 rows: the logits at batch 16, Q8_0, lost 127
# cycles with 17.)
_STEP_GAP = 1
# K tiles of a round of chunks (one chunk of each strip) of a quantized group
# wider than `MAX_GROUP` (`_Segment._units`): 6-tile chunks for SmolLM2's 36
# N tiles. At batch 1 chunks of 18 (24 for K = 1536) cost its output
# projection and FFN 142,182 cycles a layer, of 6 136,516, of 4 137,780 (the
# program's LOADs), of 12 138,161; at batch 16 219,058, 208,362, 207,217,
# 212,626.
WIDE_ROUND = 256
# Where a wide group's loads go when the bus is the bound (`_Segment._units`):
# at one of this many evenly spaced steps of a t row, so that the row's
# LOADW/MATMUL pairs loop between them. One Q4_1 layer at batch 1, the output
# projection and FFN: 135,978 cycles with the loads anywhere (8,910 program
# beats), 135,587 at 2 places a row (6,708), 135,566 at 3 (7,007), 135,802
# at 4, 138,077 at 1 (the row's loads at once held up the fetch).
ROW_PARTS = 3
# Loads of the next segment's weights (`_Segment.prefetch`) that may wait in
# the load engine's queue for the bus after this segment's last step.
_PREFETCH_QUEUED = 6
# The most instructions of an inner LOOP's body `_compress` makes.
_WIDEST = 16


@dataclass(frozen=True)
class _Ring:
    """The accumulator rows a fused segment's ops share: `buffers` output
    slots of `slot` rows (and as many residual slots of `res_slot` rows), used
    by the segment's groups in turn, and the vector unit's working rows."""
    buffers: int
    slot: int
    res_base: int
    res_slot: int
    scratch_base: int
    rows: int            # all of it
    t_base: int = 0      # VMEM row of a transpose epilogue's slots
    t_slot: int = 0      # VMEM rows of one
    out_base: int = 0    # accumulator row of the output slots
    interleave: int = 1  # groups whose epilogues run interleaved (`_interleave`)
    scratch_rows: int = 0  # working rows of one of them


@dataclass(frozen=True)
class _Placed:
    """An op of a segment with its plan and on-chip regions."""
    op: MatmulOp
    plan: object
    a_base: int          # VMEM row of its activation buffers
    out_base: int        # accumulator row of its output buffers (a fused segment's ring)
    bias_base: int       # accumulator row of its bias blocks or bias rows
    ep_base: int         # accumulator row of its epilogue's parameters
    ring: _Ring = None   # a fused segment's shared rows
    handed: bool = False # its activations are a `Handoff`'s region (a_base), not loaded
    weights: object = None   # the `Handoff` whose region holds its weights, or None
    residual: object = None  # the `Handoff` whose accumulator rows hold its residual, or None
    handoffs: tuple = () # the (`Handoff`, `Source`) pairs its epilogue writes
    unstored: tuple = () # outputs that stay on the chip only
    table_base: int = None   # accumulator row of a table it loads once (`_held_table`)


@dataclass(frozen=True)
class _Group:
    """One group of one op: G N tiles of one M block, every K tile."""
    index: int           # in the segment
    op: int              # index into the segment's ops
    g: int               # in the op
    mb: int
    m0: int
    mrows: int
    j0: int
    size: int            # N tiles in this group
    start: int           # segment step of (t = 0, j = j0)
    first_of_block: bool
    first_of_op: bool
    KT: int
    row: int = 0         # steps from one of its t rows to the next (a bundle's: more than size)
    # Chunked (docs/compiler.md, "Norm chunks"): its N tiles in chunks of
    # the sizes `chunk`, in the order `order`, each chunk's every K tile
    # before the next chunk; (): every t row across all its tiles.
    chunk: tuple = ()
    order: tuple = ()

    @property
    def end(self):
        return self.start + (self.KT - 1) * (self.row or self.size) + self.size

    @property
    def chunks(self):
        """The N tiles (jj) of each chunk, in step order."""
        bounds = list(itertools.accumulate(self.chunk, initial=0))
        return [self.order[a:b] for a, b in zip(bounds, bounds[1:])]

    def place(self, jj):
        """(chunk, position in it) of N tile jj of a chunked group."""
        pos = self.order.index(jj)
        for c, n in enumerate(self.chunk):
            if pos < n:
                return c, pos
            pos -= n
        raise ValueError(f"N tile {jj} is not in the group")

    def span(self, c):
        """(first step, step past the last) of chunk c."""
        first = self.start + sum(self.chunk[:c]) * self.KT
        return first, first + self.chunk[c] * self.KT

    def step_of(self, t, jj):
        """The segment step of (K tile t, N tile jj)."""
        if not self.chunk:
            return self.start + t * (self.row or self.size) + jj
        c, pos = self.place(jj)
        return self.span(c)[0] + t * len(self.chunks[c]) + pos


@dataclass(frozen=True)
class CompiledProgram:
    """A program and how it was made."""
    program: Program
    segments: tuple      # tuple of tuples of (op index, OpPlan)
    steps: int           # MATMUL steps in all segments
    preloads: int = 0    # weight tiles loaded by a segment before their op's (`Preload`)

    @property
    def macs(self):
        return sum(plan.M * plan.K * plan.N for seg in self.segments for _, plan in seg
                   if plan is not None)


def plan_segments(config, ops, handoffs=None, first=0):
    """[(segment, [placed op])]: ops in order, cut into segments of ops whose
    regions fit side by side and that do not read each other's results. Ops
    with an epilogue (fused) and without never share a segment. `handoffs`:
    the program's `Handoffs`, `first` the program index of ``ops[0]``."""
    segments, current = [], []

    def build(i, op, strict=True):
        """The segment item of op i, or (not `strict`) None if it does not fit."""
        ep = op.epilogue
        limit, acc_limit = config.vmem_rows, config.acc_rows
        handed = weights = residual = fixed = None
        if handoffs is not None:
            limit, acc_limit = handoffs.limits[first + i], handoffs.acc_limits[first + i]
            handed, weights, residual = (handoffs.to(first + i, x) for x in ("a", "b", "other"))
            fixed = handoffs.plan(first + i)
        ring = ring_rows(config, op)
        plan = fixed or plan_op(config, op.M, op.K, op.N, op.bias_kind, **op.plan_args(config),
                                vmem_rows=limit - ring, acc_rows=acc_limit)
        if plan is None and not strict:
            return None
        if plan is None:
            KT, room = ceil_div(op.K, config.rows), config.vmem_rows - ring
            why = (f"one activation row needs {KT} VMEM rows and {room} are free beside the "
                   f"weight ring; split K" if KT > room else
                   f"a {ep.kind} epilogue (a row operand per group) needs more than "
                   f"{lead(op, config)} steps (K tiles x N tiles) per group"
                   if ep and ep.desc.row_operand is not None
                   and KT * ceil_div(op.N, config.cols) <= lead(op, config) else
                   f"its output, bias and epilogue buffers need more than the {config.acc_rows} "
                   f"accumulator rows")
            raise ValueError(f"op {i}: a {op.M}x{op.K} @ {op.K}x{op.N} matmul does not fit the "
                             f"chip: {why}")
        outs = ()
        if handoffs is not None:
            outs = (tuple(handoffs.of(first + i)),
                    tuple(w for w in op.writes if handoffs.keeps(first + i, w)))
        out_base = handoffs.out_base(first + i) if handoffs is not None else None
        return (i, op, plan, (limit, acc_limit, out_base), handed, outs, (weights, residual))

    def joins(item):
        """Whether `item` goes into the current segment."""
        i, op, weights = item[0], item[1], item[6][0]
        depends = any(r.overlaps(w) for _, o, *_ in current for w in o.writes for r in op.reads)
        # A producer whose output buffers a later op reads in place has a
        # segment of its own (the buffers' layout is its alone).
        solo = handoffs is not None and (handoffs.out_base(first + i) is not None or any(
            handoffs.out_base(first + c[0]) is not None for c in current))
        # Ops of one segment share the weight ring's lead (`lead`): their
        # plans space their buffers for it.
        return not (depends or solo or (op.epilogue is None) != (current[0][1].epilogue is None)
                    or lead(op, config) != lead(current[0][1], config)
                    or not ring_shared(config, [c[1] for c in current if c[6][0] is None]
                                       + ([op] if weights is None else []))
                    or not _place(config, current + [item]))

    for i, op in enumerate(ops):
        op.check(config)
        item = build(i, op)
        if (current and op.epilogue is None and op.quantized
                and current[-1][1].epilogue is not None and current[-1][1].quantized
                and (handoffs is None or handoffs.plan(first + i) is None)):
            # A plain op of quantized weights after a fused one joins its
            # segment, if it fits, with an epilogue that only copies (the
            # same STOREs): its loads then run under the fused op's last
            # epilogue instead of after a barrier (a decode step's V after
            # K, docs/compiler.md).
            fused = build(i, replace(op, epilogue=Epilogue("copy")), strict=False)
            if fused is not None and joins(fused):
                item = fused
        if current and not joins(item):
            segments.append(_place(config, current))
            current = []
        current.append(item)
    if current:
        segments.append(_place(config, current))
    return segments


def _place(config, items, hold_tables=True):
    """[(op index, _Placed)] of (op index, op, plan, VMEM limit, hand-off in,
    hand-offs out) items side by side, or None if they do not fit. Plain ops
    get regions of their own; a fused segment's ops share a `_Ring` of output,
    residual and working rows, and an op's table gets rows of its own when
    they fit (`hold_tables`, `_held_table`). An op whose activations are
    handed off (docs/compiler.md) reads them where the hand-off put them,
    one that reads an earlier op's activations reads that op's buffer
    (`_shared_activations`)."""
    limit = min(item[3][0] for item in items)
    acc_limit = min(item[3][1] for item in items)
    ring = max(ring_rows(config, item[1]) for item in items)
    owner = _shared_activations(items)
    vmem = ring + sum(item[2].vmem_rows for n, item in enumerate(items)
                      if not item[4] and owner[n] is None)
    a_base, bases = ring, {}

    def placed_op(i, op, plan, handed, outs, operands, *regions, table_base=None):
        nonlocal a_base
        n = len(bases)
        base = handed.base if handed else bases.get(owner[n], a_base)
        bases[n] = base
        if not handed and owner[n] is None:
            a_base += plan.vmem_rows
        pairs, unstored = outs or ((), ())
        return i, _Placed(op, plan, base, *regions, handed=bool(handed) or owner[n] is not None,
                          handoffs=pairs, unstored=unstored, weights=operands[0],
                          residual=operands[1], table_base=table_base)

    if items[0][1].epilogue is None:
        placed, acc = [], 0
        for i, op, plan, _, handed, outs, operands in items:
            placed.append(placed_op(i, op, plan, handed, outs, operands, acc, acc + plan.out_rows,
                                    0))
            acc += plan.acc_rows
    else:
        plans = [item[2] for item in items]
        k = _interleave(plans)
        # k groups wait for each other's epilogue: 2k buffers keep the array busy meanwhile.
        buffers = max(min(p.out_buffers for p in plans), 2 * k)
        slot = max(p.G * p.Mb for p in plans)
        res_slot = max(p.residual_rows for p in plans)
        # The output slots come first, or at `out_base` when a later op reads
        # them there (an in-place residual: the segment has only that op).
        out_base = items[0][3][2]
        res_base = buffers * slot if out_base is None else 0
        scratch_base = res_base + buffers * res_slot
        scratch_rows = max(p.scratch_rows for p in plans)
        acc = scratch_base + k * scratch_rows
        t_slot = max(p.t_rows for p in plans)
        ring = _Ring(buffers, slot, res_base, res_slot, scratch_base, acc, vmem, t_slot,
                     out_base or 0, k, scratch_rows)
        if out_base is not None and out_base + buffers * slot > config.acc_rows:
            return None
        vmem += buffers * t_slot
        placed = []
        for i, op, plan, _, handed, outs, operands in items:
            bias_rows = plan.NT if plan.bias == "row" else 0
            held = hold_tables and _held_table(op, plan, operands)
            table = acc + bias_rows + plan.param_rows if held else None
            placed.append(placed_op(i, op, plan, handed, outs, operands, 0, acc, acc + bias_rows,
                                    ring, table_base=table))
            acc += bias_rows + plan.param_rows + (plan.residual_rows if table is not None else 0)
    acc_limit = min(acc_limit, items[0][3][2] or acc_limit)
    if vmem <= limit and acc <= acc_limit:
        return placed
    # Tables held once are a saving, not a need: without them the ops may fit.
    return _place(config, items, hold_tables=False) if hold_tables else None


def _activation_key(op):
    a = op.a
    return a.addr, a.rows, a.cols, a.stride, a.dtype


def _shared_activations(items):
    """For each item of a segment, the index of an earlier item whose
    activation buffer it reads instead of loading its own, or None: both
    read the same activations, neither is handed them, and both plans hold
    them in one M block (the buffer is the whole operand, in the same
    layout). The owner's steps come first (a segment's groups run op by op;
    not in a bundle of interleaved groups, `_interleave`), so each K tile's
    LOAD is awaited by the owner's MATMUL before any reader's. A decode
    step's K, V and Q projections read one normalized x: it is loaded once,
    not three times (docs/compiler.md, "Shared activations")."""
    owner, first = [None] * len(items), {}
    if items[0][1].epilogue is not None and _interleave([item[2] for item in items]) > 1:
        return owner
    for n, (_, op, plan, _, handed, *_) in enumerate(items):
        if handed or plan.blocks != 1:
            continue
        key = _activation_key(op)
        if key in first:
            owner[n] = first[key]
        else:
            first[key] = n
    return owner


def _held_table(op, plan, operands):
    """Whether a fused op's table (RoPE's cos|sin) is loaded once, into rows
    of its own, rather than into each group's residual slot: when it has one
    M block, every group reads the same table, and the slots' turn made
    each group of ``buffers`` load it again (8 KB a group for SmolLM2's Q)."""
    ep = op.epilogue
    return (ep is not None and ep.desc.row_operand == "table" and plan.blocks == 1
            and operands[1] is None)


# A softmax on at most this many rows per group is latency-bound: each of its
# dependent passes waits for the vector unit's whole pipeline (docs/compiler.md).
_SHORT_SOFTMAX_ROWS = 4
# Groups of such softmaxes interleaved. One layer of SmolLM2's file at batch
# 16 on 16 cached positions (KV cache tiles preloaded, `Preload`), the
# attention program: 69,617 cycles with 2, 68,872 with 3, 67,907 with 4,
# 69,333 with 8.
_SOFTMAX_BUNDLE = 4


def _interleave(plans):
    """Groups of a fused segment whose epilogues run interleaved, pass by pass,
    and whose steps interleave t row by t row (`_Segment._bundle`):
    `_SOFTMAX_BUNDLE` for a softmax over a few rows (a decode step's
    attention scores), where one group's chain of dependent passes leaves
    the vector unit's pipeline mostly empty, and its chain of K tiles the
    array; else 1."""
    short = all(p.epilogue is not None and layer_op(p.epilogue).chained
                and p.Mb <= _SHORT_SOFTMAX_ROWS for p in plans)
    return (_SOFTMAX_BUNDLE if short and sum(p.blocks * p.groups_per_block for p in plans) > 1
            else 1)


def _merge_epilogues(programs):
    """One program of several groups' epilogues (each: its VECTORs, then
    STOREs and SYNCs): their VECTORs interleaved -- the first ones in group
    order, then one of each in turn, then the last ones in group order, so
    that the tokens each first pops and each last pushes stay in order --
    then each group's STOREs and SYNCs in group order."""
    heads, tails = [], []
    for prog in programs:
        items = list(zip(prog.words, prog.text))
        n = 0
        while n < len(items) and is_vector(items[n][0]):
            n += 1
        if any(is_vector(word) for word, _ in items[n:]) or n < 2:
            raise AssertionError("an interleaved epilogue is its VECTORs, then STOREs and SYNCs")
        heads.append(items[:n])
        tails.append(items[n:])
    order = [h[0] for h in heads]
    middles = [h[1:-1] for h in heads]
    for i in range(max(len(m) for m in middles)):
        order += [m[i] for m in middles if i < len(m)]
    order += [h[-1] for h in heads]
    for tail in tails:
        order += tail
    merged = Program()
    merged.words += [word for word, _ in order]
    merged.text += [text for _, text in order]
    return merged


class _Segment(FusedGroups):
    """The step stream of one segment and the instructions of each step."""

    def __init__(self, config, placed, last):
        self.config = config
        self.placed = placed
        self.last = last
        self.groups = []
        for k, p in enumerate(placed):
            plan = p.plan
            g = 0
            for mb in range(plan.blocks):
                m0 = mb * plan.Mb
                for j0, size in plan.groups_of_block(last=mb == plan.blocks - 1):
                    start = self.groups[-1].end if self.groups else 0
                    grp = _Group(len(self.groups), k, g, mb, m0, min(plan.Mb, plan.M - m0), j0,
                                 size, start, j0 == 0, g == 0, plan.KT)
                    self.groups.append(grp)
                    g += 1
        self.bundles = self._bundle(placed[0].ring)
        for i, grp in enumerate(self.groups):
            chunk = self._norm_chunk(grp)
            if chunk:
                self.groups[i] = replace(grp, chunk=chunk, order=tuple(tree_order(grp.size)))
        self.starts = [grp.start for grp in self.groups]
        # Step -> (group, t, jj) of bundled groups, whose steps interleave,
        # and of chunked ones.
        self.where = {grp.step_of(t, jj): (grp, t, jj)
                      for grp in self.groups if grp.row or grp.chunk for t in range(grp.KT)
                      for jj in range(grp.size)}
        self.steps = max(grp.end for grp in self.groups)
        self.W = min(lead(placed[0].op, config), self.steps)
        # The slot of the weight ring its first unit takes (`rotate`).
        self.ring_start = 0
        self.units = self._units()
        self.ring = placed[0].ring
        self.fused = self.ring is not None
        self.buffers = self.ring.buffers if self.fused else 2   # output buffers in flight
        # Each fused group's VECTORs and STOREs, waiting to be spread over the
        # next group's steps (`waiting`: those of the groups interleaved with
        # ones still to come).
        self.pending = collections.deque()
        self.waiting = []
        # The next segment's first batches this one loads (`prefetch`):
        # (MATMUL x whose token the first waits for, that segment,
        # {step: the loads issued after its MATMUL}), or None.
        self.prefetch_into = None
        self.hoisted = {}          # {batch: its first units the segment before loads}
        self.preload_at = {}       # {step: the `Preload` LOADs issued after its MATMUL}

    def _norm_chunk(self, grp):
        """The sizes of group `grp`'s chunks of N tiles, or () (not chunked): an
        add_rms_norm's group of every N tile, of quantized weights, whose
        t rows go without outer LOOPs (`_rows_only`: a batch-16 decode
        step's output and down projections). Its chunks end one after
        another, and each chunk's tiles are added and squared while the
        array goes on (`FusedGroups.norm_part`): the norm's tail is then
        the last chunk's, not the whole row's (docs/compiler.md, "Norm
        chunks")."""
        p = self.placed[grp.op]
        op = p.op
        if p.ring is None or op.epilogue is None or op.epilogue.kind != "add_rms_norm" \
                or not op.quantized or p.weights is not None or op.transposed \
                or grp.size <= MAX_GROUP or grp.size < p.plan.NT or grp.KT < 2 \
                or not self._rows_only(grp):
            return ()
        # The last chunk as short as the array's latency allows (`hide`
        # tiles a t row), the one before it twice that, the rest first:
        # 24, 8 and 4 of SmolLM2's 36 tiles (two file layers at batch 16:
        # 549,882 cycles; 12, 12, 12: 552,303; 12, 12, 8, 4: 550,176;
        # 28, 4, 4: 550,660; chunks of 2 left the array waiting).
        hide = p.plan.hide
        if grp.size < 4 * hide:
            return ()
        return (grp.size - 3 * hide, 2 * hide, hide)

    def _bundle(self, ring):
        """Interleave the steps of each `_Ring.interleave` groups whose
        epilogues run interleaved (a decode step's heads: `_interleave`), t
        row by t row: a group's t rows are chains (MATMUL t + 1 of an N tile
        seeds from MATMUL t's rows, which the array issues only once those
        are written), and one head's 2 N tiles of 3 rows left the array
        waiting for its own results. {index of a bundle's first group:
        (its first step, the step past its last)}."""
        k = ring.interleave if ring is not None else 1
        if k < 2 or any(p.op.quantized for p in self.placed):
            return {}
        out, groups, n, i = {}, self.groups, 0, 0
        while i < len(groups):
            size, KT = groups[i].size, groups[i].KT
            m = 1
            while m < k and i + m < len(groups) and (groups[i + m].size,
                                                      groups[i + m].KT) == (size, KT):
                m += 1
            for x in range(m):
                groups[i + x] = replace(groups[i + x], start=n + x * size, row=m * size)
            out[i] = (n, n + m * size * KT)
            n, i = n + m * size * KT, i + m
        return out

    def _units(self):
        """Quantized weights: {(group, jj, first K tile): VMEM row} of each
        unit (a chunk of `chunk_tiles` K tiles of one strip, one quantized
        LOAD), in a ring of U units from row 0, and `placed_units`, {step:
        [(group, jj, first K tile, tiles)]}: the batch that loads each unit
        (docs/compiler.md, "Quantized weights"). A unit is loaded as early as
        the pace of the loads allows: one every unit's tiles in steps,
        counted back from the last unit's first step (so that the bus is
        never idle while the array reads a group's chunk, and the next
        chunk's loads keep within the lead), never before its slot is free
        (``W`` steps after the last step that read the slot's previous unit),
        never after its first step. U: the most slots the ring has, a
        multiple of every group's size if it can be."""
        cfg, units, sizes = self.config, [], set()
        self.placed_units, self.chunk_of, self.chunk, self._early_raw = {}, {}, {}, []
        self._early, self._early_targets, self._planned = {}, set(), False
        quantized = [p for p in self.placed if p.op.quantized and p.weights is None]
        if quantized:
            most = max(chunk_tiles(cfg, p.op) for p in quantized)
            size = self.slot_rows = most * cfg.rows
            cap = max(ring_rows(cfg, p.op) for p in quantized) // size
        for grp in self.groups:
            p = self.placed[grp.op]
            if not p.op.quantized or p.weights is not None:
                continue
            # The segment's last group ends the loads: what the array does
            # after its last chunk arrives is the segment's tail, so its
            # chunks are shorter -- also when it is the segment's only group
            # (SmolLM2's V projection), not when it is a wide group of two
            # or three (its own rule below).
            last = grp.index == len(self.groups) - 1 and (grp.index >= 3 or grp.size <= MAX_GROUP)
            top = max(1, most // TAIL_CUT) if last else most
            unit = unit_tiles(cfg, p.op.b)
            if grp.size > MAX_GROUP:
                # A row-wise epilogue's group of every N tile: its first t row
                # waits for the first chunk of every strip, and after the bus
                # is done the array goes through the last chunk of every
                # strip. Chunks of `WIDE_ROUND` tiles over the group's strips
                # keep both short (such units share ring slots, `_ring_places`).
                # Their loads are paced by the bus, as the last group's are.
                c = top = max(unit, min(top, WIDE_ROUND // grp.size) // unit * unit)
            else:
                c = chunk_tiles(cfg, p.op, grp.size, cap, top)
            self.chunk[grp.index] = c
            chunks = strip_chunks(grp.KT, c, unit)
            if grp.size > MAX_GROUP and grp.index == len(self.groups) - 1 and len(chunks) > 1 \
                    and not grp.chunk:
                # The array goes through the last round after the bus is
                # done: in chunks of one unit, that tail is short.
                t0, n = chunks.pop()
                chunks += [(t, min(unit, t0 + n - t)) for t in range(t0, t0 + n, unit)]
            self.chunk_of[grp.index] = {t: t0 for t0, n in chunks for t in range(t0, t0 + n)}
            sizes.add(grp.size)
            # The last group's loads, paced by the steps the array takes while
            # the bus brings each (at batch 1 a step, a tile's weights at two
            # rows a cycle, is shorter than the tile's beats plus its LOAD's
            # start): counted back from its last chunk, they start early
            # enough to keep the bus busy. (The other groups' loads queue on
            # a busy bus anyway; paced so, their LOOPs lost their regularity.)
            beats = p.op.b.tile_beats(cfg.rows, cfg.axi_data_bytes)
            step = max(grp.mrows, cfg.weight_load_cycles + _STEP_GAP)
            for t0, n in chunks:
                # (Steps, not whole: a Q4_1 unit of 2 tiles takes 20 beats,
                # 2.2 steps; at 3 the bus idled a third of the time. A wide
                # group's take whole steps: the output projection and FFN
                # were 311 cycles slower at batch 1 with fractions, the
                # attention 519 faster, one Q4_1 layer of SmolLM2's sizes.)
                pace = (max(n, (n * beats + _QUANT_LOAD_START) / step)
                        if top < most else n)
                if grp.size > MAX_GROUP:
                    pace = math.ceil(pace)
                for jj in range(grp.size):
                    units.append(((grp.index, jj, t0, n), grp.step_of(t0, jj),
                                  grp.step_of(t0 + n - 1, jj), pace))
        # In the order the array reads them (a chunked group's chunk by chunk).
        units.sort(key=lambda unit: unit[1])
        # Groups of quantized weights whose bus is the bound (a step shorter
        # than a tile's beats).
        bus_bound = {g.index for g in self.groups if self.placed[g.op].op.quantized
                     and g.mrows < self.placed[g.op].op.b.tile_beats(cfg.rows,
                                                                     cfg.axi_data_bytes)}
        self.U = 0
        if not units:
            return {}
        whole = math.lcm(*sizes)
        self.U = U = cap // whole * whole or cap
        rows = self._ring_places(units, U, most, self.ring_start)
        at = [0] * len(units)
        at[-1] = units[-1][1]
        for u in range(len(units) - 2, -1, -1):
            at[u] = min(units[u][1], at[u + 1] - units[u][3])
        at = [math.floor(a) for a in at]
        # The steps after which each tile of the ring is free: W after the
        # last step that read the unit there before.
        free = [0] * (U * most)
        for u, (key, _, last, _) in enumerate(units):
            tile = rows[u] // cfg.rows
            least = max(0, at[u - 1] if u else 0, *free[tile:tile + key[3]])
            grp = self.groups[key[0]]
            if u and grp.index == len(self.groups) - 1 and grp.size <= MAX_GROUP \
                    and grp.index in bus_bound and grp.mrows <= cfg.weight_load_cycles:
                # The segment's last group, when the bus is the bound and a
                # step is the weight port's: its loads follow the ones before
                # at their pace as soon as their slots are free, not counted
                # back from its last chunk (at a pace of more steps than the
                # bus takes, that left the bus idle for ~2,300 cycles before
                # the FFN's last group at M = 1; at M = 16 the Q8_0 logits
                # were 104 cycles slower so).
                at[u] = min(at[u], max(least, at[u - 1] + math.ceil(units[u - 1][3])))
            if grp.size > MAX_GROUP and at[u] > grp.start and grp.index in bus_bound \
                    and not grp.chunk:
                # A wide group's loads, when the bus is the bound, go at one
                # of `ROW_PARTS` places of a t row (earlier, as their slots
                # allow): loads anywhere in a row cut its LOADW/MATMUL pairs
                # into short runs, spelled out in the program the bus also
                # carries.
                at[u] = max(least, at[u] - (at[u] - grp.start) % (grp.size // ROW_PARTS))
            at[u] = max(at[u], least)
            free[tile:tile + key[3]] = [last + self.W] * key[3]
            if at[u] > units[u][1]:
                raise AssertionError(f"quantized weight units need more than the {cap} slots "
                                     f"reserved (plan.quant_units)")
            if at[u] < self.W or at[u] == units[u][1]:
                self.placed_units.setdefault(at[u], []).append(units[u][0])
            else:
                # Issued after MATMUL at[u] - W, awaited by the LOADW of its
                # first step, not by LOADW at[u] (`_early_plan`).
                self._early_raw.append((at[u] - self.W, units[u][0], units[u][1]))
        return {key[:3]: rows[u] for u, (key, *_) in enumerate(units)}

    def _ring_places(self, units, U, most, start=0):
        """The VMEM row of each unit: each takes the next of the U slots of
        `most` tiles, but a unit of at most half a slot (the segment's last
        group's short chunks) shares its slot with the next ones that fit:
        the last group's chunks then wait for as many slots as a group of
        whole chunks, not four times as many (the ones the group before is
        still reading). The first unit takes slot `start` (`rotate`)."""
        rows, slot, used = [], start - 1, most
        for key, *_ in units:
            n = key[3]
            if not (2 * n <= most and used + n <= most):
                slot, used = (slot + 1) % U, 0
            rows.append((slot * most + used) * self.config.rows)
            used = used + n if 2 * n <= most else most
        return rows

    def turned(self, row, turn):
        """VMEM row `row` of the weight ring with the ring turned by `turn`
        more slots (`rotate`)."""
        span = self.slot_rows
        return ((row // span + turn) % self.U) * span + row % span

    def rotate(self, turn):
        """Let the weight ring's first unit take slot `turn` (the others
        follow it round the ring), so that the units the segment before
        loads for this one (`prefetch`) can land in rows it has done with."""
        self.ring_start = turn
        for cache in ("_loads", "_reads", "_last", "_read_of"):
            self.__dict__.pop(cache, None)
        self.units = self._units()

    def _early_plan(self):
        """{MATMUL e: [[unit, LOADW it pushes to, or None]]} of the units
        issued early, after MATMUL e: each is awaited at its first step, or
        earlier when a batch issued after it has loads for an earlier step
        (the load->compute tokens are counted: the pushes, in the order the
        load engine completes them, must go to LOADWs in program order).
        Units whose pushes would go to one LOADW push once, the last."""
        if self._planned or not self._early_raw:
            return self._early
        self._planned = True
        W, early, order = self.W, {}, []
        regular = [n for n in range(W, self.steps) if self._batch_loads(n)]
        for e, key, first in self._early_raw:
            i = bisect.bisect_right(regular, e + W)
            target = min(first, regular[i] - 1 if i < len(regular) else first)
            if target == e + W and self._batch_loads(target):
                self.placed_units.setdefault(target, []).append(key)   # one batch
                self.__dict__["_loads"].pop(target)
                continue
            item = [key, target]
            early.setdefault(e, []).append(item)
            order.append(item)
        for a, b in zip(order, order[1:]):
            if a[1] == b[1]:
                a[1] = None
        self._early = early
        self._early_targets = {t for _, t in order if t is not None}
        self._check_tokens()
        return early

    def _check_tokens(self):
        """The load engine's pushes go to LOADWs in program order (the order
        their loads complete in), each LOADW's once."""
        targets = []
        for n in range(self.W + self.steps):
            if n < self.steps and self._batch_loads(n):
                targets.append(n)
            targets += [t for _, t in self._early.get(n - self.W, ()) if t is not None]
        if any(a >= b for a, b in zip(targets, targets[1:])):
            raise AssertionError("quantized weight loads push out of order")

    def loop_period(self, grp):
        """A LOOP of quantized weights spans ``lcm(G, chunk_tiles)`` steps:
        its t rows and its loads (one every chunk's tiles in steps) line up
        again (they use no bf16 ring slot)."""
        if grp.index in self.chunk:
            return math.lcm(grp.size, self.chunk[grp.index])
        return super().loop_period(grp)

    # ---- where step n is --------------------------------------------------------------
    def locate(self, n):
        if n in self.where:
            return self.where[n]
        grp = self.groups[bisect.bisect_right(self.starts, n) - 1]
        t, jj = divmod(n - grp.start, grp.size)
        return grp, t, jj

    # ---- instructions ---------------------------------------------------------------
    def a_row(self, grp, t):
        p = self.placed[grp.op]
        return p.a_base + (grp.mb % p.plan.a_buffers) * p.plan.Mb * p.plan.KT + t * p.plan.Mb

    def out_row(self, grp, jj):
        p = self.placed[grp.op]
        if self.fused:
            return self.ring.out_base + self.ring.slot * (grp.index % self.buffers) + jj * p.plan.Mb
        return p.out_base + ((grp.g % 2) * p.plan.G + jj) * p.plan.Mb

    def bias_block_row(self, grp, jj):
        p = self.placed[grp.op]
        return p.bias_base + ((grp.g % 2) * p.plan.G + jj) * p.plan.Mb

    def batch(self, prog, n):
        """The loads step n needs: activation tile, bias, weight tile. The
        first pops the token of MATMUL n - W, the last pushes LOADW n's. A
        batch with nothing to load passes the tokens on with a load SYNC; in
        a segment of quantized weights (most of whose batches load nothing)
        it is left out, with the tokens (`_tokens`): a SYNC a step would
        fill the load engine's queue behind a long LOAD and stop the
        instructions of the array behind it (docs/compiler.md, "Quantized
        weights")."""
        loads = self.batch_rest(n)
        for i, load in enumerate(loads):
            prog.load(**load, pop_next=(i == 0 and n >= self.W), push_next=(i == len(loads) - 1))
        if n >= self.W and self.units:
            for i, (key, target) in enumerate(self._early_plan().get(n - self.W, ())):
                prog.load(**self._unit_load(*key), pop_next=i == 0 and not loads,
                          push_next=target is not None)
        if not loads and not self.units:
            # Nothing to load (activations and weights handed off): the load
            # engine passes the tokens on.
            prog.sync("load", pop_next=n >= self.W, push_next=True)

    def _tokens(self, n):
        """Whether batch n pushes a token to LOADW n and pops one of MATMUL n - W."""
        return not self.units or bool(self._batch_loads(n))

    def _loadw_pops(self, n):
        """Whether LOADW n pops a load->compute token. Of the batches whose
        weight units the segment before loaded (`prefetch`), LOADW 0 pops
        (batch 0's other loads push, or else the last of those units), the
        others only when their batch has loads left."""
        if 0 < n and n in self.hoisted and not self.batch_rest(n):
            return False
        return self._tokens(n) or n in self._early_targets

    def hoisted_loads(self):
        """[(load, its bus beats)] of the weight units the segment before
        loads (`hoisted`: {batch: how many of its units, the first})."""
        cfg, out = self.config, []
        for n, count in sorted(self.hoisted.items()):
            for key in self.placed_units[n][:count]:
                b = self.placed[self.groups[key[0]].op].op.b
                out.append((self._unit_load(*key), key[3] * b.tile_beats(cfg.rows,
                                                                          cfg.axi_data_bytes)))
        return out

    def batch_rest(self, n):
        """Batch n's loads without the weight units the segment before
        loaded (its units come last in a batch)."""
        loads = self._batch_loads(n)
        if n not in self.hoisted:
            return loads
        first = len(loads) - len(self.placed_units[n])
        return loads[:first] + loads[first + self.hoisted[n]:]

    def _matmul_pushes(self, n):
        """Whether MATMUL n pushes a compute->load token."""
        if self.prefetch_into is not None and n == self.prefetch_into[0]:
            return True
        return n + self.W < self.steps and (self._tokens(n + self.W) or n in self._early)

    def _batch_loads(self, n):
        cache = self.__dict__.setdefault("_loads", {})
        if n not in cache:
            cache[n] = self._make_loads(n)
        return cache[n]

    def _make_loads(self, n):
        cfg, (grp, t, jj) = self.config, self.locate(n)
        p = self.placed[grp.op]
        op, r, c = p.op, cfg.rows, cfg.cols
        j = grp.j0 + jj
        k_rows = min(r, op.K - t * r)
        ncols = min(c, op.N - j * c)
        loads = []
        if op.bias_kind == "row" and grp.first_of_op and t == 0 and jj == 0:
            full = op.N // c
            if full:
                loads.append(dict(acc_row=p.bias_base, ext_addr=op.bias.addr, rows=full,
                                  row_bytes=4 * c))
            if op.N % c:
                loads.append(dict(acc_row=p.bias_base + full, ext_addr=op.bias.addr + 4 * c * full,
                                  rows=1, row_bytes=4 * (op.N % c)))
        ep = op.epilogue
        if ep is not None and grp.first_of_op and n == self._param_step(p, grp):
            loads += epilogue_param_loads(ep, p.ep_base, c)
        if ep is not None and ep.desc.row_operand is not None:
            loads += self.residual_loads(n)
        whole = _one_row(p, r)
        if grp.first_of_block and jj == 0 and not p.handed and (t == 0 or not whole):
            # A one-row block of quantized weights loads its whole row with
            # its first step: a small LOAD between a t row's weight chunks
            # held the stream of quantized LOADs up.
            loads.append(dict(vmem_row=self.a_row(grp, t),
                              ext_addr=op.a.addr + grp.m0 * op.a.stride + 2 * t * r,
                              rows=op.K // r if whole else grp.mrows,
                              row_bytes=2 * (r if whole else k_rows),
                              ext_stride=2 * r if whole else op.a.stride))
        if op.bias_kind == "matrix" and t == 0:
            loads.append(dict(acc_row=self.bias_block_row(grp, jj),
                              ext_addr=op.bias.addr + grp.m0 * op.bias.stride + 4 * j * c,
                              rows=grp.mrows, row_bytes=4 * ncols, ext_stride=op.bias.stride))
        if p.weights is None and op.quantized:
            loads += [self._unit_load(*key) for key in self.placed_units.get(n, ())]
        elif p.weights is None or not p.weights.has(t, j):
            loads.append(dict(vmem_row=(n % self.W) * r,
                              ext_addr=op.b.addr + t * r * op.b.stride + 2 * j * c,
                              rows=k_rows, row_bytes=2 * ncols, ext_stride=op.b.stride))
        return loads

    def _param_step(self, p, grp):
        """The step whose batch loads op `p`'s epilogue parameters: its
        first; W steps later for a quantized op of one group a block (its
        epilogue runs at its end), so that its first batches hold weight
        units only (`prefetch`): at batch 16 the down projection's first
        MATMUL waited for its gamma's LOAD behind the barrier."""
        late = grp.start + self.W
        if p.op.quantized and p.plan.G >= p.plan.NT and late < grp.end:
            return late
        return grp.start

    def _unit_load(self, g, uj, t0, tiles):
        """The quantized LOAD of unit (group g, its N tile uj, K tiles t0 ..)."""
        ug, r = self.groups[g], self.config.rows
        b = self.placed[ug.op].op.b
        return dict(vmem_row=self.units[g, uj, t0],
                    ext_addr=b.addr + (ug.j0 + uj) * b.strip + t0 * r // b.block * b.tile,
                    rows=min(b.rows, (t0 + tiles) * r) - t0 * r, row_bytes=b.tile,
                    format=b.format)

    def step(self, prog, n):
        """Step n's LOADW and MATMUL, its STORE after the last K tile, and the
        loads of step n + W."""
        cfg, (grp, t, jj) = self.config, self.locate(n)
        p = self.placed[grp.op]
        op, plan, c = p.op, p.plan, cfg.cols
        j = grp.j0 + jj
        k_rows = min(cfg.rows, op.K - t * cfg.rows)
        if p.weights is not None and p.weights.has(t, j):
            wrow = p.weights.weight_row(t, j)
        elif op.quantized:
            t0 = self.chunk_of[grp.index][t]
            wrow = self.units[grp.index, jj, t0] + (t - t0) * cfg.rows
        else:
            wrow = (n % self.W) * cfg.rows
        prog.loadw(vmem_row=wrow, k_rows=k_rows, pop_prev=self._loadw_pops(n))
        if t > 0:
            seed, seed_row = SeedMode.ACC, self.out_row(grp, jj)
        elif op.bias_kind == "row":
            seed, seed_row = SeedMode.BIAS, p.bias_base + j
        elif op.bias_kind == "matrix":
            seed, seed_row = SeedMode.ACC, self.bias_block_row(grp, jj)
        else:
            seed, seed_row = SeedMode.ZERO, 0
        last_t = t == plan.KT - 1
        fused = op.epilogue is not None
        last_of_group = jj == grp.size - 1
        part = None
        if grp.chunk and last_t:
            # A chunk's last MATMUL hands its part of the norm its token.
            c, pos = grp.place(jj)
            last_of_group = n == grp.end - 1
            if pos == len(grp.chunks[c]) - 1 and not last_of_group:
                part = c
        pops = t == 0 and jj == 0 and grp.index >= self.buffers
        # The group's last MATMUL hands the epilogue its token itself, as it
        # completes: a SYNC would hold the compute queue until the array's
        # pipeline had drained. (Its `vector` flag also makes its pop the
        # vector engine's, so a MATMUL that pops the store engine keeps the
        # SYNC.)
        hands = fused and last_t and last_of_group
        own = (hands or part is not None) and not pops
        prog.matmul(act_row=self.a_row(grp, t), m_rows=grp.mrows, out_row=self.out_row(grp, jj),
                    seed=seed, seed_row=seed_row, new_weights=True, pop_next=pops,
                    push_prev=self._matmul_pushes(n),
                    push_next=(last_t and not fused) or own, vector=own)
        if part is not None:
            if not own or self.waiting:
                raise AssertionError("a chunk's last MATMUL pops, or waits on interleaved epilogues")
            self.pending.append(Pending(self.norm_part(grp, part), n,
                                        self._due(grp, part + 1) - 1, cfg.vmem_row_elems))
        if hands:
            if not own:
                prog.sync("compute", push_next=True, vector=True)
            barrier = not self.last and grp.index == len(self.groups) - 1
            self.waiting.append(self.epilogue_program(
                grp, grp.index + self.buffers < len(self.groups) or barrier))
            nxt = self.groups[grp.index + 1] if grp.index + 1 < len(self.groups) else grp
            if len(self.waiting) == self.ring.interleave or nxt is grp:
                ep_prog = (self.waiting[0] if len(self.waiting) == 1
                           else _merge_epilogues(self.waiting))
                self.waiting = []
                self.pending.append(Pending(ep_prog, n, self._due(nxt) - 1, cfg.vmem_row_elems,
                                            stores=self.ring.interleave == 1))
        elif last_t and not fused:
            self.drain(prog)
            esize = op.c.elem
            barrier = not self.last and grp.index == len(self.groups) - 1 and last_of_group
            pieces = self._pieces(op.c, grp)
            for k, (off, rows, target, r) in enumerate(pieces):
                last_piece = k == len(pieces) - 1
                prog.store(acc_row=self.out_row(grp, jj) + off,
                           ext_addr=target.addr + r * target.stride + esize * j * c,
                           rows=rows, row_bytes=esize * min(c, op.N - j * c),
                           ext_stride=target.stride, to_bf16=op.c.dtype == "bf16", relu=op.relu,
                           pop_prev=k == 0,
                           push_prev=last_piece and ((last_of_group and grp.index + self.buffers
                                                      < len(self.groups)) or barrier))
        if n + self.W < self.steps:
            self.batch(prog, n + self.W)
        for load in self.preload_at.get(n, ()):
            prog.load(**load)
        if self.prefetch_into is not None and n in self.prefetch_into[2]:
            x, nxt, at = self.prefetch_into
            if n == x:
                prog.sync("load", pop_next=True)
            # The last pushes LOADW 0's token when batch 0 loads nothing else.
            push = n == max(at) and not nxt.batch_rest(0)
            for i, load in enumerate(at[n]):
                prog.load(**load, push_next=push and i == len(at[n]) - 1)
        self.drain(prog, n)

    def _due(self, grp, c=0):
        """The step past which the epilogue instructions spread over group
        `grp` (or over its chunk c) must all be out: its end, or a chunked
        group's chunk c's end (the group's end past its last chunk), so that
        what was due before a chunk's part does not hold it up (the pending
        epilogues go out in order)."""
        if grp.chunk and c < len(grp.chunks):
            return grp.span(c)[1]
        return grp.end

    # ---- emission with loops ---------------------------------------------------------
    def steps_program(self, lo, hi):
        prog = Program()
        for n in range(lo, hi):
            self.step(prog, n)
        return prog

    def group_program(self, grp, loops):
        """The instructions of a group's steps; its regular middle K tiles as
        LOOPs when `loops`: the longest regular run from the first regular
        step, then again from where it ends (a row operand's tile loads make
        the first iterations differ from the last ones), each run cut where
        earlier groups' epilogues are due (`_loop_chunk`). A group of
        quantized weights, whose loads come where their pace puts them
        (`_units`), looks for runs again a period after one that is not
        regular, and checks every iteration of a run."""
        if self.bundles:
            span = self.bundles.get(grp.index)
            return self.steps_program(*span) if span else Program()
        W, KT, G = self.W, self.placed[grp.op].plan.KT, grp.size
        period = self.loop_period(grp)
        quant = grp.index in self.chunk
        n = grp.start + G
        while n < W:
            n += G
        n = min(n, grp.end)
        # A regular step has 1 <= t <= KT-2, loads for a step of the same group
        # with t <= KT-2 too, and pushes and pops like its neighbours. (A
        # quantized group's loads are checked iteration by iteration.)
        last = min(grp.start + G * (KT - 1) - 1 - (0 if quant else W), self.steps - W - 1)
        widest = min(_WIDEST, self.config.loop_body_instrs)
        rows = (lambda p: _compress(p, widest)) if quant else (lambda p: p)
        if loops and quant and self._rows_only(grp):
            return rows(self.steps_program(grp.start, grp.end))
        prog = rows(self.steps_program(grp.start, n)) if loops else Program()
        while loops:
            run = self._regular_run(n, (last - n + 1) // period, period, every=quant)
            if run is None and quant and n + 2 * period <= last + 1:
                prog.extend(rows(self.steps_program(n, n + period)))
                n += period
                continue
            if run is None:
                break
            count, deltas = run
            chunk = self._loop_chunk(n, count, period)
            if chunk < 2:
                break
            for i in range(0, count, chunk):
                k = min(chunk, count - i)
                self.hold = True
                body = rows(self.steps_program(n + i * period, n + (i + 1) * period))
                self.hold = False
                prog.loop(k, body, deltas) if k >= 2 else prog.extend(body)
                self.drain(prog, n + (i + k) * period - 1)
            n += count * period
        if not loops:
            return self.steps_program(grp.start, grp.end)
        return prog.extend(rows(self.steps_program(n, grp.end)))

    def _rows_only(self, grp):
        """Whether a quantized group's t rows go without outer LOOPs (each
        row still an inner one, `_compress`): when the array's step outlasts
        a weight tile's beats by a third (batch 16: 16 cycles against Q4_1's
        10 beats), the bus has room for the longer program, and an outer
        LOOP's body, which the expander takes in whole before it issues the
        first iteration (hdl/loop.py), left the array idle about 240 cycles
        at the start of each (docs/compiler.md, "Quantized weights")."""
        cfg = self.config
        beats = self.placed[grp.op].op.b.tile_beats(cfg.rows, cfg.axi_data_bytes)
        return grp.mrows <= cfg.rows and 4 * beats <= 3 * max(grp.mrows, cfg.weight_load_cycles)

    def _regular_run(self, n, count, period, every=False):
        """(iterations, deltas) of the longest LOOP of `period` steps from
        step n, at most `count` iterations, at least 2; or None. `every`:
        the longest whose iterations all follow the progression (else the
        longest whose last one does: the steps in between are regular)."""
        widest = min(_WIDEST, self.config.loop_body_instrs)
        rows = (lambda p: _compress(p, widest)) if every else (lambda p: p)
        iteration = lambda i: rows(self.steps_program(n + i * period, n + (i + 1) * period))
        self.hold = True
        try:
            first, second = (iteration(0), iteration(1)) if count >= 2 else (None, None)
            if first is None or len(first) > self.config.loop_body_instrs \
                    or len(second) != len(first):
                return None
            deltas = [(b - a) & _MASK for a, b in zip(first.words, second.words)]
            if every:
                k = 2
                while k < count and _is_progression(first, iteration(k), deltas, k):
                    k += 1
                return k, deltas
            while count >= 2:
                if _is_progression(first, iteration(count - 1), deltas, count - 1):
                    return count, deltas
                count -= 1
            return None
        finally:
            self.hold = False

    def _loop_chunk(self, n_a, count, period):
        """Iterations per LOOP over `count` iterations from step n_a. Earlier
        groups' epilogue instructions due meanwhile go between LOOPs, each
        batch at most `_DRAIN_QUEUES` command queues of `rows`-row VECTORs: a
        full vector queue holds up the array's instructions no longer than
        that, and a decode step's program is fetched in a fraction of the
        cycles its weights take (docs/compiler.md, "Loops")."""
        rows = self.due_rows(n_a + count * period - 1) - self.due_rows(n_a - 1)
        limit = _DRAIN_QUEUES * self.config.cmd_queue_depth * self.config.rows
        return count // max(1, math.ceil(rows / limit))

    def prefetch(self, nxt):
        """Let this segment load the weight units of the next one's (`nxt`)
        first batches while the array goes through its last steps and the
        vector unit through its epilogue (the bus idled there, about 2,500
        cycles before the down projection of a batch-1 decode step; docs/
        compiler.md, "The next segment's first weights"): batch 0's and
        those of the batches after it that load units only (activations,
        row operands and parameters stay behind the barrier), as many as
        `_prefetch_steps` spreads before this segment's end, the first
        after MATMUL x. Sets ``nxt.hoisted``. Only between two segments of
        quantized weights of whole K tiles (`_whole_k`: a decode step's,
        a prefill's), when this one's epilogues write no VMEM scratch."""
        if not (self.units and nxt.units and self.fused and not self.ring.t_slot
                and all(_whole_k(p, self.config.rows) for p in self.placed + nxt.placed)):
            return
        units, most = [], 0
        while most < nxt.W and (most == 0 or all("format" in load
                                                 for load in nxt._batch_loads(most))):
            units += [most] * len(nxt.placed_units.get(most, ()))
            most += 1
        if not nxt._batch_loads(0):
            return
        def fits(h, turn):
            nxt.hoisted = {m: units[:h].count(m) for m in sorted(set(units[:h]))}
            return self._prefetch_steps(nxt, turn)

        # The most units, the earliest, over the turns of the next ring (with
        # more units the first goes no earlier and more are left for the
        # last step: a turn that cannot take the most so far takes fewer).
        best = None
        for turn in range(nxt.U):
            h = len(units) if best is None else best[0]
            at = fits(h, turn)
            while at is None and best is None and h > 1:
                h -= 1
                at = fits(h, turn)
            if at is None:
                continue
            while h < len(units) and (more := fits(h + 1, turn)) is not None:
                h, at = h + 1, more
            if best is None or (h, -min(at)) > best[:2]:
                best = (h, -min(at), turn)
        if best is None:
            nxt.hoisted = {}
            return
        h, _, turn = best
        if turn:
            nxt.rotate(turn)
        nxt.hoisted = {m: units[:h].count(m) for m in sorted(set(units[:h]))}
        at = self._prefetch_steps(nxt)
        self.prefetch_into = (min(at), nxt, at)

    def preload(self, loads):
        """Issue `loads` (a later segment's `Preload` tiles, in order, none
        with a token) evenly over this segment's steps after the first W
        (whose batches go out at once; of a segment of W steps or fewer,
        from its last): the bus has room beside each step's
        weights (`handoff._bus_room`), and a later segment's first LOADW
        waits for a token that a load after them pushes (the load engine
        runs in program order)."""
        if not loads:
            return
        if not self.units or any(not p.op.quantized for p in self.placed):
            raise AssertionError("preloads go into a segment of quantized weights")
        start = min(self.W, self.steps - 1)
        for i, load in enumerate(loads):
            at = start + i * (self.steps - start) // len(loads)
            self.preload_at.setdefault(at, []).append(load)

    def _prefetch_steps(self, nxt, turn=0):
        """{step: loads} of `nxt`'s `hoisted` weight units in this segment
        (`prefetch`): from MATMUL x -- the first that pushes no token of its
        own, after the last step that reads a VMEM row they fill and after
        this segment's last load (the load->compute tokens are counts: the
        pushes must reach the LOADWs in program order) -- one each as many
        steps as the bus takes to bring it, so that the load engine's queue
        does not hold up the array's instructions; at most
        `_PREFETCH_QUEUED` left for the last step (they wait in the queue
        through the epilogue). None if more would be left. `turn`: with
        `nxt`'s ring turned by that many slots (`rotate`)."""
        cfg, loads = self.config, nxt.hoisted_loads()
        if not loads:
            return None
        rows = [(nxt.turned(load["vmem_row"], turn), nxt.turned(load["vmem_row"], turn)
                 + load["rows"]) for load, _ in loads]
        x = max([self._last_load()] + [self._last_read(lo, hi) for lo, hi in rows])
        while self._matmul_pushes(x):
            x += 1
        step = max(self.groups[-1].mrows, cfg.weight_load_cycles + _STEP_GAP)
        at, n = {}, x
        for load, beats in loads:
            at.setdefault(min(n, self.steps - 1), []).append(load)
            n += max(1, math.ceil(beats / step))
        if len(at.get(self.steps - 1, ())) > _PREFETCH_QUEUED:
            return None
        return at

    def _unit_reads(self):
        """[(first VMEM row, row past it, the last step that reads them)] of
        this segment's quantized weight units (worked out once)."""
        if "_reads" not in self.__dict__:
            out, rows = [], self.config.rows
            for grp in self.groups:
                for key, t0 in ((k, k[2]) for k in self.units if k[0] == grp.index):
                    tiles = sum(1 for t, first in self.chunk_of[grp.index].items() if first == t0)
                    out.append((self.units[key], self.units[key] + tiles * rows,
                                grp.step_of(t0 + tiles - 1, key[1])))
            self._reads = out
        return self._reads

    def _last_read(self, lo, hi):
        """The last step that reads VMEM rows lo .. hi - 1 of this segment's
        weight ring (the last step when they reach past the ring: every read
        is done)."""
        cache = self.__dict__.setdefault("_read_of", {})
        if (lo, hi) not in cache:
            cfg = self.config
            ring_end = self.U * max(chunk_tiles(cfg, p.op) for p in self.placed
                                    if p.op.quantized) * cfg.rows
            cache[lo, hi] = self.steps - 1 if hi > ring_end else max(
                [0] + [last for lo_u, hi_u, last in self._unit_reads() if lo < hi_u and lo_u < hi])
        return cache[lo, hi]

    def _last_load(self):
        """The MATMUL after which this segment's last load is issued."""
        if "_last" not in self.__dict__:
            loaded = [n for n in range(self.W, self.steps) if self._batch_loads(n)]
            loaded += [e + self.W for e in self._early_plan()]
            self._last = max(loaded, default=0) - self.W
        return self._last

    def emit(self, prog, loops):
        self._early_plan()
        start = len(prog.words)
        for n in range(self.W):
            self.batch(prog, n)
        units = [self.group_program(grp, loops) for grp in self.groups]
        # Fused epilogues interleave with the next group's steps: no loops of
        # whole groups.
        # (Nor for quantized weights: their groups' LOOPs nest already.)
        _emit_runs(prog, units, loops and not self.fused and not self.units,
                   self.config.loop_body_instrs)
        self.drain(prog)
        if self.fused and self.ring.interleave > 1:
            _defer_stores(prog, start, _STORE_DEFER)
        if not self.last:
            prog.sync("compute", pop_next=True, push_prev=True)
            prog.sync("load", pop_next=True)


# MATMULs a segment of short softmaxes (`_interleave`) puts between a STORE
# that waits for a token and where its epilogue put it (`_defer_stores`).
# Two SmolLM2 layers at batch 16 on 16 cached positions: 565,563 cycles
# without, 564,769 with 4, 563,818 with 6, 563,782 with 8. Every segment
# deferred, not only these, was slower (a 64-token prefill 2,051,727 ->
# 2,086,598): there the STOREs were already where the array had room.
_STORE_DEFER = 8

_POP_PREV, _POP_NEXT = (1 << Deps.as_shape()[name].offset for name in ("pop_prev", "pop_next"))
_VECTOR_FLAG = 1 << SyncFlags.as_shape()["vector"].offset     # bit 7 of every engine's flags
_ENGINE = SyncFlags.as_shape()["engine"]


def _sync_engine(word):
    flags = field_value(word, Opcode.SYNC, "flags")
    return Engine((flags >> _ENGINE.offset) & ((1 << _ENGINE.width) - 1)), flags


def _store_engine(word):
    """Whether the instruction runs on the store engine (STORE, SYNC on store)."""
    op = word & 0xF
    return op == Opcode.STORE.value or (op == Opcode.SYNC.value
                                        and _sync_engine(word)[0] is Engine.STORE)


def _pops_store(word):
    """Whether the instruction takes a token the store engine gives."""
    op = Opcode(word & 0xF)
    if op in (Opcode.LOAD, Opcode.STORE, Opcode.LOOP, Opcode.HALT):
        return False
    if not field_value(word, op, "deps") & _POP_NEXT:
        return False
    if op is Opcode.VECTOR:
        return True
    if op in (Opcode.MATMUL, Opcode.LOADW):
        return not field_value(word, op, "flags") & _VECTOR_FLAG
    if op is Opcode.SYNC:
        engine, flags = _sync_engine(word)
        return engine is Engine.VECTOR or (engine is Engine.COMPUTE and not flags & _VECTOR_FLAG)
    return False


def _defer_stores(prog, start, lag):
    """Move each store-engine instruction that waits for a token (and those
    behind it, in order) `lag` MATMULs later in the program, from word
    `start` on. The chip takes instructions in program order into queues of
    `cmd_queue_depth`: STOREs that wait for the vector unit's last pass, a
    group's worth at once, filled the store queue and held the next LOADWs
    and MATMULs up. Every push still precedes its pop: the held ones go out
    before any instruction that takes a store token, and before a LOOP."""
    words, text = prog.words[start:], list(prog.text[start:])
    out_w, out_t, held = [], [], collections.deque()
    matmuls, i = 0, 0

    def flush(upto=None):
        while held and (upto is None or held[0][2] + lag <= upto):
            w, t, _ = held.popleft()
            out_w.append(w)
            out_t.append(t)

    while i < len(words):
        w = words[i]
        if w & 0xF == Opcode.LOOP.value:
            flush()
            end = i + 1 + 2 * field_value(w, Opcode.LOOP, "body")
            out_w += words[i:end]
            out_t += text[i:end]
            i = end
            continue
        if _pops_store(w):
            flush()
        if _store_engine(w) and (held or field_value(w, w & 0xF, "deps") & _POP_PREV):
            held.append((w, text[i], matmuls))
        else:
            out_w.append(w)
            out_t.append(text[i])
            if w & 0xF == Opcode.MATMUL.value:
                matmuls += 1
                flush(matmuls)
        i += 1
    flush()
    prog.words[start:] = out_w
    prog.text[start:] = out_t


def _whole_k(p, rows):
    """Whether placed op `p` has quantized weights of whole K tiles, whose
    segment may load the next one's first weight units (`prefetch`): at
    batch 16 too the bus idles through the output projection's
    add_rms_norm tail, which nothing else overlaps."""
    return p.op.quantized and p.op.K % rows == 0


def _one_row(p, rows):
    """Whether placed op `p` has quantized weights and blocks of one row
    (a batch-1 decode step) of whole K tiles: its activation row is one LOAD
    (VMEM rows ``a_base + t``), its row operand one LOAD
    (`FusedGroups.residual_loads`)."""
    return p.op.quantized and p.plan.Mb == 1 and p.op.K % rows == 0


def _compress(prog, widest):
    """`prog` (instructions, no LOOPs) with each run of repetitions of up to
    `widest` instructions whose words move by a constant step from one
    repetition to the next as a LOOP, where the LOOP is shorter than the
    run (a body of b instructions costs 1 + 2b words): a t row of a group
    of quantized weights (its N tiles' slots follow each other in the
    ring), and a row whose steps carry a load or a store each, the inner
    LOOP of the group's LOOPs, which nest two deep. Every repetition is
    compared word for word, so the LOOP issues exactly these words."""
    words, text, out, i = prog.words, prog.text, Program(), 0
    n = len(words)
    while i < n:
        best = None                       # (words saved, width, repetitions, deltas)
        # A LOOP saves words only over 3 repetitions or more (4 of one
        # instruction): their first words' steps must agree before the rest is
        # compared (most instructions start no run; this is their whole cost).
        for b in range(1, min(widest, (n - i) // 3) + 1):
            if (words[i + b] - words[i]) & _MASK != (words[i + 2 * b] - words[i + b]) & _MASK:
                continue
            deltas = [(words[i + b + x] - words[i + x]) & _MASK for x in range(b)]
            k = 2
            while i + (k + 1) * b <= n and all(
                    (words[i + k * b + x] - words[i + (k - 1) * b + x]) & _MASK == deltas[x]
                    for x in range(b)):
                k += 1
            saved = k * b - (1 + 2 * b)
            if saved > 0 and (best is None or saved > best[0]):
                best = (saved, b, k, deltas)
        if best is None:
            out.words.append(words[i])
            out.text.append(text.entry(i))
            i += 1
            continue
        _, b, k, deltas = best
        body = Program()
        body.words, body.text = words[i:i + b], text[i:i + b]
        out.loop(k, body, deltas)
        i += b * k
    return out


def _is_progression(first, final, deltas, k):
    return len(first) == len(final) and all(
        (a + k * d) & _MASK == b for a, b, d in zip(first.words, final.words, deltas))


def _emit_runs(prog, units, loops, body_limit):
    """Append `units` (one Program per group); pairs of groups that repeat with a
    constant stride (pairs: output buffers alternate between groups) become one
    LOOP."""
    i = 0
    while i < len(units):
        if loops and i + 3 < len(units):
            first = units[i].concat(units[i + 1])
            if len(first) <= body_limit:
                deltas = None
                count = 1
                while i + 2 * count + 1 < len(units):
                    nxt = units[i + 2 * count].concat(units[i + 2 * count + 1])
                    prev = units[i + 2 * count - 2].concat(units[i + 2 * count - 1])
                    if len(nxt) != len(first):
                        break
                    step = [(b - a) & _MASK for a, b in zip(prev.words, nxt.words)]
                    if deltas is None:
                        deltas = step
                    elif step != deltas:
                        break
                    count += 1
                if count >= 2:
                    prog.loop(count, first, deltas)
                    i += 2 * count
                    continue
        prog.extend(units[i])
        i += 1


def _attach_preloads(segments, segs, handoffs, ops):
    """Give each segment the `Preload` LOADs it issues (of the ops whose
    weight tiles it loads for later segments)."""
    where = {i: k for k, placed in enumerate(segments) for i, _ in placed}
    for k, (seg, placed) in enumerate(zip(segs, segments)):
        if seg is None:
            continue
        preloads = [h for i, _ in placed for h in handoffs.preloads(i)]
        if any(where[h.consumer] <= k for h in preloads):
            raise AssertionError("a preload's consumer runs in the segment that loads it")
        seg.preload([load for h in preloads for load in h.loads(ops[h.consumer])])


def compile_matmuls(config, ops, *, loops=True, handoffs=True):
    """One `Program` for `ops` (a sequence of `MatmulOp` and, on a chip with the
    vector unit, `VectorOp`), in order; with `loops` False every step is spelled
    out (the reference the loops are tested against). A `VectorOp` is a
    segment of its own (`emit_vector_op`), with barriers around it. With
    `handoffs` (`plan_handoffs`), epilogue results the next matmul reads stay
    in VMEM; without, everything goes through external memory."""
    ops = list(ops)
    if not ops:
        raise ValueError("compile_matmuls needs at least one op")
    handoffs = plan_handoffs(config, ops) if handoffs else None
    if handoffs is not None:
        ops = list(handoffs.ops)      # plain producers get a copy epilogue
    runs, segments = [], []           # runs: (first op index, [ops]) of one kind
    for i, op in enumerate(ops):
        if isinstance(op, VectorOp) or not runs or isinstance(runs[-1][1][-1], VectorOp):
            runs.append((i, []))
        runs[-1][1].append(op)
    for first, run in runs:
        if isinstance(run[0], VectorOp):
            segments.append([(first, run[0])])
        else:
            segments += [[(first + i, p) for i, p in placed]
                         for placed in plan_segments(config, run, handoffs, first)]
    prog = Program()
    steps = 0
    segs = [None if isinstance(placed[0][1], VectorOp)
            else _Segment(config, [p for _, p in placed], last=k == len(segments) - 1)
            for k, placed in enumerate(segments)]
    for seg, nxt in zip(segs, segs[1:]):
        if seg is not None and nxt is not None:
            seg.prefetch(nxt)
    if handoffs is not None:
        _attach_preloads(segments, segs, handoffs, ops)
    for seg, placed in zip(segs, segments):
        if seg is None:
            emit_vector_op(config, placed[0][1], prog)
            continue
        seg.emit(prog, loops)
        steps += seg.steps
    prog.halt()
    preloads = sum(len(h.tiles) for h in (handoffs.items if handoffs else ())
                   if isinstance(h, Preload))
    return CompiledProgram(prog, tuple(tuple((i, getattr(p, "plan", None)) for i, p in placed)
                                       for placed in segments), steps, preloads)
