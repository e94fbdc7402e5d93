"""The vector unit's layer programs: softmax, LayerNorm and GELU as VECTOR
instructions on matrices kept in the accumulator (docs/vpu.md).

A matrix of ``m`` rows and ``n`` fp32 columns lives in the accumulator as
`Tiles`: ``ceil(n / cols)`` tiles of ``cols`` columns, tile ``t`` in rows
``base + t*m .. base + t*m + m - 1`` -- the layout of a MATMUL's output when
its N tiles are written one after another. Each op below is the sequence of
`mxu.verif.vpu` (the golden VPU form of the layer) emitted as VECTORs over
whole tiles. Row reductions follow that module's tree order with ``lanes =
cols``: tiles ``T/2 .. T-1`` are added onto tiles ``0 .. T/2-1`` (``T`` the
padded power of two; a missing tile is the pad, +0 or -inf, given as a
scalar operand) until one tile is left, which RSUM or RMAX reduces in the row.
That is the order of the flat tree only when ``cols`` is a power of two, so
these programs require one.

The emitters do not place tokens: ``first`` and ``last`` are dependency flags
for the first and the last instruction a call emits.
"""

from dataclasses import dataclass

import numpy as np

from mxu.hdl.isa import VpuOp

__all__ = ["Tiles", "VectorEmitter"]

_NEG_INF = float("-inf")
_FLT_MAX = float(np.finfo(np.float32).max)
_FLT_MIN = float(np.finfo(np.float32).tiny)
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@dataclass(frozen=True)
class Tiles:
    """An (m, n) fp32 matrix in accumulator rows: tile t at ``base + t*m``."""
    base: int
    m: int
    n: int
    cols: int

    @property
    def count(self):
        return -(-self.n // self.cols)

    @property
    def rows(self):
        return self.count * self.m

    @property
    def end(self):
        return self.base + self.rows

    def tile(self, t):
        return self.base + t * self.m

    def like(self, base):
        """A matrix of the same shape at `base`."""
        return Tiles(base, self.m, self.n, self.cols)


class VectorEmitter:
    """Appends the layer ops' VECTOR instructions to a `Program`.

    Parameters
    ----------
    program : Program
    config : ChipConfig
        With the vector unit and a power-of-two number of columns.
    """

    def __init__(self, program, config):
        if not config.vpu:
            raise ValueError("the layer programs need a chip with the vector unit (vpu=True)")
        if config.cols & (config.cols - 1):
            raise ValueError(f"the layer programs reduce rows in the tree order of a power-of-two "
                             f"number of columns, not {config.cols}")
        self.program, self.config = program, config
        self._deps = {}
        self._last = None

    # ---- one instruction, with the caller's first/last flags ----------------------
    def op(self, op, a_row, rows, dst_row, **operands):
        deps, self._deps = self._deps, {}
        self.program.vector(op, a_row=a_row, rows=rows, dst_row=dst_row, **operands, **deps)
        self._last = len(self.program.words) - 1
        return self

    def begin(self, **deps):
        """Flags for the next instruction (e.g. ``pop_prev=True``)."""
        self._deps = deps
        return self

    def end(self, **deps):
        """Set flags (e.g. ``push_next=True``) on the last instruction emitted."""
        from mxu.hdl.isa import Deps
        word = self.program.words[self._last]
        for name, value in deps.items():
            bit = 4 + list(Deps.as_shape().members).index(name)
            word = word | (int(bool(value)) << bit)
        self.program.words[self._last] = word
        self.program.text[self._last] += f" [{' '.join(k for k, v in deps.items() if v)}]"
        return self

    # ---- building blocks ------------------------------------------------------------
    def map(self, op, x, dst, **operands):
        """One element op over every tile of `x` (same layout) into `dst`."""
        return self.op(op, x.base, x.rows, dst.base, **operands)

    def per_tile(self, op, x, row, dst, broadcast=False):
        """``op(tile t of x, b)`` into tile t of `dst`, where b is the (m-row)
        block `row` (a `Tiles` of one tile; rows ``row.base + i``), or with
        `broadcast` tile t of the one-row matrix `row`."""
        for t in range(x.count):
            b = row.tile(t) if broadcast else row.base
            self.op(op, x.tile(t), x.m, dst.tile(t), b_row=b, broadcast=broadcast)
        return self

    def reduce(self, kind, x, dst, scratch):
        """Row reduction ("sum" or "max") of `x` into the m rows at `dst` (every
        lane holds the row's result), in the tree order of `mxu.verif.vpu`;
        `scratch` holds up to ``x.count`` tiles."""
        combine, pad = (VpuOp.ADD, 0.0) if kind == "sum" else (VpuOp.MAX, _NEG_INF)
        real, count = x.count, 1 << max(0, (x.count - 1).bit_length())
        src = x
        while count > 1:
            half = count // 2
            paired = max(0, min(real - half, half))
            if paired:
                self.op(combine, src.base, paired * x.m, scratch.base, b_row=src.tile(half))
            alone = min(real, half) - paired
            if alone:
                self.op(combine, src.tile(paired), alone * x.m, scratch.tile(paired), scalar=pad)
            src, real, count = scratch, min(real, half), half
        return self.op(VpuOp.RSUM if kind == "sum" else VpuOp.RMAX, src.base, x.m, dst)

    # ---- the layer ops ----------------------------------------------------------------
    def softmax(self, x, bias, dst, scratch, row):
        """`mxu.verif.vpu.softmax` of `x` into `dst` (may be `x`). `bias`: a
        one-row matrix, 0 where attending is allowed and -inf elsewhere (and in
        the lanes past n); `scratch`: ``x.count`` tiles; `row`: m spare rows."""
        r = Tiles(row, x.m, x.cols, x.cols)
        self.per_tile(VpuOp.ADD, x, bias, x, broadcast=True)
        self.reduce("max", x, row, scratch)
        self.op(VpuOp.MAX, row, x.m, row, scalar=-_FLT_MAX)
        self.op(VpuOp.MUL, row, x.m, row, scalar=-1.0)
        self.per_tile(VpuOp.ADD, x, r, x)
        self.map(VpuOp.EXP, x, x)
        self.reduce("sum", x, row, scratch)
        self.op(VpuOp.MAX, row, x.m, row, scalar=_FLT_MIN)
        self.op(VpuOp.RECIP, row, x.m, row)
        return self.per_tile(VpuOp.MUL, x, r, dst)

    def layer_norm(self, x, gamma, beta, eps, dst, scratch, rows):
        """`mxu.verif.vpu.layer_norm` of `x` into `dst` (may be `x`); `gamma`,
        `beta`: one-row matrices; `scratch`: two matrices of x's shape, the
        second free from `dst`; `rows`: m spare rows. Needs ``n % cols == 0``
        (a partial tile's spare lanes would enter the variance)."""
        if x.n % x.cols:
            raise ValueError(f"layer_norm on the chip needs n ({x.n}) a multiple of cols ({x.cols})")
        d, sq = scratch
        r = Tiles(rows, x.m, x.cols, x.cols)
        inv_n = float(np.float32(1 / x.n))
        self.reduce("sum", x, rows, sq)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=inv_n)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=-1.0)
        self.per_tile(VpuOp.ADD, x, r, d)
        self.map(VpuOp.MUL, d, sq, b_row=d.base)
        self.reduce("sum", sq, rows, sq)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=inv_n)
        self.op(VpuOp.ADD, rows, x.m, rows, scalar=float(np.float32(eps)))
        self.op(VpuOp.RSQRT, rows, x.m, rows)
        self.per_tile(VpuOp.MUL, d, r, d)
        self.per_tile(VpuOp.MUL, d, gamma, d, broadcast=True)
        return self.per_tile(VpuOp.ADD, d, beta, dst, broadcast=True)

    def gelu(self, x, dst, scratch):
        """`mxu.verif.vpu.gelu` of `x` into `dst` (may be `x`); `scratch`: four
        matrices of x's shape."""
        ax, a, t, poly = scratch
        self.map(VpuOp.MUL, x, ax, scalar=-1.0)
        self.map(VpuOp.MAX, x, ax, b_row=ax.base)
        self.map(VpuOp.MIN, ax, ax, scalar=1e30)
        self.map(VpuOp.MUL, ax, a, scalar=float(np.float32(1 / np.sqrt(2))))
        self.map(VpuOp.MUL, a, t, scalar=_ERF_P)
        self.map(VpuOp.ADD, t, t, scalar=1.0)
        self.map(VpuOp.RECIP, t, t)
        self.map(VpuOp.MUL, t, poly, scalar=_ERF_A[4])
        for c in _ERF_A[3::-1]:
            self.map(VpuOp.ADD, poly, poly, scalar=c)
            self.map(VpuOp.MUL, poly, poly, b_row=t.base)
        e = t                                   # t is used up
        self.map(VpuOp.MUL, a, e, b_row=a.base)
        self.map(VpuOp.MUL, e, e, scalar=-1.0)
        self.map(VpuOp.EXP, e, e)
        self.map(VpuOp.MUL, poly, poly, b_row=e.base)
        self.map(VpuOp.MUL, ax, ax, scalar=-0.5)
        self.map(VpuOp.MUL, ax, ax, b_row=poly.base)
        self.map(VpuOp.MAX, x, a, scalar=0.0)
        return self.map(VpuOp.ADD, a, dst, b_row=ax.base)
