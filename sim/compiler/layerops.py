"""The layer ops the vector unit runs, one descriptor each (docs/compiler.md,
"Layer ops").

A transformer layer op -- softmax, LayerNorm, RMSNorm, GELU, SiLU(gate) *
up, RoPE, a residual add, a transpose -- is known to the compiler through
one `LayerOp` here: the operands it reads besides the matmul's result, the
accumulator rows it works in, whether it needs a whole row (every N tile of
an M block in one group), how many output buffers a fused segment gives it,
about how many vector passes a row costs, the VECTORs it emits on a group
of tiles, and the name of its golden function (of the golden VPU form, docs/vpu.md: the same
fp32 sequence in NumPy, which the tests hold the chip to bit for bit).
Adding an op means adding one descriptor to `LAYER_OPS`; the planner
(`plan.py`), the segment compiler (`matmul.py`, `epilogue.py`) and the
runtime read everything from it.

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

from dataclasses import dataclass

import numpy as np

from mxu.hdl.isa import VpuOp

from .vector import Tiles

__all__ = ["LayerOp", "LAYER_OPS", "layer_op", "EPILOGUE_KINDS", "VECTOR_KINDS", "COPY"]

_FLT_MAX = float(np.finfo(np.float32).max)

# The compiler's own kind: no pass of its own, only the hand-off passes of a
# plain matmul whose result stays in VMEM (docs/compiler.md).
COPY = "copy"


@dataclass(frozen=True)
class LayerOp:
    """What the compiler knows of one layer op kind (see the module docstring).

    name : the ``then=`` / `Epilogue` kind.
    golden : the golden VPU form's function that is its contract (docs/vpu.md).
    row_wise : a row's result needs the whole row (groups are every N tile).
    buffers : output buffers a fused segment of this kind cycles through.
    params : parameter rows per N tile (0: none).
    per_row : the parameters are a row per result row (M rows per N tile).
    row_operand : None, "same" (``other`` is M x N) or "table" (M x 2P: a
        period P of cos, then of sin; output column n uses column n mod P).
    paired : output tile j is made of result tiles 2j and 2j+1.
    passes : vector passes per row of a tile, about (for cycle estimates).
    outputs : where each output is stored from: "x" the group's tiles,
        "norm" the normalised copy in the op's scratch (add_rms_norm).
    min_group : the fewest N tiles a group takes (wide groups: fewer,
        longer VECTORs); 0 for row-wise ops.
    vector_regions : matrices of the chunk's shape a `VectorOp` of this kind
        works in (0: it has no VectorOp form, only the fused one).
    """
    name: str
    golden: str
    row_wise: bool
    buffers: int = 3
    params: int = 0
    row_operand: str = None
    paired: bool = False
    passes: int = 1
    outputs: tuple = ("x", "x")
    min_group: int = 1
    per_row: bool = False
    vector_regions: int = 0

    def param_rows(self, count, M):
        """Accumulator rows of its parameters for an M x (count tiles) result."""
        return self.params * count * (M if self.per_row else 1)

    # ---- the rows it needs ------------------------------------------------------
    def scratch(self, count, G, Mb):
        """[(region, rows)] of the vector unit's working rows for groups of G
        tiles of Mb rows (count: the op's N tiles)."""
        return {
            "softmax": (("spare", Mb), ("scratch", count * Mb)),
            "masked_softmax": (("spare", Mb), ("scratch", count * Mb)),
            "layer_norm": (("spare", Mb), ("sq", count * Mb)),
            "add_layer_norm": (("spare", Mb), ("sq", count * Mb)),
            "rms_norm": (("spare", Mb), ("sq", count * Mb)),
            "add_rms_norm": (("spare", Mb), ("sq", count * Mb)),
            "gelu": (("scratch", 4 * G * Mb + 4),),
            "silu_mul": (("scratch", G * Mb),),
            "rope": (("t1", G * Mb), ("t2", G * Mb)),
        }.get(self.name, ())

    def operands(self, M, N, cols, other_cols=None, masked=True):
        """{operand: (rows, cols)} it reads for an M x N result (for a paired
        op, N is the output's width); `other_cols` the width of a table;
        `masked`: whether a softmax has its bias row."""
        width = -(-N // cols) * cols
        if self.name == "softmax":
            if not masked:
                if N % cols:
                    raise ValueError(f"a softmax without a bias row (other) needs N ({N}) to be "
                                     f"a multiple of the chip's cols ({cols})")
                return {}
            return {"other": (1, width)}
        if self.name == "masked_softmax":
            return {"other": (M, width)}
        if self.name == "rope":
            return {"other": (M, other_cols if other_cols is not None else 2 * width)}
        table = {"layer_norm": {"params": (3, N)},
                 "add_layer_norm": {"other": (M, N), "params": (3, N)},
                 "rms_norm": {"params": (1, N)},
                 "add_rms_norm": {"other": (M, N), "params": (1, N)}}
        return table.get(self.name, {})

    def row_tiles(self, count, other_cols, cols):
        """Accumulator rows per M row of one row-operand buffer, in tiles."""
        if self.row_operand is None:
            return 0
        if self.row_operand == "same":
            return count
        return -(-other_cols // cols)


_OPS = [
    LayerOp("softmax", "softmax", row_wise=True, params=1, passes=10, vector_regions=2),
    LayerOp("masked_softmax", "softmax", row_wise=True, params=1, per_row=True, passes=10),
    LayerOp("layer_norm", "layer_norm", row_wise=True, buffers=2, params=3, passes=12,
            vector_regions=3),
    LayerOp("add_layer_norm", "layer_norm", row_wise=True, buffers=2, params=3,
            row_operand="same", passes=13, vector_regions=4),
    LayerOp("rms_norm", "rms_norm", row_wise=True, buffers=2, params=1, passes=7,
            vector_regions=2),
    LayerOp("add_rms_norm", "rms_norm", row_wise=True, buffers=2, params=1, row_operand="same",
            passes=8, outputs=("x", "norm")),
    LayerOp("gelu", "gelu", row_wise=False, passes=23, min_group=4, vector_regions=5),
    LayerOp("silu_mul", "silu_mul", row_wise=False, paired=True, passes=7, min_group=2),
    LayerOp("rope", "rope", row_wise=False, row_operand="table", passes=3),
    LayerOp("transpose", "scale", row_wise=False, passes=1),
    LayerOp(COPY, "scale", row_wise=False, passes=0, vector_regions=1),
]
LAYER_OPS = {op.name: op for op in _OPS}
EPILOGUE_KINDS = tuple(name for name in LAYER_OPS if name != COPY)
# The kinds a `VectorOp` runs on tensors in external memory (vector.py).
VECTOR_KINDS = tuple(name for name, op in LAYER_OPS.items() if op.vector_regions)


def layer_op(kind):
    """The `LayerOp` of `kind` (ValueError naming the known kinds)."""
    try:
        return LAYER_OPS[kind]
    except KeyError:
        raise ValueError(f"layer op kind must be one of {EPILOGUE_KINDS}, not {kind!r}") from None


# ---- the VECTORs of the new kinds (the older ones live in vector.VectorEmitter) ----------

def emit_rms_norm(emit, x, gamma, eps, dst, sq, row):
    """RMSNorm of `x` (a `Tiles`) into `dst` (may be x, or sq): ``ss =
    tree_sum(x*x)``, ``inv = rsqrt(ss * (1/n) + eps)``, ``(x * inv) * gamma``.
    The spare lanes of a partial tile hold +0 (a matmul's padded columns, the
    DMA's padding), so x*x adds nothing there. `sq`: x.count tiles; `row`: m
    spare rows; `gamma`: a one-row matrix."""
    r = Tiles(row, x.m, x.cols, x.cols)
    emit.map(VpuOp.MUL, x, sq, b_row=x.base)
    emit.reduce("sum", sq, row, sq)
    emit.op(VpuOp.MUL, row, x.m, row, scalar=float(np.float32(1 / x.n)))
    emit.op(VpuOp.ADD, row, x.m, row, scalar=float(np.float32(eps)))
    emit.op(VpuOp.RSQRT, row, x.m, row)
    emit.per_tile(VpuOp.MUL, x, r, dst)
    return emit.per_tile(VpuOp.MUL, dst, gamma, dst, broadcast=True)


def emit_silu_mul(emit, x, pairs, scratch):
    """``silu(gate) * up`` for each (gate row, up row) in `pairs` (accumulator
    rows of tiles of x.m rows), into the gate's rows: ``g = max(gate,
    -FLT_MAX)``, ``((g * reciprocal(exp(g * -1) + 1)) * up``. Pass by pass
    over every pair, so that the passes of different pairs overlap in the
    pipeline (`scratch`: x.m rows per pair)."""
    m = x.m
    work = [scratch + i * m for i in range(len(pairs))]
    steps = [
        lambda g, u, w: emit.op(VpuOp.MAX, g, m, g, scalar=-_FLT_MAX),
        lambda g, u, w: emit.op(VpuOp.MUL, g, m, w, scalar=-1.0),
        lambda g, u, w: emit.op(VpuOp.EXP, w, m, w),
        lambda g, u, w: emit.op(VpuOp.ADD, w, m, w, scalar=1.0),
        lambda g, u, w: emit.op(VpuOp.RECIP, w, m, w),
        lambda g, u, w: emit.op(VpuOp.MUL, g, m, g, b_row=w),
        lambda g, u, w: emit.op(VpuOp.MUL, g, m, g, b_row=u),
    ]
    for step in steps:
        for (g, u), w in zip(pairs, work):
            step(g, u, w)
    return emit


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
