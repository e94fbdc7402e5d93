"""The layer ops the vector unit runs, one descriptor each, and their
registry (docs/compiler.md, "Layer ops").

A transformer layer op -- softmax, LayerNorm, RMSNorm, GELU, SiLU(gate) *
up, GELU-tanh(gate) * up, QK-norm, RoPE (of pairs or of halves, NEOX), a
residual add with its norms, a transpose -- is known to
the compiler through one `LayerOp` registered here (`register`,
`LAYER_OPS`): the operands it reads besides the matmul's result, the
accumulator rows it works in, whether it needs a whole row (every N tile of
an M block in one group), how many output buffers a fused segment gives it,
about how many vector passes a row costs, the VECTORs it emits on a group
of tiles (`emit`) and, if it has one, its unfused form on tensors in
external memory (`vector_form` and the `VectorOp` hooks), and the name of
its contract: the function of that name in the golden VPU form
(`verif/vpu.py`, docs/vpu.md: the same fp32 sequence in NumPy, which the
tests hold the chip to bit for bit) and in `mxu.hdl.hostops` (its host
form). The planner (`plan.py`), the segment compiler (`matmul.py`,
`epilogue.py`), the lowering (`lower.py`), the `VectorOp` compiler
(`vectorop.py`) and the runtime dispatch through it: adding an op is its
descriptor here, its golden function and its host function.

Operands an op reads, besides the result ``r`` (an M x N fp32 matrix in
accumulator tiles):

* ``params``: rows shared by every row of ``r`` (a softmax's bias row,
  LayerNorm's gamma/beta/ones, RMSNorm's gamma), loaded once per op into
  ``param_rows`` accumulator rows -- or, for a causal softmax, its whole
  mask, a bias row per row of ``r`` (``per_row``: the mask is the op's,
  loaded once however many groups read it);
* ``other``: a row operand, one row per row of ``r`` (a residual, RoPE's
  cos|sin table), loaded with each group into a buffer of its own; its width
  is N (``row_operand = "same"``) or a table whose period divides N
  (``"table"``).

A *paired* op (SiLU(gate) * up, RoPE folded into the weights) reads two
result tiles for each output tile: the matmul's N tiles alternate (tile 2j
and 2j+1 make output tile j), so its output has half the matmul's columns.
"""

import math
from dataclasses import dataclass

import numpy as np

from mxu.hdl.isa import VpuOp

from .operands import Operand
from .vector import Tiles, move_tiles, tile_moves

__all__ = ["LayerOp", "Group", "LAYER_OPS", "layer_op", "register", "EPILOGUE_KINDS",
           "VECTOR_KINDS", "COPY"]

_FLT_MAX = float(np.finfo(np.float32).max)

# The compiler's own kind: no pass of its own, only the hand-off passes of a
# plain matmul whose result stays in VMEM (docs/compiler.md).
COPY = "copy"


@dataclass(frozen=True)
class Group:
    """One group of a fused epilogue as its op's emitter sees it.

    ep : the `Epilogue`; x : the group's result `Tiles` (updated in place; its
    first tile is the op's tile `j0`, its first row the result's row `m0`);
    params : the accumulator row of the op's parameter rows (`param_loads`);
    at : {region: accumulator row} of its working rows (`scratch`);
    residual : the accumulator row of the group's row operand;
    on_sum : called with the emitter when an op with two outputs has its
    first one final (its STOREs may go while the rest runs), or None;
    sum_by_tile : add_rms_norm adds its row operand with one VECTOR a tile
    (on_sum then finds them with its tiles' last writers), so that each
    tile's STORE can follow its own add.
    summed : add_rms_norm's adds, squares and tree pairs are done (a chunked
    group's parts, `FusedGroups.norm_part`): only the row sums and the norm
    are left.
    """
    ep: object
    x: Tiles
    params: int
    at: dict
    residual: int
    j0: int = 0
    m0: int = 0
    on_sum: object = None
    sum_by_tile: bool = False
    summed: bool = False

    @property
    def count(self):
        """The op's N tiles (a row-wise op's group is every one of them)."""
        return -(-self.x.n // self.x.cols)


@dataclass(frozen=True)
class LayerOp:
    """What the compiler knows of one layer op kind (see the module docstring).

    name : the ``then=`` / `Epilogue` kind.
    golden : the function of the golden VPU form (`verif/vpu.py`) that is
        its contract on the chip, and of the same name in `mxu.hdl.hostops`
        its host form (docs/vpu.md).
    row_wise : a row's result needs the whole row (groups are every N tile).
    buffers : output buffers a fused segment of this kind cycles through.
    params : parameter rows per N tile (0: none).
    per_row : the parameters are a row per result row (M rows per N tile).
    row_operand : None, "same" (``other`` is M x N) or "table" (M x 2P: a
        period P of cos, then of sin; output column n uses column n mod P).
    paired : output tile j is made of result tiles 2j and 2j+1.
    may_pair : an `Epilogue` of this kind may ask to be paired (RoPE folded
        into the weights).
    passes : vector passes per row of a tile, about (for cycle estimates).
    outputs : where each output is stored from: "x" the group's tiles,
        "norm" the normalised copy in the op's scratch (add_rms_norm).
    min_group : the fewest N tiles a group takes (wide groups: fewer,
        longer VECTORs); 0 for row-wise ops.
    scaled : the result is multiplied by the op's ``scale`` first (one pass
        when it is not 1).
    transposes : its result is always written transposed; may_transpose :
        it may be (``transpose=True``).
    producer : its result, in the group's own tiles, may be handed to a
        later matmul from VMEM (docs/compiler.md, "Hand-offs").
    handoff_other : its row operand may come from VMEM (a residual).
    vector_regions : matrices of the chunk's shape a `VectorOp` of this kind
        works in (0: it has no VectorOp form, only the fused one).
    vector_grouped : a `VectorOp`'s rows share their parameter row by groups
        of ``group`` rows (chunks divide the group).
    unfused : the fused op has an unfused form (the matmul to fp32, then
        `vector_form`) for when its buffers do not fit.
    vector_transpose : a `VectorOp` of this kind may also write ``x.T``
        (``out_t``).
    chained : on a few rows a group's passes are one chain of dependent
        passes (a softmax's reductions): the compiler interleaves two groups.
    head_wise : a row-wise op whose row is heads as wide as its `params`
        (one gamma per head), each reduced alone: a prefill's groups may be
        one head (`plan_op`'s `head`), so that the last group's passes, the
        op's tail, cover one head instead of the whole row.
    """
    name: str
    golden: str
    row_wise: bool
    buffers: int = 3
    params: int = 0
    row_operand: str = None
    paired: bool = False
    may_pair: bool = False
    passes: int = 1
    outputs: tuple = ("x", "x")
    min_group: int = 1
    per_row: bool = False
    scaled: bool = False
    transposes: bool = False
    may_transpose: bool = False
    producer: bool = False
    handoff_other: bool = False
    vector_regions: int = 0
    vector_grouped: bool = False
    unfused: bool = False
    vector_transpose: bool = False
    chained: bool = False
    head_wise: bool = False

    # ---- the rows it needs ------------------------------------------------------
    def param_rows(self, count, M):
        """Accumulator rows of its parameters for an M x (count tiles) result."""
        return self.params * count * (M if self.per_row else 1)

    def scratch(self, count, G, Mb):
        """[(region, rows)] of the vector unit's working rows for groups of G
        tiles of Mb rows (count: the op's N tiles)."""
        return ()

    def operands(self, M, N, cols, given):
        """{operand: (rows, cols)} it reads for an M x N result (for a paired
        op, N is the output's width), "other" and/or "params". `given`:
        {operand: (rows, cols), or None when it is no matrix} of those the
        caller gave (a shape the op takes from its operand: a table's
        period; whether a softmax has its bias row)."""
        return {}

    def row_tiles(self, count, other_cols, cols):
        """Accumulator rows per M row of one row-operand buffer, in tiles."""
        if self.row_operand is None:
            return 0
        if self.row_operand == "same":
            return count
        return -(-other_cols // cols)

    def check(self, ep, cols, N):
        """Checks of an `Epilogue` of this kind on a result N wide (its
        output's width) beyond its operands' shapes."""

    # ---- the fused form -----------------------------------------------------------
    def param_loads(self, ep, base, cols):
        """The LOADs (keyword dicts) of its parameter rows into accumulator
        rows from `base`: `params` rows of ``ep.params``, a row per tile each,
        its whole tiles in one LOAD (a LOAD per tile, 36 for SmolLM2's
        RMSNorm gamma, held up a batch-16 decode step's first weight loads
        about 200 cycles at each add_rms_norm op's start)."""
        if not self.params or ep.params is None:
            return []
        count, full = -(-ep.params.cols // cols), ep.params.cols // cols
        loads = []
        for i in range(self.params):
            addr = ep.params.addr + i * ep.params.stride
            if full:
                loads.append(dict(acc_row=base + i * count, ext_addr=addr, rows=full,
                                  row_bytes=4 * cols, ext_stride=4 * cols))
            if count > full:
                row = Operand(addr + 4 * cols * full, 1, ep.params.cols - cols * full,
                              ep.params.stride, "fp32")
                loads += tile_moves(row, 0, 1, Tiles(base + i * count + full, 1, row.cols, cols))
        return loads

    def emit(self, emit, g):
        """Its VECTORs on the `Group` g (after the scale). Returns the `Tiles`
        each output is stored from: (c, extra)."""
        return g.x, g.x

    # ---- the unfused form: a `VectorOp` on tensors in external memory -------------
    def vector_operands(self, R, n, cols, group):
        """{"other" / "params": (name in messages, (rows, cols))} a `VectorOp`
        of this kind reads for an (R, n) x."""
        return {}

    def vector_loads(self, prog, op, r0, m, params, scratch):
        """The LOADs of a `VectorOp` chunk's parameters and row operand
        (rows r0 .. r0+m-1); returns their instruction indices."""
        return []

    def emit_vector(self, emit, op, x, params, scratch, spare):
        """A `VectorOp` chunk's VECTORs on `x` in place (after the scale):
        `params` the one-row matrix its parameters start at, `scratch` four
        matrices of x's shape, `spare` m spare rows."""

    def unfused_scratch(self, ep, width):
        """The scratch operands ``(rows, cols, dtype, fill)`` its unfused form
        needs besides the fp32 result."""
        return []

    def vector_form(self, ep, r, c, scratch):
        """The `VectorOp` fields (a dict) that apply it to the fp32 result `r`
        into `c` (and ``ep.extra``); `scratch` the `unfused_scratch` operands."""
        fp32 = c.dtype == "fp32"
        return dict(kind=self.name, x=r, out=c if fp32 else None, out_bf16=ep.extra if fp32 else c,
                    group=r.rows, scale=ep.scale, eps=ep.eps, **self.vector_reads(ep, scratch))

    def vector_reads(self, ep, scratch):
        """The `VectorOp`'s other and params of its unfused form."""
        return {}


# ---- the registry ------------------------------------------------------------------

LAYER_OPS = {}


def register(op):
    """Add the `LayerOp` `op` to `LAYER_OPS` (its name must be new); returns it."""
    if op.name in LAYER_OPS:
        raise ValueError(f"layer op {op.name!r} is registered twice")
    LAYER_OPS[op.name] = op
    return op


def layer_op(kind):
    """The `LayerOp` of `kind` (ValueError naming the known kinds)."""
    try:
        return LAYER_OPS[kind]
    except KeyError:
        raise ValueError(f"layer op kind must be one of {EPILOGUE_KINDS}, not {kind!r}") from None


def _bias_width(N, cols):
    return -(-N // cols) * cols


# ---- softmax -----------------------------------------------------------------------

class _Softmax(LayerOp):
    """``softmax(r * scale + bias)``: one bias row (0 or -inf, -inf past N)
    for every row, or none when nothing is masked and N is a multiple of cols."""

    def scratch(self, count, G, Mb):
        return (("spare", Mb), ("scratch", count * Mb))

    def operands(self, M, N, cols, given):
        if "other" not in given:
            if N % cols:
                raise ValueError(f"a softmax without a bias row (other) needs N ({N}) to be "
                                 f"a multiple of the chip's cols ({cols})")
            return {}
        return {"other": (1, _bias_width(N, cols))}

    def param_loads(self, ep, base, cols):
        if ep.other is None:
            return []
        return [dict(acc_row=base, ext_addr=ep.other.addr, rows=ep.other.cols // cols,
                     row_bytes=4 * cols, ext_stride=4 * cols)]

    def emit(self, emit, g):
        x = g.x
        bias = Tiles(g.params, 1, x.n, x.cols) if g.ep.other is not None else None
        emit.softmax(x, bias, x, x.like(g.at["scratch"]), g.at["spare"])
        return x, x

    def vector_operands(self, R, n, cols, group):
        if R % group:
            raise ValueError(f"group ({group}) must divide the {R} rows")
        return {"other": ("bias", (R // group, _bias_width(n, cols)))}

    def vector_loads(self, prog, op, r0, m, params, scratch):
        count = params.count
        prog.load(acc_row=params.base, ext_addr=op.other.addr + (r0 // op.group) * op.other.stride,
                  rows=count, row_bytes=4 * params.cols, ext_stride=4 * params.cols)
        return [len(prog.words) - 1]

    def emit_vector(self, emit, op, x, params, scratch, spare):
        emit.softmax(x, Tiles(params.base, 1, op.x.cols, x.cols), x, scratch[0], spare)

    def unfused_scratch(self, ep, width):
        # An unmasked softmax's VectorOp takes a bias all the same: a row of zeros.
        return [(1, width, "fp32", 0.0)] if ep.other is None else []

    def vector_reads(self, ep, scratch):
        return {"other": scratch[0] if ep.other is None else ep.other}


class _MaskedSoftmax(_Softmax):
    """A causal softmax: a bias row per result row, the whole mask the op's
    parameters (loaded once however many groups read it)."""

    def operands(self, M, N, cols, given):
        return {"other": (M, _bias_width(N, cols))}

    def param_loads(self, ep, base, cols):
        return tile_moves(ep.other, 0, ep.other.rows,
                          Tiles(base, ep.other.rows, ep.other.cols, cols))

    def emit(self, emit, g):
        # The mask's rows of this group: row m0 + i of tile t at params + t*M + m0 + i.
        x, M = g.x, g.ep.other.rows
        for t in range(x.count):
            emit.op(VpuOp.ADD, x.tile(t), x.m, x.tile(t), b_row=g.params + t * M + g.m0)
        emit.softmax(x, None, x, x.like(g.at["scratch"]), g.at["spare"])
        return x, x

    def vector_form(self, ep, r, c, scratch):
        # The VectorOp softmax with a bias row per row.
        return dict(super().vector_form(ep, r, c, scratch), kind="softmax", group=1)


# ---- the norms -----------------------------------------------------------------------

class _Norm(LayerOp):
    """A row norm: `params` parameter rows of N, and with a row operand (a
    residual, M x N) the norm of ``r + other``; m spare rows and a matrix of
    squares to work in."""

    def scratch(self, count, G, Mb):
        return (("spare", Mb), ("sq", count * Mb))

    def operands(self, M, N, cols, given):
        return dict({"params": (self.params, N)},
                    **({"other": (M, N)} if self.row_operand else {}))


class _LayerNorm(_Norm):
    """LayerNorm (`params`: gamma, beta and a row of ones, 3 x N); with a row
    operand, of ``r + other``."""

    def emit(self, emit, g):
        x = g.x
        if self.row_operand:
            emit.map(VpuOp.ADD, x, x, b_row=g.residual)
        gamma, beta, ones = (Tiles(g.params + i * g.count, 1, x.n, x.cols) for i in range(3))
        # x - mean overwrites x: the same values as a separate matrix, in fewer rows.
        emit.layer_norm(x, gamma, beta, g.ep.eps, x, (x, x.like(g.at["sq"])), g.at["spare"], ones)
        return x, x

    def vector_operands(self, R, n, cols, group):
        if self.row_operand:
            return {"other": ("y", (R, n)), "params": ("layer_norm_params", (3, n))}
        return {"other": ("layer_norm_params", (3, n))}

    def vector_loads(self, prog, op, r0, m, params, scratch):
        pair = op.params if self.row_operand else op.other
        count, loads = params.count, []
        for i in range(3):
            row = Operand(pair.addr + i * pair.stride, 1, pair.cols, pair.stride, "fp32")
            loads += move_tiles(prog, "load", row, 0, 1, params.like(params.base + i * count), {})
        if self.row_operand:
            loads += move_tiles(prog, "load", op.other, r0, m, scratch[2], {})
        return loads

    def emit_vector(self, emit, op, x, params, scratch, spare):
        if self.row_operand:
            emit.map(VpuOp.ADD, x, x, b_row=scratch[2].base)
        gamma, beta, ones = (params.like(params.base + i * params.count) for i in range(3))
        emit.layer_norm(x, gamma, beta, op.eps, x, scratch[:2], spare, ones)

    def vector_reads(self, ep, scratch):
        if self.row_operand:
            return {"other": ep.other, "params": ep.params}
        return {"other": ep.params}


# ---- RMSNorm -----------------------------------------------------------------------

def emit_rms_norm(emit, x, gamma, eps, dst, sq, row, summed=False):
    """RMSNorm of `x` (a `Tiles`) into `dst` (may be x, or sq): ``ss =
    tree_sum(x*x)``, ``inv = rsqrt(ss * (1/n) + eps)``, ``(x * inv) * gamma``
    (the last two passes tile by tile, alternating: each tile of the norm
    is final early, and its STORE can go).
    The spare lanes of a partial tile hold +0 (a matmul's padded columns, the
    DMA's padding), so x*x adds nothing there. `sq`: x.count tiles; `row`: m
    spare rows; `gamma`: a one-row matrix. `summed`: the squares and the
    tree's pairs are in `sq` already (a chunked group's parts,
    `FusedGroups.norm_part`)."""
    r = Tiles(row, x.m, x.cols, x.cols)
    if not summed:
        emit.map(VpuOp.MUL, x, sq, b_row=x.base)
    emit.reduce("sum", sq, row, sq, squares=True, summed=summed)
    emit.op(VpuOp.MUL, row, x.m, row, scalar=float(np.float32(1 / x.n)))
    emit.op(VpuOp.ADD, row, x.m, row, scalar=float(np.float32(eps)))
    emit.op(VpuOp.RSQRT, row, x.m, row)
    return emit.per_tile_pairs(
        lambda t: emit.op(VpuOp.MUL, x.tile(t), x.m, dst.tile(t), b_row=r.base),
        lambda t: emit.op(VpuOp.MUL, dst.tile(t), x.m, dst.tile(t), b_row=gamma.tile(t),
                          broadcast=True),
        x.count)


class _RmsNorm(_Norm):
    """RMSNorm (`params`: gamma); with a row operand (add_rms_norm), c gets
    ``r + other`` and the extra output its RMSNorm."""

    def emit(self, emit, g):
        x = g.x
        outs = (x, x)
        if self.row_operand:
            if g.summed:
                pass                # added by the group's parts
            elif g.sum_by_tile:
                residual = x.like(g.residual)
                for t in range(x.count):
                    emit.op(VpuOp.ADD, x.tile(t), x.m, x.tile(t), b_row=residual.tile(t))
            else:
                emit.map(VpuOp.ADD, x, x, b_row=g.residual)
            outs = (x, x.like(g.at["sq"]))
            if g.on_sum is not None:
                g.on_sum(emit)
        gamma = Tiles(g.params, 1, x.n, x.cols)
        emit_rms_norm(emit, x, gamma, g.ep.eps, outs[1], x.like(g.at["sq"]), g.at["spare"],
                      summed=g.summed)
        return outs

    def vector_operands(self, R, n, cols, group):
        return {"other": ("rms_norm_params", (1, n))}

    def vector_loads(self, prog, op, r0, m, params, scratch):
        return move_tiles(prog, "load", op.other, 0, 1, params, {})

    def emit_vector(self, emit, op, x, params, scratch, spare):
        emit_rms_norm(emit, x, params, op.eps, x, scratch[0], spare)

    def vector_reads(self, ep, scratch):
        return {"other": ep.params}


class _HeadRmsNorm(_Norm):
    """QK-norm: RMSNorm over each head of the row, every head with the same
    gamma (`params`: one row of head_dim, which must divide N and be a
    multiple of cols; the heads' reductions in the tree order of a row of
    head_dim)."""

    def operands(self, M, N, cols, given):
        shape = given.get("params")
        return {"params": (1, shape[1] if shape is not None else N)}

    def scratch(self, count, G, Mb):
        return (("spare", count * Mb), ("sq", count * Mb))

    def check(self, ep, cols, N):
        head = ep.params.cols
        if head % cols or N % head:
            raise ValueError(f"a head_rms_norm's head ({head} wide, its gamma) must be a multiple "
                             f"of cols ({cols}) and divide the result's {N} columns")

    def emit(self, emit, g):
        emit_head_norms(emit, g)
        return g.x, g.x


def emit_head_norms(emit, g):
    """RMSNorm of each head of the group's row in place, the heads as wide as
    the op's gamma (`params`), in the op's "sq" and "spare" scratch."""
    x, head = g.x, g.ep.params.cols
    per, m = head // x.cols, x.m
    gamma = Tiles(g.params, 1, head, x.cols)
    for h in range(x.count // per):
        xh = Tiles(x.tile(h * per), m, head, x.cols)
        emit_rms_norm(emit, xh, gamma, g.ep.eps, xh, Tiles(g.at["sq"] + h * per * m, m, head,
                                                           x.cols), g.at["spare"] + h * m)


class _NormAddRmsNorm(_Norm):
    """A post-norm residual block's end (Gemma 3): c gets ``other +
    rms_norm(r, gamma0)`` (the block's output normed, then the residual add)
    and the extra output ``rms_norm(c, gamma1)``, the next block's input.
    `params`: gamma0 and gamma1, two rows of N; `other`: the residual."""

    def emit(self, emit, g):
        x, sq = g.x, g.x.like(g.at["sq"])
        gammas = [Tiles(g.params + i * g.count, 1, x.n, x.cols) for i in range(2)]
        emit_rms_norm(emit, x, gammas[0], g.ep.eps, x, sq, g.at["spare"])
        emit.map(VpuOp.ADD, x, x, b_row=g.residual)
        if g.on_sum is not None:
            g.on_sum(emit)
        emit_rms_norm(emit, x, gammas[1], g.ep.eps, sq, sq, g.at["spare"])
        return x, sq


# ---- GELU --------------------------------------------------------------------------

class _Gelu(LayerOp):
    """GELU, the erf form (docs/vpu.md)."""

    def scratch(self, count, G, Mb):
        return (("scratch", 4 * G * Mb + 4),)

    def emit(self, emit, g):
        x = g.x
        emit.gelu(x, x, [x.like(g.at["scratch"] + i * (x.rows + 1) + 1) for i in range(4)],
                  split=2)
        return x, x

    def emit_vector(self, emit, op, x, params, scratch, spare):
        emit.gelu(x, x, scratch)


# ---- paired element ops: f(gate) * up ----------------------------------------------

def emit_paired(emit, m, pairs, scratch, steps):
    """``f(gate) * up`` for each (gate row, up row) in `pairs` (accumulator
    rows of tiles of m rows), into the gate's rows, `steps` the sequence:
    functions ``(gate, up, work)`` that each emit one VECTOR. Pass by pass
    over every pair, so that the passes of different pairs overlap in the
    pipeline (`scratch`: m working rows per pair)."""
    work = [scratch + i * m for i in range(len(pairs))]
    for step in steps:
        for (g, u), w in zip(pairs, work):
            step(emit, m, g, u, w)
    return emit


class _PairedMul(LayerOp):
    """A paired element op ``f(gate) * up``: the matmul's N tiles alternate
    gate, up (tile 2j and 2j+1 make output tile j). `steps` is its sequence
    (`emit_paired`)."""
    steps = ()

    def scratch(self, count, G, Mb):
        return (("scratch", G * Mb),)

    def emit(self, emit, g):
        x = g.x
        pairs = [(x.tile(2 * k), x.tile(2 * k + 1)) for k in range(x.count // 2)]
        emit_paired(emit, x.m, pairs, g.at["scratch"], self.steps)
        return x, x


def _op(vpu_op, src, dst, **b):
    """One step of a paired sequence: ``dst = src <op> b``, each of "g", "u"
    or "w" (the pair's gate, up and working rows); b a scalar or a row name."""
    def step(emit, m, g, u, w):
        rows = dict(g=g, u=u, w=w)
        operand = {"b_row": rows[b["row"]]} if "row" in b else (
            {"scalar": b["scalar"]} if "scalar" in b else {})
        emit.op(vpu_op, rows[src], m, rows[dst], **operand)
    return step


class _SiluMul(_PairedMul):
    """SwiGLU's ``silu(gate) * up``: ``g = max(gate, -FLT_MAX)``,
    ``((g * reciprocal(exp(g * -1) + 1)) * up``."""
    steps = (_op(VpuOp.MAX, "g", "g", scalar=-_FLT_MAX), _op(VpuOp.MUL, "g", "w", scalar=-1.0),
             _op(VpuOp.EXP, "w", "w"), _op(VpuOp.ADD, "w", "w", scalar=1.0),
             _op(VpuOp.RECIP, "w", "w"), _op(VpuOp.MUL, "g", "g", row="w"),
             _op(VpuOp.MUL, "g", "g", row="u"))


# tanh-GELU's constants: ``gelu(g) = g * sigmoid(2u)``, ``2u = g * (K1 + K3 * g*g)``
# with ``K1 = 2 sqrt(2/pi)``, ``K3 = 0.044715 * K1``; here negated (exp(-2u)).
_GELU_TANH_K1 = float(np.float32(-2 * math.sqrt(2 / math.pi)))
_GELU_TANH_K3 = float(np.float32(-2 * math.sqrt(2 / math.pi) * 0.044715))


class _GeluTanhMul(_PairedMul):
    """GeGLU's ``gelu(gate) * up`` with the tanh form of GELU, ``0.5 g (1 +
    tanh(u))``, ``u = sqrt(2/pi) (g + 0.044715 g^3)``, which is ``g *
    sigmoid(2u)``: ``g = max(gate, -FLT_MAX)``, ``w = exp(((g*g) * K3 + K1) *
    g)``, ``(g * reciprocal(w + 1)) * up`` with ``K1 = -2 sqrt(2/pi)``,
    ``K3 = K1 * 0.044715`` in fp32."""
    steps = (_op(VpuOp.MAX, "g", "g", scalar=-_FLT_MAX), _op(VpuOp.MUL, "g", "w", row="g"),
             _op(VpuOp.MUL, "w", "w", scalar=_GELU_TANH_K3),
             _op(VpuOp.ADD, "w", "w", scalar=_GELU_TANH_K1), _op(VpuOp.MUL, "w", "w", row="g"),
             _op(VpuOp.EXP, "w", "w"), _op(VpuOp.ADD, "w", "w", scalar=1.0),
             _op(VpuOp.RECIP, "w", "w"), _op(VpuOp.MUL, "g", "g", row="w"),
             _op(VpuOp.MUL, "g", "g", row="u"))


# ---- RoPE --------------------------------------------------------------------------

def emit_rope(emit, m, jobs, t1, t2):
    """RoPE ``x * cos + swap(x) * sin`` for each job (x row, x' row or None,
    cos row, sin row, destination row) of m rows: with x' None the swap is
    the vector unit's lane swap of x, else x' is the pair-swapped copy a
    matmul made (RoPE folded into the weights). Pass by pass; `t1`, `t2`:
    m working rows per job."""
    for i, (xr, xs, cos, sin, dst) in enumerate(jobs):
        emit.op(VpuOp.MUL, xr, m, t1 + i * m, b_row=cos)
    for i, (xr, xs, cos, sin, dst) in enumerate(jobs):
        if xs is None:
            emit.op(VpuOp.MUL, xr, m, t2 + i * m, b_row=sin, swap=True)
        else:
            emit.op(VpuOp.MUL, xs, m, t2 + i * m, b_row=sin)
    for i, (xr, xs, cos, sin, dst) in enumerate(jobs):
        emit.op(VpuOp.ADD, t1 + i * m, m, dst, b_row=t2 + i * m)
    return emit


class _Rope(LayerOp):
    """RoPE ``r * cos + swap(r) * sin``, `other` the rows' cos|sin table;
    paired when the swapped copy comes from the matmul (folded weights)."""

    def scratch(self, count, G, Mb):
        return (("t1", G * Mb), ("t2", G * Mb))

    def operands(self, M, N, cols, given):
        shape = given.get("other")
        width = shape[1] if shape is not None else 2 * _bias_width(N, cols)
        return {"other": (M, width)}

    def check(self, ep, cols, N):
        period = ep.other.cols // 2
        if ep.other.cols % 2 or period % cols or (not ep.is_paired and period % 2):
            raise ValueError(f"a rope table must be 2P wide with P a multiple of cols ({cols}), "
                             f"not {ep.other.cols}")
        if not ep.is_paired and cols % 2:
            raise ValueError(f"RoPE by the vector unit's lane swap needs an even number of "
                             f"columns, not {cols}: fold it into the weights (paired=True)")

    def emit(self, emit, g):
        """The cos and sin tiles of output tile j are tiles ``j mod (P /
        cols)`` and ``P / cols + that`` of the table (P: its period)."""
        ep, x = g.ep, g.x
        period = ep.other.cols // 2 // x.cols
        step = 2 if ep.is_paired else 1
        jobs = []
        for k in range(x.count // step):
            t = step * k
            u = ((g.j0 // step) + k) % period
            swapped = x.tile(t + 1) if ep.is_paired else None
            jobs.append((x.tile(t), swapped, g.residual + u * x.m,
                         g.residual + (period + u) * x.m, x.tile(t)))
        emit_rope(emit, x.m, jobs, g.at["t1"], g.at["t2"])
        return x, x


def emit_neox(emit, g, t1, t2):
    """NEOX RoPE of the group's row in place: each head (P wide, P the
    table's period) turns its halves, dims i and i + P/2: ``x * cos +
    partner(x) * sin``, where the partner of a tile in one half is the tile
    P/2 further (or back) in the other -- a whole tile, so no lane moves --
    and the table's sin is negated in each head's first half. `t1`, `t2`:
    the group's tiles of working rows each."""
    x, m = g.x, g.x.m
    per = g.ep.other.cols // 2 // x.cols
    half = per // 2
    jobs = []
    for t in range(x.count):
        u = t % per
        partner = t + half if u < half else t - half
        jobs.append((x.tile(t), x.tile(partner), g.residual + u * m, g.residual + (per + u) * m,
                     x.tile(t)))
    return emit_rope(emit, m, jobs, t1, t2)


class _RopeNeox(LayerOp):
    """RoPE of the NEOX type (Gemma 3): each head turns dims (i, i + P/2),
    `other` the rows' table: P of cos, then P of sin with each head's first
    half negated (P the head's width, the table's period, whose half must be
    whole tiles)."""

    def scratch(self, count, G, Mb):
        return (("t1", count * Mb), ("t2", count * Mb))

    def operands(self, M, N, cols, given):
        shape = given.get("other")
        return {"other": (M, shape[1] if shape is not None else 2 * N)}

    def check(self, ep, cols, N):
        period = ep.other.cols // 2
        if ep.other.cols % 2 or period % (2 * cols) or N % period:
            raise ValueError(f"a {self.name} table must be 2P wide with P/2 a multiple of cols "
                             f"({cols}) and P dividing the result's {N} columns, not "
                             f"{ep.other.cols} wide")

    def emit(self, emit, g):
        emit_neox(emit, g, g.at["t1"], g.at["t2"])
        return g.x, g.x


class _HeadRmsNormRope(_RopeNeox):
    """Gemma 3's QK-norm then NEOX RoPE on Q or K: `params` one head's gamma
    (head_rms_norm), `other` the rows' NEOX table (rope_neox) of the same
    head width."""

    def operands(self, M, N, cols, given):
        shape = given.get("params")
        head = shape[1] if shape is not None else N
        return {"params": (1, head), "other": (M, 2 * head)}

    def scratch(self, count, G, Mb):
        return (("spare", count * Mb), ("sq", count * Mb), ("t2", count * Mb))

    def check(self, ep, cols, N):
        if ep.other.cols != 2 * ep.params.cols:
            raise ValueError(f"a {self.name}'s table ({ep.other.cols} wide) must be twice its "
                             f"head ({ep.params.cols}, its gamma)")
        super().check(ep, cols, N)

    def emit(self, emit, g):
        emit_head_norms(emit, g)
        emit_neox(emit, g, g.at["sq"], g.at["t2"])
        return g.x, g.x


# ---- a transpose, a copy -----------------------------------------------------------

class _Transpose(LayerOp):
    """The bf16 ``(r * scale).T`` (N x M), through the vector unit's
    transpose path."""

    def vector_form(self, ep, r, c, scratch):
        return dict(kind=COPY, x=r, out_t=c, scale=ep.scale)


# ---- the kinds -----------------------------------------------------------------------

register(_Softmax("softmax", "softmax", row_wise=True, params=1, passes=10, scaled=True,
                  producer=True, vector_regions=2, vector_grouped=True, unfused=True,
                  chained=True))
register(_MaskedSoftmax("masked_softmax", "softmax", row_wise=True, params=1, per_row=True,
                        passes=10, scaled=True, unfused=True, chained=True))
register(_LayerNorm("layer_norm", "layer_norm", row_wise=True, buffers=2, params=3, passes=12,
                    producer=True, vector_regions=3, unfused=True))
register(_LayerNorm("add_layer_norm", "layer_norm", row_wise=True, buffers=2, params=3,
                    row_operand="same", passes=13, producer=True, handoff_other=True,
                    vector_regions=4, unfused=True))
register(_RmsNorm("rms_norm", "rms_norm", row_wise=True, buffers=2, params=1, passes=7,
                  vector_regions=2, unfused=True))
register(_RmsNorm("add_rms_norm", "rms_norm", row_wise=True, buffers=2, params=1,
                  row_operand="same", passes=8, outputs=("x", "norm"), producer=True))
register(_HeadRmsNorm("head_rms_norm", "head_rms_norm", row_wise=True, buffers=2, params=1,
                      passes=7))
register(_Gelu("gelu", "gelu", row_wise=False, passes=23, min_group=4, producer=True,
               vector_regions=5, unfused=True))
register(_SiluMul("silu_mul", "silu_mul", row_wise=False, paired=True, passes=7, min_group=2))
register(_GeluTanhMul("gelu_tanh_mul", "gelu_tanh_mul", row_wise=False, paired=True, passes=10,
                      min_group=2))
register(_Rope("rope", "rope", row_wise=False, row_operand="table", passes=3, may_pair=True,
               may_transpose=True))
register(_RopeNeox("rope_neox", "rope_neox", row_wise=True, buffers=2, row_operand="table",
                   passes=3, may_transpose=True))
register(_HeadRmsNormRope("head_rms_norm_rope", "head_rms_norm_rope", row_wise=True, buffers=2,
                          params=1, row_operand="table", passes=10, may_transpose=True,
                          head_wise=True))
register(_NormAddRmsNorm("norm_add_rms_norm", "norm_add_rms_norm", row_wise=True, buffers=2,
                         params=2, row_operand="same", passes=15, outputs=("x", "norm")))
register(_Transpose("transpose", "scale", row_wise=False, passes=1, scaled=True, transposes=True,
                    producer=True, unfused=True))
# Its passes (for cycle estimates) are a hand-off's two.
register(LayerOp(COPY, "scale", row_wise=False, passes=2, scaled=True, producer=True,
                 vector_regions=1, vector_transpose=True))

EPILOGUE_KINDS = tuple(name for name in LAYER_OPS if name != COPY)
# The kinds a `VectorOp` runs on tensors in external memory (vectorop.py).
VECTOR_KINDS = tuple(name for name, op in LAYER_OPS.items() if op.vector_regions)
