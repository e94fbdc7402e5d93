"""Fused epilogues: a layer op the vector unit applies to each group of a
matmul's output tiles before they are stored, while the array computes the
next group (docs/vpu.md, "Fused epilogues").

`Epilogue` says what (on `MatmulOp.epilogue`); the accumulator and VMEM
rows it needs are laid out by `epilogue_scratch` and its neighbours (for
`plan_op` and the segment's `_Ring`); `emit_epilogue` writes its VECTORs;
`FusedGroups` is the part of the matmul compiler's segment that hands groups
to the vector engine, loads residuals, stores results and paces the
instructions into the program (`Pending`).
"""

import bisect
import math
import re
from dataclasses import dataclass

from mxu.hdl.fields import field_plan
from mxu.hdl.isa import Opcode, VectorFlags, VectorInstr, VpuOp, field_value

from .layerops import EPILOGUE_KINDS, LAYER_OPS, Group, layer_op
from .operands import Operand, Scatter
from .program import Program
from .vector import Tiles, VectorEmitter, flag_instruction, tile_moves, tree_ready

__all__ = ["EPILOGUE_KINDS", "Epilogue", "epilogue_operands", "epilogue_scratch",
           "epilogue_param_rows", "epilogue_param_loads", "transpose_vmem_rows", "emit_epilogue",
           "out_tiles", "Pending", "FusedGroups", "is_vector"]



def epilogue_operands(kind, M, N, cols, given):
    """{operand name: (rows, cols)} an epilogue of `kind` on an M x N result
    reads (fp32), `given` the shapes of the operands the caller gave (a
    softmax without a bias row needs N to be a multiple of `cols`: the bias
    masks a partial tile's spare lanes; a RoPE table's width is its own)."""
    return layer_op(kind).operands(M, N, cols, given)


@dataclass(frozen=True)
class Epilogue:
    """A layer op the vector unit applies to a matmul's fp32 result in the
    accumulator, group by group, before it is stored (docs/vpu.md, "Fused
    epilogues"): the results are those of the matmul to an fp32 tensor
    followed by the `VectorOp` of the same kind, bit for bit. The kinds and
    what they read are the `LayerOp` descriptors of `layerops.py`.

    kind : a `LAYER_OPS` name: "softmax" (``softmax(r * scale + other)``:
        `other` one bias row, ``count*cols`` wide, -inf past N, for every
        row; None when nothing is masked and N is a multiple of cols),
        "masked_softmax" (likewise with a bias row per result row: a causal
        mask), "layer_norm" (`params`: gamma, beta, ones, 3 x N),
        "add_layer_norm" (``layer_norm(r + other)``), "rms_norm" (`params`:
        gamma), "add_rms_norm" (c gets ``r + other``, `extra` its RMSNorm),
        "gelu", "silu_mul" (paired: ``silu(r[2j]) * r[2j+1]`` tile by tile),
        "rope" (``r * cos + swap(r) * sin``, `other` the rows' cos|sin table;
        paired when the swapped copy comes from the matmul), "transpose" (the
        op's c is the bf16 ``(r * scale).T``, N x M).
    extra : a second output besides the op's c (the bf16 copy of an fp32
        result, or add_rms_norm's normalised rows), or None.
    transpose : c is the bf16 transpose of the result (N x M), written
        through the vector unit's transpose path (always for "transpose").
    paired : the matmul's N tiles alternate between the two operands of a
        paired op (RoPE folded into the weights; silu_mul always is).
    """
    kind: str
    extra: Operand = None
    other: Operand = None
    params: Operand = None
    scale: float = 1.0
    eps: float = 0.0
    transpose: bool = False
    paired: bool = False

    @property
    def desc(self):
        return layer_op(self.kind)

    @property
    def row_wise(self):
        """Whether a row's result needs the whole row (the group is every N tile)."""
        return self.desc.row_wise

    @property
    def is_paired(self):
        return self.desc.paired or self.paired

    @property
    def transposed(self):
        return self.desc.transposes or self.transpose

    @property
    def reads(self):
        return tuple(o for o in (self.other, self.params) if o is not None)

    def out_cols(self, N):
        """The widest result it stores of N columns: N, or half when paired."""
        return N // 2 if self.is_paired else N

    def check(self, config, M, N, width=None):
        if not config.vpu:
            raise ValueError("a matmul epilogue needs a chip with the vector unit (vpu=True)")
        if self.kind not in LAYER_OPS:
            raise ValueError(f"Epilogue kind must be one of {EPILOGUE_KINDS}, not {self.kind!r}")
        c = config.cols
        if self.paired and not self.desc.may_pair:
            raise ValueError(f"a {self.kind} epilogue takes no paired=True (only "
                             f"{[k for k, o in LAYER_OPS.items() if o.may_pair]} do; "
                             f"{[k for k, o in LAYER_OPS.items() if o.paired]} always are)")
        if self.is_paired and N % (2 * c):
            raise ValueError(f"a paired {self.kind} epilogue needs N ({N}) to be a multiple of "
                             f"2 * cols ({2 * c}): tiles alternate between its two operands")
        if self.transpose and not (self.desc.may_transpose or self.desc.transposes):
            raise ValueError(f"a {self.kind} epilogue cannot write its result transposed")
        width = self.out_cols(N) if width is None else width
        given = {name: (o.rows, o.cols) for name, o in (("other", self.other),
                                                        ("params", self.params)) if o is not None}
        want = epilogue_operands(self.kind, M, width, c, given)
        for name in ("other", "params"):
            operand = getattr(self, name)
            if (operand is None) != (name not in want):
                raise ValueError(f"a {self.kind} epilogue {'needs' if name in want else 'takes no'} "
                                 f"{name}")
            if operand is not None:
                operand.check(name, config.ext_mem_bytes)
                if (operand.rows, operand.cols) != want[name] or operand.dtype != "fp32":
                    raise ValueError(f"{name} must be {want[name][0]}x{want[name][1]} fp32, not "
                                     f"{operand.rows}x{operand.cols} {operand.dtype}")
        self.desc.check(self, c, width)
        if self.extra is not None:
            if self.transposed:
                raise ValueError("a transposed epilogue has no extra output")
            self.extra.check("extra", config.ext_mem_bytes)
            if (self.extra.rows, self.extra.cols) != (M, width):
                raise ValueError(f"extra must be {M}x{width}, not {self.extra.rows}x{self.extra.cols}")


def epilogue_scratch(kind, count, G, Mb):
    """{region: (offset, rows)} of the vector unit's working rows for an
    epilogue on groups of G tiles of Mb rows (count: the op's N tiles), and
    their total. One such region serves a whole segment: the vector engine
    runs one group at a time."""
    layout, at = {}, 0
    for name, rows in layer_op(kind).scratch(count, G, Mb):
        layout[name] = (at, rows)
        at += rows
    return layout, at


def epilogue_param_rows(kind, count, M):
    """Accumulator rows of an epilogue's parameters: the softmax bias row,
    LayerNorm's gamma, beta and ones, RMSNorm's gamma -- a row per tile each
    -- or a causal softmax's mask, M rows per tile."""
    return layer_op(kind).param_rows(count, M)


def epilogue_param_loads(ep, base, cols):
    """The LOADs (as keyword dicts) of an epilogue's parameter rows (softmax
    bias, LayerNorm gamma/beta/ones, RMSNorm gamma) into accumulator rows from `base`."""
    return ep.desc.param_loads(ep, base, cols)


def transpose_vmem_rows(config, G, Mb):
    """VMEM rows a transpose epilogue's group lands in: per tile, a block of
    `cols` rows for every ``vmem_row_elems`` result rows."""
    return G * -(-Mb // config.vmem_row_elems) * config.cols


def out_tiles(ep, G):
    """(result tile offset in the group, output tile offset) of each of a
    group's output tiles: every tile, or every even one of a paired op."""
    if ep.is_paired:
        return [(2 * k, k) for k in range(G // 2)]
    return [(k, k) for k in range(G)]


def emit_epilogue(config, ep, prog, x, params, scratch, residual, vmem=None, j0=0, m0=0,
                  on_sum=None, sum_by_tile=False, summed=False, **first):
    """The VECTORs of `ep` on the group `x` (a `Tiles` in the accumulator,
    updated in place; its first tile is the op's tile `j0`): `params`,
    `scratch` and `residual` are the accumulator rows of its parameters
    (`epilogue_param_rows`), working rows (`epilogue_scratch`) and the
    group's row operand (a residual, a RoPE table); `vmem`: the VMEM row a
    transpose's blocks start at (`transpose_vmem_rows`), None when they go
    nowhere but to hand-offs; `m0`: the group's first result row (a causal
    mask's row). `on_sum(emit)`: called when add_rms_norm's residual sum,
    its fp32 output, is final (its STOREs may go while the norm runs).
    `first`: flags of the first instruction.
    Returns the emitter and the accumulator row where each output's tiles
    start (a `Tiles` per output: c, extra)."""
    count = -(-x.n // x.cols)
    layout, _ = epilogue_scratch(ep.kind, count, x.count, x.m)
    at = {name: scratch + off for name, (off, _) in layout.items()}
    emit = VectorEmitter(prog, config).begin(**first)
    if ep.scale != 1.0 and ep.desc.scaled:
        emit.map(VpuOp.MUL, x, x, scalar=ep.scale)     # x * 1 is x: no pass
    outs = ep.desc.emit(emit, Group(ep, x, params, at, residual, j0, m0, on_sum, sum_by_tile,
                                    summed))
    if ep.transposed and vmem is not None:
        E, blocks = config.vmem_row_elems, -(-x.m // config.vmem_row_elems)
        for t, k in out_tiles(ep, x.count):
            for blk in range(blocks):
                emit.op(VpuOp.PASS, x.tile(t) + blk * E, min(E, x.m - blk * E),
                        vmem + (k * blocks + blk) * config.cols, to_vmem=True, transpose=True)
    return emit, outs


def is_vector(word):
    """Whether an instruction word is a VECTOR."""
    return word & 0xF == Opcode.VECTOR.value


_TRANSPOSE_BIT = VectorFlags.as_shape()["transpose"].offset


def epilogue_cost(word, row_elems, stores=True):
    """An epilogue instruction's share of its group's work, in rows (about
    a cycle each on its engine): a VECTOR's, at least `row_elems` for a
    transpose (it writes a VMEM row per element of its rows: a decode
    step's K transposes one row per sequence), a STORE's unless not
    `stores`, none for a SYNC. (A STORE's write responses, about 9 cycles
    more, counted too made a decode step's attention slower: 76,084 ->
    76,797 cycles on one Q4_1 layer of SmolLM2's sizes at batch 16; and the
    STOREs of short softmaxes interleaved (two), spread, made its scores 8 %
    slower: they go at the end, 76,084 -> 74,855.)"""
    if is_vector(word):
        rows = field_value(word, Opcode.VECTOR, "rows")
        transposes = field_value(word, Opcode.VECTOR, "flags") >> _TRANSPOSE_BIT & 1
        return max(rows, row_elems) if transposes else rows
    if stores and word & 0xF == Opcode.STORE.value:
        return field_value(word, Opcode.STORE, "rows")
    return 0


class Pending:
    """A group's epilogue instructions on their way into the program: due
    between steps `first` and `last`, in proportion to their cost
    (`epilogue_cost`): spread by VECTOR rows alone, a group's STOREs came
    all at once at the end of the next group, and a decode step's one-row
    transposes of K (16 sequences' columns) in a burst; either filled its
    engine's queue and held up the array's instructions behind it."""

    def __init__(self, program, first, last, row_elems, stores=True):
        self.words, self.text = program.words, program.text
        self.first, self.last, self.done = first, last, 0
        self.cumulative, total, self.rows = [], 0, 0
        for word in self.words:
            total += epilogue_cost(word, row_elems, stores)
            self.cumulative.append(total)
            if is_vector(word):
                self.rows += field_value(word, Opcode.VECTOR, "rows")
        self.total = total


# Transposes between a transposed block's VECTOR and its STORE in the program
# (`_follow`): the STORE waits for its token, the vector unit's latency
# after the transpose issues, so it goes a few transposes later (1, 2, 4
# and 8 measured; 2 the fastest, by 0.2 %).
_STORE_LAG = 2


def _follow(prog, after, stores, lag):
    """Put STORE i of `stores` into `prog` after its instruction
    ``after[i + lag]`` (after the last one when there is none)."""
    at = {a: i for i, a in enumerate(after)}
    words, text, queue = [], [], list(zip(stores.words, stores.text))
    for k, item in enumerate(zip(prog.words, prog.text)):
        words.append(item[0])
        text.append(item[1])
        i = at.get(k)
        if i is not None and i >= lag and queue:
            w, t = queue.pop(0)
            words.append(w)
            text.append(t)
        if k == after[-1]:
            words += [w for w, _ in queue]
            text += [t for _, t in queue]
            queue = []
    prog.words, prog.text = words, text


_DST = field_plan(VectorInstr.as_shape())["dst_row"]
_TO_VMEM = field_plan(VectorInstr.as_shape())["flags"][0] + VectorFlags.as_shape()["to_vmem"].offset


def _retarget(prog, i, row):
    """Make VECTOR i of `prog` write VMEM rows from `row` (``to_vmem``)."""
    offset, width, _ = _DST
    word = prog.words[i] & ~(((1 << width) - 1) << offset)
    prog.words[i] = word | row << offset | 1 << _TO_VMEM
    text = re.sub(r"dst_row=\d+", f"dst_row={row}", prog.text[i])
    prog.text[i] = text.replace("'to_vmem': 0", "'to_vmem': 1")


def _last_pass(prog, tiles):
    """The indices of `prog`'s last VECTORs into `tiles` when they write it
    one tile each, in order, and nothing but its tiles after the first of
    them (a norm's last pass, whose per-tile VECTORs may alternate with the
    pass before it), else None."""
    vectors = [i for i, word in enumerate(prog.words) if is_vector(word)]
    last, whole = [None] * tiles.count, [False] * tiles.count
    inside = {}
    for i in vectors:
        dst = field_value(prog.words[i], Opcode.VECTOR, "dst_row")
        rows = field_value(prog.words[i], Opcode.VECTOR, "rows")
        first, end = (dst - tiles.base) // tiles.m, -(-(dst + rows - tiles.base) // tiles.m)
        inside[i] = dst >= tiles.base and end <= tiles.count
        for t in range(max(first, 0), min(end, tiles.count)):
            last[t], whole[t] = i, dst == tiles.tile(t) and rows == tiles.m
    if None in last or not all(whole) or last != sorted(last) or not all(
            inside[i] for i in vectors if i > last[0]):
        return None
    return last


def _sum_stores(prog, adds, before, stores, depth):
    """Put STORE i of `stores` (a tile each, each taking its own token)
    into `prog`: the first `depth` (a queue's worth) `_STORE_LAG` adds
    after add i (`adds`: the per-tile VECTORs that push their tokens), the
    rest spread evenly over the instructions from the last add to
    `before` (the norm's first last-pass VECTOR): every one before the
    norm's STOREs, whose tokens the vector engine pushes later, and not
    all at once, which would fill the store queue and hold up the VECTORs
    behind them in the chip's in-order issue."""
    items = list(zip(prog.words, prog.text))
    queue = list(zip(stores.words, stores.text))
    head, tail = queue[:depth], queue[depth:]
    place = {}
    for i, item in enumerate(head):
        place.setdefault(adds[min(i + _STORE_LAG, len(adds) - 1)], []).append(item)
    slots = list(range(adds[-1], before))
    for k, item in enumerate(tail):
        place.setdefault(slots[k * len(slots) // len(tail)], []).append(item)
    out = []
    for i, item in enumerate(items):
        out.append(item)
        out += place.get(i, [])
    prog.words, prog.text = [w for w, _ in out], [t for _, t in out]


def _interleave(prog, at, stores, depth):
    """Put `stores` into `prog` from instruction `at` on: `depth` of them
    (a queue's worth) there, then one after each later instruction. The chip
    issues in program order: STOREs in a row would fill the store queue and
    hold up the VECTORs behind them."""
    head, tail = list(zip(prog.words[:at], prog.text[:at])), list(zip(prog.words[at:],
                                                                          prog.text[at:]))
    queue = list(zip(stores.words, stores.text))
    out = head + queue[:depth]
    queue = queue[depth:]
    for item in tail:
        out.append(item)
        if queue:
            out.append(queue.pop(0))
    out += queue
    prog.words, prog.text = [w for w, _ in out], [t for _, t in out]


class FusedGroups:
    """The fused-epilogue part of the compiler's segment (`_Segment` in
    `mxu.sim.compiler.matmul`, which provides ``config``, ``placed``,
    ``groups``, ``buffers``, ``ring``, ``W``, ``pending``, `locate` and
    `out_row`)."""

    def residual_loads(self, n):
        """The row-operand rows (a residual, a mask, a RoPE table) an
        epilogue loads with step n's batch: one tile at a time, spread over
        its group's steps (`residual_steps`), so that a wide residual does not
        hold up the weight loads behind it in the load engine's queue."""
        if "_residuals" not in self.__dict__:
            # A group's loads may come with another's steps (`_Segment._bundle`).
            self._residuals = {}
            for grp in self.groups:
                for step, loads in self._residual_schedule(grp).items():
                    self._residuals.setdefault(step, []).extend(loads)
        return self._residuals.get(n, [])

    def _residual_schedule(self, grp):
        """{step: the row-operand pieces its batch loads} of group `grp`,
        worked out once per group."""
        cache = self.__dict__.setdefault("_schedules", {})
        if grp.index in cache:
            return cache[grp.index]
        p = self.placed[grp.op]
        ep = p.op.epilogue
        schedule = cache[grp.index] = {}
        if ep is None or ep.desc.row_operand is None or p.residual is not None \
                or self._holds_its_table(grp):
            return schedule
        tiles = Tiles(self.residual_row(grp), p.plan.Mb, ep.other.cols, self.config.cols)
        # Pieces of `rows` rows: a piece's load is shorter than the ring's lead.
        size = self.config.rows
        pieces = [dict(move, acc_row=move["acc_row"] + r, rows=min(size, grp.mrows - r),
                       ext_addr=move["ext_addr"] + r * move["ext_stride"])
                  for move in tile_moves(ep.other, grp.m0, grp.mrows, tiles)
                  for r in range(0, grp.mrows, size)]
        steps = self.residual_steps(grp, tiles.count, -(-grp.mrows // size))
        if p.op.quantized and p.plan.Mb == 1 and ep.other.cols % self.config.cols == 0:
            # A one-row block of quantized weights (a batch-1 decode step):
            # its tiles are consecutive rows here and in external memory, one
            # LOAD at the last step. Tile by tile, each small LOAD between
            # the weight chunks held up the stream of quantized LOADs.
            first = pieces[0]
            schedule[steps[-1]] = [dict(first, rows=len(pieces), ext_stride=first["row_bytes"])]
            return schedule
        for piece, step in zip(pieces, steps):
            schedule.setdefault(step, []).append(piece)
        return schedule

    def residual_steps(self, grp, count, per_tile=1):
        """The step whose batch loads each piece of the `count` row-operand
        tiles of group `grp` (`per_tile` pieces each, in order). The first of
        group i's loads with its first step while i < buffers (its slot is
        fresh); else with step ``start + W``, whose loads wait for i's first
        MATMUL, which waits for the stores of group i - buffers, the last
        reader of that slot. The others follow: q whole tiles per ``lcm(G,
        W)`` steps (an iteration of the group's LOOP,
        `_Segment.group_program`: the pieces' fields stay affine in it), the
        fewest that fit, their pieces evenly inside it; all before the
        group's last step, which the epilogue waits for."""
        first = grp.start + (0 if grp.index < self.buffers else self.W)
        span = grp.end - first
        if span < 1:
            raise AssertionError("a residual load lands after its group (plan_op prevents this)")
        if grp.chunk:
            # A chunked group's part adds its tiles' rows as the chunk's last
            # MATMUL completes (`norm_part`): each tile's pieces load evenly
            # over its own chunk's steps.
            out = []
            for k in range(count * per_tile):
                c, pos = grp.place(k // per_tile)
                lo, hi = grp.span(c)
                lo = max(lo, first)
                if hi <= lo:
                    raise AssertionError("a chunk's residual loads land after it")
                out.append(lo + (pos * per_tile + k % per_tile) * (hi - lo)
                           // (len(grp.chunks[c]) * per_tile))
            return out
        period = self.loop_period(grp)
        total = count * per_tile
        for q in range(1, count + 1):
            if -(-count // q) * period <= span:
                slots = q * per_tile
                return [first + (k // slots) * period + (k % slots) * period // slots
                        for k in range(total)]
        return [first + k * span // total for k in range(total)]

    def loop_period(self, grp):
        """Steps of one iteration of a group's LOOP: ``lcm(G, W)`` (its N
        tiles and the weight ring line up again)."""
        return grp.size * self.W // math.gcd(grp.size, self.W)

    def _holds_its_table(self, grp):
        """Whether group `grp`'s row-operand slot still holds the table it
        reads: a table (RoPE's cos|sin) is the same for every group of an M
        block, and the op's own table rows were loaded by its first group,
        or the slot's last group, ``buffers`` earlier, was of the same op
        and block (the epilogue only reads it)."""
        p = self.placed[grp.op]
        if p.op.epilogue.desc.row_operand != "table":
            return False
        if p.table_base is not None:
            return not grp.first_of_op
        if grp.index < self.buffers:
            return False
        prev = self.groups[grp.index - self.buffers]
        return prev.op == grp.op and prev.mb == grp.mb

    def residual_row(self, grp):
        p = self.placed[grp.op]
        if p.residual is not None:         # handed off: in its region for good
            return p.residual.residual_row(grp.m0)
        if p.table_base is not None:       # its table, loaded once
            return p.table_base
        return self.ring.res_base + self.ring.res_slot * (grp.index % self.buffers)

    def epilogue_tiles(self, grp):
        """The group's output buffer as `Tiles` (tile stride Mb: a short last
        block computes its spare rows too, and stores only its own)."""
        p = self.placed[grp.op]
        whole = p.op.epilogue.row_wise and grp.size >= p.plan.NT
        n = p.op.out_cols if whole else grp.size * self.config.cols
        return Tiles(self.out_row(grp, 0), p.plan.Mb, n, self.config.cols)

    def norm_part(self, grp, c, prog=None):
        """Chunk c's share of a chunked group's add_rms_norm (`_Group.chunk`,
        docs/compiler.md, "Norm chunks"), as its last MATMUL completes: each
        of its tiles' residual add (and the fp32 sum's STORE, when stored)
        and square, then the pairs of the squares' tree that its tiles
        complete (`tree_ready`). The same operations on every element as the
        whole group's epilogue, in an order that respects each row's
        dependences. The first VECTOR pops the compute token (and the last
        epilogue's scratch token). Appended to `prog` (a new one if None)."""
        cfg, p = self.config, self.placed[grp.op]
        op = p.op
        prog = Program() if prog is None else prog
        x = self.epilogue_tiles(grp)
        layout, _ = epilogue_scratch(op.epilogue.kind, x.count, x.count, x.m)
        sq = x.like(self._scratch_row(grp) + layout["sq"][0])
        residual = x.like(self.residual_row(grp))
        owed, self.scratch_token = self.scratch_token, False
        emit = VectorEmitter(prog, cfg).begin(pop_prev=True, pop_next=owed)
        stored = op.c not in p.unstored
        for jj in grp.chunks[c]:
            emit.op(VpuOp.ADD, x.tile(jj), x.m, x.tile(jj), b_row=residual.tile(jj))
            if stored:
                emit.end(push_next=True)
            emit.op(VpuOp.MUL, x.tile(jj), x.m, sq.tile(jj), b_row=x.tile(jj))
            if stored:
                self._tile_stores(prog, grp, op.c, x, jj)
        before = {jj for k in range(c) for jj in grp.chunks[k]}
        done = set(tree_ready(x.count, before))
        emit.tree_pairs(sq, [pair for pair in tree_ready(x.count, before | set(grp.chunks[c]))
                             if pair not in done])
        return prog

    def epilogue_program(self, grp, push_store):
        """Group `grp`'s epilogue: its VECTORs (the first pops the compute
        token, the last pushes the store's), then its STOREs, then the store
        token that frees the buffer (`push_store`). A chunked group's starts
        with its last chunk's part (`norm_part`)."""
        cfg, p = self.config, self.placed[grp.op]
        op, ring = p.op, self.ring
        x = self.epilogue_tiles(grp)
        ep_prog = Program()
        summed = bool(grp.chunk)
        if summed:
            self.norm_part(grp, len(grp.chunks) - 1, ep_prog)
        # A transpose's VMEM slot, like the output buffer, was last read by the
        # stores of group i - buffers: they precede the store SYNC that group
        # i's first MATMUL waits for, and the vector engine waits for group i.
        vmem = ring.t_base + (grp.index % self.buffers) * ring.t_slot
        stored = op.c not in p.unstored
        early, at, adds = (), None, []
        norm = op.outputs[1]
        # The sum's add tile by tile, each tile's STORE after its own, when
        # the STOREs, not the vector unit, bound the tail: the fp32 sum and
        # the norm both stored, a tile of rows or more (docs/compiler.md,
        # "Norm tails").
        sum_by_tile = (not summed and stored and not op.transposed
                       and op.epilogue.desc.outputs[1] == "norm"
                       and norm is not None and norm not in p.unstored and not p.handoffs
                       and grp.mrows >= cfg.rows and len(self._pieces(op.c, grp)) == 1)

        def store_the_sum(emit):
            # The norm only reads x: its STOREs need not wait for the norm.
            nonlocal early, at, adds
            if summed:
                early = (op.c,)     # stored by the parts
            elif stored and not op.transposed:
                adds = (_last_pass(ep_prog, x) or []) if sum_by_tile else []
                for i in adds:
                    flag_instruction(ep_prog, i, push_next=True)
                if not adds:
                    emit.end(push_next=True)
                early, at = (op.c,), len(ep_prog)
        # A norm stored from the shared scratch (add_rms_norm): the next
        # group's VECTORs, which may write the scratch, wait for its STOREs.
        owed, self.scratch_token = self.scratch_token, False
        scratch = self._scratch_row(grp)
        first = {} if summed else dict(pop_prev=True, pop_next=owed)
        emit, outs = emit_epilogue(cfg, op.epilogue, ep_prog, x, p.ep_base, scratch,
                                   self.residual_row(grp), j0=grp.j0, m0=grp.m0,
                                   on_sum=store_the_sum, sum_by_tile=sum_by_tile, summed=summed,
                                   **first)
        blocks = self.transposed_blocks(grp) if op.transposed and stored else []
        transposes = []
        for t, k, off, height, slot, *_ in blocks:
            emit.op(VpuOp.PASS, x.tile(t) + off, height, vmem + slot * cfg.cols, to_vmem=True,
                    transpose=True)
            transposes.append(len(ep_prog) - 1)
        handed = len(ep_prog)
        for handoff, source in p.handoffs:
            # The output handed off: c from the group's tiles, or the extra
            # output (add_rms_norm's norm) from its own.
            tiles = outs[1] if source.operand is op.outputs[1] else x
            if tiles is not x and self._last_pass_to_vmem(ep_prog, grp, tiles, handoff, source):
                continue
            for jj in range(grp.size):
                for off, rows, row in handoff.pieces(source, grp.m0, grp.mrows, grp.j0 + jj):
                    emit.op(VpuOp.PASS, tiles.tile(jj) + off, rows, row, to_vmem=handoff.to_vmem,
                            transpose=source.transposed)
        # Transposed blocks (a decode step's K: a block per sequence and
        # tile) each give the store engine a token, and each
        # block's STORE follows its transpose closely: the stores run beside
        # the transposes instead of after all of them.
        each = len(blocks) > 1 and handed == len(ep_prog)
        # A norm whose sum is stored early and that is stored alone after
        # its last pass (add_rms_norm): each tile's STORE follows that
        # tile's last VECTOR, as the transposed blocks' do, instead of all
        # after the pass (36 tiles of 16 rows at the end of a batch-16
        # decode step's down projection).
        by_tile = (not each and not blocks and handed == len(ep_prog) and emit.emitted
                   and op.epilogue.desc.outputs[1] == "norm" and norm is not None
                   and norm not in p.unstored and (early or op.c in p.unstored)
                   and _last_pass(ep_prog, outs[1]) is not None)
        if each:
            for i in transposes:
                flag_instruction(ep_prog, i, push_next=True)
        elif emit.emitted:
            if not by_tile:
                flag_instruction(ep_prog, len(ep_prog) - 1, push_next=True)
            if early and adds:
                stores = Program()
                self.result_stores(stores, grp, (x, None), p.unstored, only=early, each=True)
                norm_pass = _last_pass(ep_prog, outs[1]) if by_tile else None
                _sum_stores(ep_prog, adds, norm_pass[0] if norm_pass else len(ep_prog), stores,
                            cfg.cmd_queue_depth)
            elif early and not summed:
                stores = Program()
                self.result_stores(stores, grp, (x, None), p.unstored, only=early)
                _interleave(ep_prog, at, stores, cfg.cmd_queue_depth)
            if by_tile:
                self._norm_by_tile(ep_prog, grp, outs[1])
        else:
            # A copy epilogue with nothing to hand off in this group: the
            # vector engine passes the tokens on.
            ep_prog.sync("vector", pop_prev=True, push_next=True, pop_next=owed)
        if each:
            stores = Program()
            self.transposed_stores(stores, grp, blocks, vmem, each=True)
            _follow(ep_prog, transposes, stores, _STORE_LAG)
        elif blocks:
            self.transposed_stores(ep_prog, grp, blocks, vmem)
        elif by_tile:
            pass
        elif op.transposed or not self.result_stores(ep_prog, grp, outs,
                                                     tuple(p.unstored) + early):
            # Nothing left to store: the store engine takes the vector
            # engine's token all the same, to hand it on.
            ep_prog.sync("store", pop_prev=True, vector=True)
        if op.epilogue.desc.outputs[1] == "norm" and op.outputs[1] is not None \
                and op.outputs[1] not in p.unstored and grp.index + 1 < len(self.groups):
            ep_prog.sync("store", push_prev=True, vector=True)
            self.scratch_token = True
        if push_store:
            ep_prog.sync("store", push_prev=True)
        return ep_prog

    def _last_pass_to_vmem(self, ep_prog, grp, tiles, handoff, source):
        """Let the last pass into the extra output's `tiles` (a norm's,
        tile by tile) write the hand-off's VMEM rows itself, rounded to bf16
        as a PASS would (docs/isa.md: any VECTOR may write VMEM), instead of
        a PASS per tile after it: when that output is not stored, goes to
        this hand-off alone, and each tile is one piece of it. Whether it
        did (the batch-16 output projection's add_rms_norm: 36 PASSes fewer
        in its tail)."""
        p = self.placed[grp.op]
        vectors = _last_pass(ep_prog, tiles)
        if (vectors is None or source.operand not in p.unstored or source.transposed
                or not handoff.to_vmem
                or sum(s.operand is source.operand for _, s in p.handoffs) != 1):
            return False
        rows = []
        for jj in range(grp.size):
            pieces = handoff.pieces(source, grp.m0, grp.mrows, grp.j0 + jj)
            if len(pieces) != 1 or pieces[0][:2] != (0, tiles.m):
                return False
            rows.append(pieces[0][2])
        for i, row in zip(vectors, rows):
            _retarget(ep_prog, i, row)
        return True

    def _norm_by_tile(self, ep_prog, grp, tiles):
        """The norm's STOREs (from `tiles`), each after the last VECTOR of
        its tile (the pass into `tiles` is the epilogue's last, tile by
        tile), each VECTOR pushing the store engine a token and each STORE
        taking one (`_follow`)."""
        norm = self.placed[grp.op].op.outputs[1]
        vectors = _last_pass(ep_prog, tiles)
        stores = Program()
        for t, i in enumerate(vectors):
            flag_instruction(ep_prog, i, push_next=True)
            self._tile_stores(stores, grp, norm, tiles, t)
        _follow(ep_prog, vectors, stores, _STORE_LAG)

    def _tile_stores(self, prog, grp, out, tiles, t):
        """The STOREs of tile t of the group's rows in output `out` (an
        `Operand` or a `Scatter`) from `tiles`, the first taking the vector
        engine's token."""
        op, c = self.placed[grp.op].op, self.config.cols
        j, first = grp.j0 + t, dict(pop_prev=True, vector=True)
        for off, rows, target, r in self._pieces(out, grp):
            prog.store(acc_row=tiles.tile(t) + off,
                       ext_addr=target.addr + r * target.stride + target.elem * j * c,
                       rows=rows, row_bytes=target.elem * min(c, op.out_cols - j * c),
                       ext_stride=target.stride, to_bf16=target.dtype == "bf16", **first)
            first = {}

    def _scratch_row(self, grp):
        """The first accumulator row of group `grp`'s epilogue scratch (the
        ring's, shared by the groups whose epilogues interleave)."""
        ring = self.ring
        return ring.scratch_base + (grp.index % ring.interleave) * ring.scratch_rows

    def _pieces(self, out, grp):
        """(row offset in the group, rows, operand, first row in the operand)
        of the group's rows in output `out` (an `Operand` or a `Scatter`)."""
        if isinstance(out, Scatter):
            return [(a - grp.m0, n, o, r) for a, n, o, r in out.rows_in(grp.m0, grp.m0 + grp.mrows)]
        return [(0, grp.mrows, out, grp.m0)]

    def result_stores(self, prog, grp, outs, unstored=(), only=None, each=False):
        """The group's outputs to external memory (c from ``outs[0]``'s tiles,
        extra from ``outs[1]``'s), except the `unstored` ones (handed off,
        not needed there), or `only` those given; whether any STORE was
        emitted. The first STORE takes the vector engine's token, or with
        `each` every tile's first."""
        op, c = self.placed[grp.op].op, self.config.cols
        ep = op.epilogue
        N = op.out_cols
        first, emitted = dict(pop_prev=True, vector=True), False
        for out, tiles in zip(op.outputs, outs):
            if out is None or out in unstored or (only is not None and out not in only):
                continue
            for t, k in out_tiles(ep, grp.size):
                j = (grp.j0 // 2 if ep.is_paired else grp.j0) + k
                for off, rows, target, r in self._pieces(out, grp):
                    prog.store(acc_row=tiles.tile(t) + off,
                               ext_addr=target.addr + r * target.stride + target.elem * j * c,
                               rows=rows, row_bytes=target.elem * min(c, N - j * c),
                               ext_stride=target.stride, to_bf16=target.dtype == "bf16", **first)
                    first = {}
                    emitted = True
                if each:
                    first = dict(pop_prev=True, vector=True)
        return emitted

    def transposed_blocks(self, grp):
        """The transposed blocks of a group: (result tile, output tile, row
        offset in the group, height, VMEM slot block, operand, first column in
        it), each block at most ``vmem_row_elems`` rows of one piece of the
        output (so that its first row lands in element 0 of its VMEM rows)."""
        op, E = self.placed[grp.op].op, self.config.vmem_row_elems
        out, blocks, slot = op.c, [], 0
        for t, k in out_tiles(op.epilogue, grp.size):
            for off, rows, target, r in self._pieces(out, grp):
                for b in range(0, rows, E):
                    blocks.append((t, k, off + b, min(E, rows - b), slot, target, r + b))
                    slot += 1
        return blocks

    def transposed_stores(self, prog, grp, blocks, vmem, each=False):
        """The transposed blocks in VMEM to rows j*cols.. of the op's c (or
        of a piece of it), their columns; the first pops the vector
        engine's token, or with `each` every one pops its block's."""
        op, c = self.placed[grp.op].op, self.config.cols
        ep, N = op.epilogue, op.out_cols
        first = dict(pop_prev=True, vector=True)
        for t, k, off, height, slot, target, col in blocks:
            j = (grp.j0 // 2 if ep.is_paired else grp.j0) + k
            prog.store(vmem_row=vmem + slot * c, rows=min(c, N - j * c), row_bytes=2 * height,
                       ext_addr=target.addr + j * c * target.stride + 2 * col,
                       ext_stride=target.stride, **first)
            first = dict(pop_prev=True, vector=True) if each else {}

    hold = False
    scratch_token = False    # the last epilogue's STOREs push a store->vector token

    def due_rows(self, n):
        """Vector rows of the pending epilogues due by step n."""
        due = 0.0
        for e in self.pending:
            span = e.last - e.first + 1
            due += e.rows if n >= e.last else e.rows * max(0, n - e.first + 1) / span
        return due

    def drain(self, prog, n=None):
        """Emit the pending epilogue instructions due by step n (all with
        None). A group's instructions are spread over the next group's steps
        in proportion to their rows, so that the vector engine's queue holds
        about the work the array does meanwhile: the chip issues in program
        order, and a full queue would hold up the array's instructions.
        Nothing while `hold` is set (a loop body being built)."""
        while self.pending and not self.hold:
            entry = self.pending[0]
            if n is None or n >= entry.last:
                due = len(entry.words)
            else:
                share = entry.total * (n - entry.first + 1) / (entry.last - entry.first + 1)
                due = bisect.bisect_right(entry.cumulative, share)
            if due > entry.done:
                prog.words += entry.words[entry.done:due]
                prog.text += entry.text[entry.done:due]
                entry.done = due
            if entry.done < len(entry.words):
                return
            self.pending.popleft()
