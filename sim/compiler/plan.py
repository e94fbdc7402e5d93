"""Tiling and on-chip placement of one matmul (docs/compiler.md).

K is cut into ``rows``-deep tiles (t), N into ``cols``-wide tiles (j), M into
blocks of ``Mb`` rows. N tiles are taken ``G`` at a time (a group), so that an
activation tile, loaded once, serves G MATMULs. A ring of `RING_SLOTS` VMEM
weight slots lets the loads run that many steps ahead of the array.
"""

import math
from dataclasses import dataclass

from mxu.hdl.isa import DmaInstr, MatmulInstr

from .epilogue import epilogue_param_rows, epilogue_scratch
from .layerops import layer_op
from .operands import QUANT_LEAD, quant_lead

__all__ = ["RING_SLOTS", "QUANT_LEAD", "quant_lead", "MAX_GROUP", "OpPlan", "plan_op", "max_k_tiles",
           "ceil_div", "unit_tiles", "ring_shared", "lead", "quant_units", "ring_rows", "chunk_tiles",
           "strip_chunks"]

RING_SLOTS = 4
MAX_GROUP = 16     # N tiles per group: keeps a group's loop body within the expander
# An op of at most this many groups (not a row-wise one) takes chunks half as
# long (`chunk_tiles`): a whole strip's chunk of a short op (SmolLM2's Q, K and
# V at K = 576) takes about the lead's steps, and its loads then waited for
# the array at every group's start (one Q4_1 layer's attention program:
# 35,030 -> 32,234 cycles at batch 1, 86,011 -> 80,935 at batch 16).
FEW_GROUPS = 4
QUANT_GROUP = 8    # the fewest N tiles per group of quantized weights (`_quant_group_size`)
# Rows one MATMUL or one DMA descriptor moves: the narrower of the two fields.
_MAX_ROWS = min((1 << MatmulInstr.as_shape()["m_rows"].width) - 1,
                (1 << DmaInstr.as_shape()["rows"].width) - 1)


def ceil_div(a, b):
    return -(-a // b)


@dataclass(frozen=True)
class OpPlan:
    """How one matmul is cut (sizes in rows). VMEM: `a_buffers` activation blocks
    of ``Mb * KT`` rows (two, or more when a block is shorter than the weight
    ring's lead). Accumulator: two groups of output rows, two groups of
    bias blocks for a matrix bias, one bias row per N tile for a row bias."""
    M: int
    K: int
    N: int
    KT: int          # K tiles
    NT: int          # N tiles
    Mb: int          # rows per M block
    G: int           # N tiles per group
    a_buffers: int   # activation block buffers, used in turn (1 when M is one block)
    bias: str        # "none", "row" or "matrix"
    epilogue: str = None   # the kind of a fused `Epilogue`, or None
    t_rows: int = 0        # VMEM rows of one group of a transposed result
    resident: bool = False # the residual is on the chip already (a hand-off): no buffers
    row_tiles: int = 0     # tiles of one row of the epilogue's row operand (0: none)
    paired: bool = False   # a paired epilogue: groups take N tiles two by two
    hide: int = 1          # N tiles per group that hide the array's latency (see `rest`)

    @property
    def blocks(self):
        return ceil_div(self.M, self.Mb)

    @property
    def rest(self):
        """N tiles per group after a block's first: its activations are in VMEM
        by then, so one tile per group is enough, and the tiles finish one by
        one, which spreads their stores (the last group's stores are the run's
        tail). Tiny K keeps G (a matrix bias buffer must last the ring's steps)."""
        if self.epilogue is not None:
            return self.G       # an epilogue's buffers and scratch are laid out for G tiles
        # K tile t+1 of an output tile is seeded with t's partial sums: with
        # short blocks (a decode step's few rows) a group of one tile would
        # wait the array's whole latency at every step; `hide` tiles cover it.
        return min(self.G, self.hide) if self.KT >= RING_SLOTS else self.G

    def groups_of_block(self, last=False):
        """(first N tile, tiles) of each group of an M block. The `last` block
        of an element-wise epilogue ends in ever smaller groups, down to
        `hide` tiles: the vector unit's work on the final group is the op's
        tail, which nothing overlaps."""
        out = [(0, min(self.G, self.NT))]
        j = out[0][1]
        while j < self.NT:
            out.append((j, min(self.rest, self.NT - j)))
            j += out[-1][1]
        if last and self.epilogue is not None and not layer_op(self.epilogue).row_wise:
            # Never below the tiles that hide the array's latency: a group of
            # one tile of a few rows would wait for it at every K tile.
            unit = 2 if self.paired else 1
            least = max(unit, ceil_div(self.hide, unit) * unit)
            j, size = out.pop()
            while size > unit:
                half = size // 2 // unit * unit
                if half < least:
                    break
                out.append((j, half))
                j, size = j + half, size - half
            out.append((j, size))
        return out

    @property
    def groups_per_block(self):
        return len(self.groups_of_block())

    @property
    def steps(self):
        return self.blocks * self.KT * self.NT

    @property
    def vmem_rows(self):
        return self.a_buffers * self.Mb * self.KT

    @property
    def out_buffers(self):
        """Output buffers (groups) in flight: two, or an epilogue's own count;
        one more for a head-wise epilogue's groups of one head (a prefill's),
        so that a group does not wait for the stores of the one two before,
        which are spread to the end of the group between."""
        if self.epilogue is None:
            return 2
        desc = layer_op(self.epilogue)
        return desc.buffers + int(desc.head_wise and self.G < self.NT)

    @property
    def out_rows(self):
        return self.out_buffers * self.G * self.Mb

    @property
    def acc_rows(self):
        bias = {"none": 0, "row": self.NT, "matrix": 2 * self.G * self.Mb}[self.bias]
        return self.out_rows + bias + self.epilogue_rows

    @property
    def scratch_rows(self):
        """The vector unit's working rows (shared by a fused segment)."""
        if self.epilogue is None:
            return 0
        return epilogue_scratch(self.epilogue, self.NT, self.G, self.Mb)[1]

    @property
    def residual_rows(self):
        """Rows of one residual buffer (one per output buffer)."""
        if self.epilogue is None or self.resident:
            return 0
        return self.row_tiles * self.Mb

    @property
    def param_rows(self):
        return 0 if self.epilogue is None else epilogue_param_rows(self.epilogue, self.NT, self.M)

    @property
    def epilogue_rows(self):
        return self.scratch_rows + self.param_rows + self.out_buffers * self.residual_rows


def unit_tiles(config, b):
    """K tiles of one block of weights `b` (the finest cut of a quantized
    strip, where a K split may cut): ``block // rows``, or one tile when a
    tile holds whole blocks. Other weights: 1."""
    block = getattr(b, "block", None)
    return 1 if block is None else max(1, block // config.rows)


# bf16 weights of an op of at most this many rows and steps (a decode step's
# attention heads: a KV group's query rows against its keys) have a ring of
# `SHORT_RING_SLOTS`.
SHORT_ROWS = 4
SHORT_STEPS = 64
SHORT_RING_SLOTS = 2 * RING_SLOTS


def lead(op, config):
    """Steps the loads run ahead of the array (the weight ring's `W`) for
    `op` (a `MatmulOp`, or its weights operand): `quant_lead` for quantized
    weights; `SHORT_RING_SLOTS` for an op of at most `SHORT_ROWS` rows,
    whose MATMULs last about the array's latency (some 64 cycles on 3 rows
    of the 16x16 array) against a weight tile's 33 to 38 cycles of loading:
    with `RING_SLOTS` a head's last tiles waited for its first MATMULs to
    free their slots (not for an epilogue with a row operand,
    `_has_row_operand`); else `RING_SLOTS`."""
    b = getattr(op, "b", op)
    if getattr(b, "block", None) is not None:
        return quant_lead(config)
    M, K, N = (getattr(op, x, None) for x in "MKN")
    if M is None or M > SHORT_ROWS or _has_row_operand(op):
        return RING_SLOTS
    steps = ceil_div(K, config.rows) * ceil_div(N, config.cols)
    return SHORT_RING_SLOTS if steps <= SHORT_STEPS else RING_SLOTS


def _has_row_operand(op):
    """Whether `op`'s epilogue reads a row operand (RoPE's table, a residual):
    its buffer is refilled by the loads `ring` steps on, so a short op's K
    tiles times its group must outnumber the ring (`plan_op`'s `short`); a
    deeper ring would leave a small chip's RoPE projection no plan."""
    ep = getattr(op, "epilogue", None)
    return ep is not None and ep.desc.row_operand is not None


def _quant_group(config, op):
    """The most N tiles a group of `op` (a `MatmulOp`, or its weights) may
    take: every one for a row-wise epilogue, else at most `MAX_GROUP`."""
    b = getattr(op, "b", op)
    ep = getattr(op, "epilogue", None)
    NT = ceil_div(b.cols, config.cols)
    return NT if ep is not None and ep.row_wise else min(NT, MAX_GROUP)


def strip_chunks(KT, chunk, unit):
    """[(first K tile, tiles)] of the quantized LOADs of one strip of KT
    tiles: `chunk` tiles each, the last one what is left (whole blocks of
    `unit` tiles)."""
    out, t = [], 0
    while t < KT:
        out.append((t, min(chunk, ceil_div(KT - t, unit) * unit)))
        t += out[-1][1]
    return out


def _units_for(config, G, chunks):
    """Ring slots a group of G strips cut into `chunks` needs: the units of
    the chunk the array reads and of the next one, which loads meanwhile
    (`_Segment._units`), and `QUANT_LEAD` steps of slack at the pace of the
    shortest chunk."""
    return 2 * G + ceil_div(quant_lead(config), min(t for _, t in chunks))


# The most steps of a quantized group's LOOP iteration (`_Segment.loop_period`,
# ``lcm(G, chunk)``): its t rows are inner LOOPs, so that many steps still
# make a body of a few dozen instructions.
_MAX_PERIOD = 160


def chunk_tiles(config, op, G=None, slots=None, most=None):
    """K tiles one quantized LOAD of `op`'s weights brings (0 for bf16
    weights): a multiple of `unit_tiles`, as many as the ring allows. A
    LOAD costs its beats plus a fixed start (docs/memory.md, "Quantized
    loads"), so long ones keep the bus busy. For groups of `G` N tiles
    (default: the most `op` may have) and a ring of `slots` units of at
    most `most` tiles (default: one that takes at most half of VMEM, seven
    eighths when the op has a block of at most `rows` rows, its
    activations being few). At most ``quant_lead - rows / 2`` tiles (a
    chunk's loads are that many steps apart, and each must find its token
    already free: docs/compiler.md, "Quantized weights"), with ``lcm(G,
    chunk)`` at most `_MAX_PERIOD` (a LOOP iteration), and the strip cut
    into chunks of nearly equal size; half as long for an op of at most
    `FEW_GROUPS` groups, or whose array is the bound (M at least a tile's
    beats: a batch-16 decode step's FFN, 208,362 -> 206,224 cycles with its
    output projection on one Q4_1 layer)."""
    b = getattr(op, "b", op)
    if getattr(b, "block", None) is None:
        return 0
    unit = unit_tiles(config, b)
    G = _quant_group(config, op) if G is None else G
    KT = ceil_div(ceil_div(b.rows, config.rows), unit) * unit
    M = getattr(op, "M", 1)
    budget = config.vmem_rows * (7 if M <= config.rows else 4) // 8
    longest = quant_lead(config) - config.rows // 2 if most is None else most
    few = ceil_div(ceil_div(b.cols, config.cols), G) <= FEW_GROUPS
    if most is None and G <= MAX_GROUP and (few or M >= b.tile_beats(config.rows,
                                                                      config.axi_data_bytes)):
        longest //= 2

    def fits(c):
        if c > longest or c * G // math.gcd(c, G) > _MAX_PERIOD:
            return False
        need = _units_for(config, G, strip_chunks(KT, c, unit))
        return (need * c * config.rows <= budget) if slots is None else need <= slots

    best = unit
    for c in range(unit, min(KT, longest) + 1, unit):
        if fits(c):
            best = c
    even = ceil_div(ceil_div(KT, ceil_div(KT, best)), unit) * unit
    return even if fits(even) else best


def quant_units(config, op):
    """Units (slots of `chunk_tiles` K tiles) of the quantized weight ring
    that `op` (a `MatmulOp`, or its weights operand) may need; 0 for bf16
    weights."""
    b = getattr(op, "b", op)
    if getattr(b, "block", None) is None:
        return 0
    KT = ceil_div(b.rows, config.rows)
    return _units_for(config, _quant_group(config, op),
                      strip_chunks(KT, chunk_tiles(config, op), unit_tiles(config, b)))


def ring_shared(config, ops):
    """Whether the quantized weights of `ops` (`MatmulOp`s of one segment)
    fit one ring as `_Segment._units` builds it: slots of the longest chunk,
    as many as the largest of their rings holds, each op's groups cut into
    chunks that need no more slots than that. Two ops whose rings differ in
    shape (a row-wise epilogue's group of 64 N tiles in chunks of 8 beside
    a group of 16 in chunks of 40: Gemma 3's Q and K projections) may not."""
    quantized = [op for op in ops if getattr(op.b, "block", None) is not None]
    if len(quantized) < 2:
        return True
    most = max(chunk_tiles(config, op) for op in quantized)
    cap = max(ring_rows(config, op) for op in quantized) // (most * config.rows)
    for op in quantized:
        G, unit = _quant_group(config, op), unit_tiles(config, op.b)
        KT = ceil_div(ceil_div(op.b.rows, config.rows), unit) * unit
        c = chunk_tiles(config, op, G, cap, most)
        if _units_for(config, G, strip_chunks(KT, c, unit)) > cap:
            return False
    return True


def ring_rows(config, op=None):
    """VMEM rows of the weight ring of `op` (a `MatmulOp`, or its weights
    operand), below everything else: `RING_SLOTS` bf16 tiles, or for
    quantized weights their `quant_units` units of ``chunk_tiles * rows``
    rows."""
    b = getattr(op, "b", op)
    if getattr(b, "block", None) is None:
        return lead(op, config) * config.rows
    return quant_units(config, op) * chunk_tiles(config, op) * config.rows


def _pow2_floor(n):
    return 1 << (n.bit_length() - 1)


def plan_op(config, M, K, N, bias="none", vmem_rows=None, acc_rows=None, ring=RING_SLOTS,
            epilogue=None, resident=False, transposed=None, pieces=1, paired=False, row_width=None,
            w_beats=None, head=None):
    """The largest M block (then the widest group) whose buffers fit in
    `vmem_rows` VMEM rows (after the weight ring) and `acc_rows` accumulator
    rows; None if even one activation row does not fit. `epilogue`: the kind
    of a fused `Epilogue`; a row-wise one needs every N tile in one group.
    `resident`: an add_layer_norm's residual is in accumulator rows already
    (a hand-off), so it needs no buffers and no loads. `transposed`: the
    result goes out through the transpose path (default: a "transpose"
    epilogue), in `pieces` pieces (a `Scatter`); `paired`: a paired epilogue
    (groups of whole pairs of tiles); `row_width`: the columns of the
    epilogue's row operand (default: N for one that has one); `w_beats`: the
    bus beats of one weight tile (default: a bf16 tile's; quantized weights
    pass theirs, `QuantOperand.tile_beats`); `head`: the width of a
    head-wise epilogue's heads (`LayerOp.head_wise`), whose groups are then
    one head each when M is more than `rows` (a prefill) and the weights
    are quantized (with bf16 weights Gemma 3 270M's prefill was 117 k
    cycles slower so)."""
    r, c = config.rows, config.cols
    quantized = w_beats is not None
    vmem_rows = config.vmem_rows - ring * r if vmem_rows is None else vmem_rows
    acc_rows = config.acc_rows if acc_rows is None else acc_rows
    KT, NT = ceil_div(K, r), ceil_div(N, c)
    bb = config.axi_data_bytes
    w_beats = r * ceil_div(2 * c, bb) if w_beats is None else w_beats
    desc = layer_op(epilogue) if epilogue is not None else None
    # Cycles from a MATMUL's seed read to its result row in the accumulator.
    latency = r * config.mac_stages + c + 8
    transposed = epilogue == "transpose" if transposed is None else transposed
    paired = bool(paired or (desc is not None and desc.paired))
    row_tiles = 0
    if desc is not None and desc.row_operand is not None:
        row_tiles = ceil_div(N // (2 if paired else 1) if row_width is None else row_width, c)

    def plan(Mb, G):
        if epilogue is not None and bias == "matrix":
            return None      # an epilogue's buffers take the place of the bias blocks
        blocks = ceil_div(M, Mb)
        # Activation buffers in a ring: a buffer is refilled `a_buffers` blocks
        # later, which must be at least `ring` steps on (two buffers unless the
        # blocks are shorter than that).
        buffers = 1 if blocks == 1 else min(blocks, max(2, ceil_div(ring, KT * NT) + 1))
        out_g = G // 2 if paired else G
        t_rows = (out_g * (ceil_div(Mb, config.vmem_row_elems) + pieces - 1) * c
                  if transposed else 0)
        # Quantized weights without an epilogue, a decode step's block: every
        # group as wide as the first (`_quant_group_size`), not just wide
        # enough to hide the latency.
        hide = G if quantized and epilogue is None and Mb <= r else hide_for(Mb)
        p = OpPlan(M, K, N, KT, NT, Mb, G, buffers, bias, epilogue, t_rows, resident, row_tiles,
                   paired, hide)
        fits = (p.vmem_rows + p.out_buffers * t_rows <= vmem_rows
                and p.acc_rows <= acc_rows)
        # A row operand's buffer is refilled by the loads of the step `ring`
        # after its group's first (docs/vpu.md, "Fused epilogues").
        short = row_tiles and KT * G <= ring and not resident
        return p if fits and not short and _spaced(p, ring) else None

    def hide_for(Mb):
        """Tiles a group needs so that a tile's next K step finds its partial
        sums written: a step lasts about max(Mb, weight_load_cycles, w_beats)
        cycles (a short tile waits for its weights, which enter the array
        `weight_rows_per_cycle` rows a cycle and come over the bus in
        `w_beats` beats). The bus beats count up to `rows` only: fewer tiles
        a group than that (2 instead of 4 for bf16 tiles on the 128-bit bus)
        made longer programs, whose fetch cost a batch-1 decode step's layer
        more cycles than the shorter groups saved (docs/compiler.md)."""
        step = max(Mb, config.weight_load_cycles, min(w_beats, r))
        return min(NT, MAX_GROUP, 1 << (ceil_div(latency, step) - 1).bit_length())

    # Start from the largest block whose activations can fit at all.
    Mb = min(M, _MAX_ROWS, max(1, vmem_rows // KT if M <= vmem_rows // KT else vmem_rows // (2 * KT)))
    if quantized and desc is not None and desc.row_wise and not desc.chained:
        Mb = min(Mb, _tail_block(r, w_beats))
    while Mb >= 1:
        # Activation beats per tile against compute cycles per MATMUL: enough N
        # tiles per group that the load engine keeps ahead of the array; a power
        # of two so that group and ring line up in loops. Narrower groups save
        # accumulator rows; wider ones last longer (a matrix bias with few K
        # tiles needs that), so both are tried before the block shrinks.
        act_beats = Mb * ceil_div(2 * r, bb)
        hide = hide_for(Mb)
        want = min(NT, MAX_GROUP, max(hide, ceil_div(act_beats, max(1, Mb - w_beats))))
        if desc is not None and desc.row_wise:
            sizes = [NT]
            per = head // c if head and head % c == 0 else 0
            if desc.head_wise and quantized and M > r and per and NT % per == 0 \
                    and per <= MAX_GROUP:
                sizes = [per]
        else:
            # Wide groups for the heavier ops: fewer, longer VECTORs (each pays
            # the pipeline's latency once).
            least = desc.min_group if desc is not None else 1
            sizes = _group_sizes(min(NT, MAX_GROUP, max(least, 1 << (want - 1).bit_length())), NT)
            if paired:
                sizes = [g for g in sizes if g % 2 == 0] or [2]
            if quantized and Mb <= r:
                first = _quant_group_size(KT, NT, max(least, hide), paired)
                sizes = [first] + [g for g in sizes if g != first]
        for G in sizes:
            p = plan(Mb, G)
            if p:
                # Blocks of equal size: a short last block would stream below
                # `rows` activation rows and leave bubbles.
                even = ceil_div(M, p.blocks)
                return plan(even, G) or p
        Mb = Mb // 2 if Mb > 1 else 0
    return None


def _tail_block(rows, w_beats):
    """The most rows per M block of a row-wise epilogue on quantized
    weights: the fewest (`rows` times a power of two) whose step outlasts a
    weight tile's `w_beats` by a fifth. A row-wise epilogue starts when its
    block's last K tile is done, so the last block's epilogue (passes x Mb
    x NT cycles: 38,400 for a 64-row norm_add_rms_norm over 640 columns) is
    the op's tail, which nothing overlaps; shorter blocks shorten it, and
    each block loads the weights again, which a quantized tile's few beats
    leave the bus room for (a bf16 tile's 32 beats do not: its blocks are
    left as they are). Softmaxes (`chained`) are not cut: their passes on
    fewer rows wait on the vector unit's latency."""
    Mb = rows
    while Mb * 5 < w_beats * 6:
        Mb *= 2
    return Mb


def _quant_group_size(KT, NT, least, paired):
    """N tiles per group of quantized weights in a decode step's block: the
    fewest from ``max(least, QUANT_GROUP)`` to `MAX_GROUP` (even for a
    paired epilogue) that divide KT and leave no last group narrower than
    half the least, else ``max(least, QUANT_GROUP)``. A group's quantized
    LOADs, one per chunk of a strip (a whole strip of KT tiles when it fits,
    `chunk_tiles`), then fall at the same N tile of the t rows they fall
    in, so that its LOOP iteration is a few t rows and its program short:
    the program is fetched over the bus that brings the weights, and each
    outer LOOP's body is fetched before its first iteration issues
    (docs/compiler.md, "Quantized weights"). Narrower groups (4 N tiles
    hide the array's latency at batch 1 for a Q8_0 tile's beats) made
    longer programs and more group starts."""
    low = max(least, QUANT_GROUP)
    for g in range(low, MAX_GROUP + 1):
        rest = NT % g
        if KT % g == 0 and not (paired and g % 2) and (g >= NT or not rest or rest >= low // 2):
            return min(g, NT)
    return min(low, NT)


def _group_sizes(first, NT):
    """`first`, the powers of two below it, then the wider ones up to the limit."""
    sizes, g = [], first
    while g >= 1:
        sizes.append(g)
        g = _pow2_floor(g - 1) if g > 1 else 0
    g = first * 2
    while g // 2 < min(NT, MAX_GROUP):
        sizes.append(min(g, NT, MAX_GROUP))
        g *= 2
    return list(dict.fromkeys(sizes))


def _spaced(p, ring):
    """Whether buffers are reused late enough. The loads of step n wait only for
    MATMUL n - ring; an activation buffer is reused two blocks later, a bias
    block two groups later, so what lies in between must last that long: the
    bias block of group g (read by its first s_g steps) is refilled for group
    g + 2, which starts KT * (s_g + s_g+1) steps after g."""
    if p.blocks > p.a_buffers and (p.a_buffers - 1) * p.KT * p.NT < ring:
        return False
    if p.bias != "matrix":
        return True
    per_block = [size for _, size in p.groups_of_block()]
    sizes = per_block * min(p.blocks, 2)          # the pattern repeats block after block
    reused = min(len(sizes), len(per_block) * p.blocks) - 2
    return all(p.KT * (sizes[g] + sizes[g + 1]) - sizes[g] + 1 >= ring for g in range(reused))


def max_k_tiles(config, M, N, bias="none", b=None):
    """The most K tiles one matmul of M x (KT*rows) x N can hold (0 if none):
    the largest KT for which this and every smaller chunk plan (a split K's
    last chunk may be short). `b`: the weights operand (quantized weights
    have a ring of their own, `ring_rows`)."""
    extra = dict(vmem_rows=config.vmem_rows - ring_rows(config, b), ring=lead(b, config))

    def fits(kt):
        return plan_op(config, M, kt * config.rows, N, bias, **extra)

    lo, hi = 0, max(1, config.vmem_rows)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    while lo and not all(fits(kt) for kt in _smaller(lo)):
        lo -= 1
    return lo


def _smaller(kt):
    """The chunk sizes below `kt` worth checking: the small ones, where a matrix
    bias is hardest to space."""
    return range(1, min(kt, 2 * RING_SLOTS) + 1)
