"""The vector unit's emitting primitives: matrices kept in the accumulator
(`Tiles`), and `VectorEmitter`, which appends VECTOR instructions over whole
tiles -- element ops, row reductions, and the shared sequences of softmax,
LayerNorm and GELU (docs/vpu.md).

A matrix of ``m`` rows and ``n`` fp32 columns lives in the accumulator as
`Tiles`: ``ceil(n / cols)`` tiles of ``cols`` columns, tile ``t`` in rows
``base + t*m .. base + t*m + m - 1`` -- the layout of a MATMUL's output when
its N tiles are written one after another. Each sequence below is the golden
VPU form of its layer op (docs/vpu.md) emitted as VECTORs over whole tiles.
Row reductions follow that module's tree order with ``lanes = cols``: tiles
``T/2 .. T-1`` are added onto tiles ``0 .. T/2-1`` (``T`` the padded power
of two; a missing tile is the pad, +0 or -inf, given as a scalar operand)
until one tile is left, which RSUM or RMAX reduces in the row (its lanes
padded to a power of two in the hardware's tree).

The emitters do not place tokens: `VectorEmitter.begin` and `VectorEmitter.end`
put dependency flags on the first and the last instruction of a call.

Which sequence a layer op runs, fused or on tensors in external memory, is
its descriptor's (`layerops.py`); this module knows no op kinds.
"""

from dataclasses import dataclass

import numpy as np

from mxu.hdl.isa import VpuOp

__all__ = ["Tiles", "VectorEmitter", "tile_moves", "move_tiles", "flag_instruction", "tree_ready",
           "tree_order"]


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
        self.program, self.config = program, config
        self._deps = {}
        self._last = None

    @property
    def emitted(self):
        """Whether an instruction has been emitted."""
        return self._last is not None

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
        flag_instruction(self.program, self._last, **deps)
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

    def per_tile_pairs(self, first, second, count, lag=2):
        """Two passes of `count` tiles, ``first(t)`` and ``second(t)`` each
        emitting tile t's VECTOR, where second(t) reads what first(t)
        wrote: first(t + `lag`) goes before second(t), so that the
        interlock's wait for first(t) is spent on other tiles, and tile t
        is final `lag` tiles into the pair instead of after a whole pass.
        (SmolLM2's add_rms_norm at batch 16: lags 1 to 6 within 45 cycles
        of each other on two layers.)"""
        for k in range(count + lag):
            if k < count:
                first(k)
            if k >= lag:
                second(k - lag)
        return self

    def reduce(self, kind, x, dst, scratch, squares=False, summed=False):
        """Row reduction ("sum" or "max") of `x` into the m rows at `dst` (every
        lane holds the row's result), in the golden VPU form's tree order;
        `scratch` holds up to ``x.count`` tiles. `squares`: a sum of squares
        (never -0) in place (`scratch` is `x`): a tile without a partner
        would be added +0 into its own rows, which leaves its bits as they
        are (a NaN is the canonical one already), so that pass is left out
        (36 tiles: 28 of them at the first level, about 500 cycles of a
        batch-16 decode step's RMSNorm). `summed`: the tree's pairs are
        done already (`tree_pairs`), only the last tile's row sum is left."""
        combine, pad = (VpuOp.ADD, 0.0) if kind == "sum" else (VpuOp.MAX, _NEG_INF)
        keep = squares and kind == "sum" and scratch.base == x.base
        src = x
        for half, paired, alone in ([] if summed else _tree_levels(x.count)):
            if paired:
                self.op(combine, src.base, paired * x.m, scratch.base, b_row=src.tile(half))
            if alone and not keep:
                self.op(combine, src.tile(paired), alone * x.m, scratch.tile(paired), scalar=pad)
            src = scratch
        return self.op(VpuOp.RSUM if kind == "sum" else VpuOp.RMAX, src.base, x.m, dst)

    def tree_pairs(self, sq, pairs):
        """The given pairs ``(half, i)`` of a sum of squares' tree in place
        in `sq` (`tree_ready`), in the order given, consecutive tiles of one
        level as one VECTOR."""
        runs = []
        for half, i in pairs:
            if runs and runs[-1][0] == half and runs[-1][1] + runs[-1][2] == i:
                runs[-1][2] += 1
            else:
                runs.append([half, i, 1])
        for half, i, n in runs:
            self.op(VpuOp.ADD, sq.tile(i), n * sq.m, sq.tile(i), b_row=sq.tile(i + half))
        return self

    # ---- the layer ops ----------------------------------------------------------------
    def softmax(self, x, bias, dst, scratch, row):
        """The VPU-form softmax of `x` into `dst` (may be `x`). `bias`: a
        one-row matrix, 0 where attending is allowed and -inf elsewhere (and in
        the lanes past n), or None for no mask (n a multiple of cols);
        `scratch`: ``x.count`` tiles; `row`: m spare rows."""
        r = Tiles(row, x.m, x.cols, x.cols)
        if bias is not None:
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

    def layer_norm(self, x, gamma, beta, eps, dst, scratch, rows, ones=None):
        """The VPU-form LayerNorm of `x` into `dst` (may be `x`); `gamma`,
        `beta`: one-row matrices; `scratch`: two matrices of x's shape, d
        (x - mean; may be x itself) and sq (free from `dst`); `rows`: m spare rows. When n is not a multiple
        of cols, `ones` (a one-row matrix of 1.0, its last tile's spare lanes
        +0) zeroes the spare lanes of ``x - mean`` before they enter the
        variance."""
        d, sq = scratch
        r = Tiles(rows, x.m, x.cols, x.cols)
        inv_n = float(np.float32(1 / x.n))
        self.reduce("sum", x, rows, sq)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=inv_n)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=-1.0)
        self.per_tile(VpuOp.ADD, x, r, d)
        if x.n % x.cols:
            last = x.count - 1
            self.op(VpuOp.MUL, d.tile(last), x.m, d.tile(last), b_row=ones.tile(last),
                    broadcast=True)
        self.map(VpuOp.MUL, d, sq, b_row=d.base)
        self.reduce("sum", sq, rows, sq, squares=True)
        self.op(VpuOp.MUL, rows, x.m, rows, scalar=inv_n)
        self.op(VpuOp.ADD, rows, x.m, rows, scalar=float(np.float32(eps)))
        self.op(VpuOp.RSQRT, rows, x.m, rows)
        self.per_tile(VpuOp.MUL, d, r, d)
        self.per_tile(VpuOp.MUL, d, gamma, d, broadcast=True)
        return self.per_tile(VpuOp.ADD, d, beta, dst, broadcast=True)

    def gelu(self, x, dst, scratch, split=1):
        """The VPU-form GELU of `x` into `dst` (may be `x`); `scratch`: four
        matrices of x's shape. With `split` > 1 the tiles are cut into that
        many parts whose passes alternate: each pass reads the previous one's
        result, and the interlock would otherwise hold every pass until the
        last finished (docs/vpu.md, "Fused epilogues")."""
        parts = _split_tiles(x.count, split)
        jobs = []
        for t0, count in parts:
            part = lambda m: Tiles(m.tile(t0), m.m, count * m.cols, m.cols)
            jobs.append(dict(x=part(x), dst=part(dst), **{name: part(m) for name, m in
                                                           zip(("ax", "a", "t", "poly"), scratch)}))
        for op, src, out, b in _GELU_PASSES:
            for job in jobs:
                operand = dict(scalar=b) if isinstance(b, float) else (
                    dict(b_row=job[b].base) if b else {})
                self.map(op, job[src], job[out], **operand)
        return self


def _split_tiles(count, parts):
    """(first tile, tiles) of `parts` nearly equal parts of `count` tiles."""
    parts = max(1, min(parts, count))
    edges = [count * i // parts for i in range(parts + 1)]
    return [(a, b - a) for a, b in zip(edges, edges[1:])]


def _gelu_passes():
    """The VPU form's GELU (docs/vpu.md: the polynomial's coefficients carry
    the -1/2) as (op, source, destination, b): b is a scalar, the name of a
    matrix, or None. a holds -x until relu(x); t is reused for
    ``exp((x * -x) * 0.5)`` once the polynomial has it."""
    passes = [(VpuOp.MUL, "x", "a", -1.0), (VpuOp.MAX, "x", "ax", "a"),
              (VpuOp.MIN, "ax", "ax", 1e30),
              (VpuOp.MUL, "ax", "t", _ERF_P / np.sqrt(2)), (VpuOp.ADD, "t", "t", 1.0),
              (VpuOp.RECIP, "t", "t", None), (VpuOp.MUL, "t", "poly", -0.5 * _ERF_A[4])]
    for c in _ERF_A[3::-1]:
        passes += [(VpuOp.ADD, "poly", "poly", -0.5 * c), (VpuOp.MUL, "poly", "poly", "t")]
    passes += [(VpuOp.MUL, "x", "t", "a"), (VpuOp.MUL, "t", "t", 0.5), (VpuOp.EXP, "t", "t", None),
               (VpuOp.MUL, "poly", "poly", "t"), (VpuOp.MUL, "ax", "ax", "poly"),
               (VpuOp.MAX, "x", "a", 0.0), (VpuOp.ADD, "a", "dst", "ax")]
    return passes


_GELU_PASSES = _gelu_passes()


def flag_instruction(prog, index, **deps):
    """Set dependency flags on instruction `index` of `prog`."""
    from mxu.hdl.isa import Deps
    names = list(Deps.as_shape().members)
    for name, value in deps.items():
        prog.words[index] |= int(bool(value)) << (4 + names.index(name))
    prog.text[index] += f" [{' '.join(k for k, v in deps.items() if v)}]"


def tile_moves(operand, r0, m, tiles):
    """The DMA descriptors (keyword dicts) that move rows r0 .. r0+m-1 of
    `operand` to or from `tiles` (its columns cut into tiles of cols)."""
    cols, elem = tiles.cols, operand.elem
    return [dict(acc_row=tiles.tile(t), ext_addr=operand.addr + r0 * operand.stride + t * cols * elem,
                 rows=m, row_bytes=min(cols, operand.cols - t * cols) * elem,
                 ext_stride=operand.stride)
            for t in range(tiles.count)]


def move_tiles(prog, kind, operand, r0, m, tiles, first_deps, *, to_bf16=False, **flags):
    """LOAD ("load") or STORE ("store") rows r0 .. r0+m-1 of `operand` as `tiles`
    (its columns cut into tiles of cols); `first_deps` on the first
    instruction. Returns the indices of the instructions emitted."""
    emitted = []
    for t, move in enumerate(tile_moves(operand, r0, m, tiles)):
        args = dict(move, **(first_deps if t == 0 else {}))
        if kind == "load":
            prog.load(**args)
        else:
            prog.store(to_bf16=to_bf16, **args, **flags)
        emitted.append(len(prog.words) - 1)
    return emitted


def tree_ready(count, squared):
    """The pairs ``(half, i)`` of `VectorEmitter.reduce`'s tree of a sum of
    squares over `count` tiles (tile i += tile i + half, level by level,
    the halves falling) whose inputs are final once the tiles in `squared`
    are: pair (half, i) sums the tiles ``i, i + half, i + 2 half, ..``, so
    it is ready when all of those are squared. In emission order."""
    return [(half, i) for half, paired, _ in _tree_levels(count) for i in range(paired)
            if all(k in squared for k in range(i, count, half))]


def _tree_levels(count):
    """The levels of the row reduction's tree over `count` tiles: (half,
    tiles i < paired that take tile i + half, the `alone` tiles after them
    that have no partner), the halves falling from the padded power of two."""
    real, n = count, 1 << max(0, (count - 1).bit_length())
    while n > 1:
        half = n // 2
        paired = max(0, min(real - half, half))
        yield half, paired, min(real, half) - paired
        real, n = min(real, half), half


def tree_order(count):
    """An order of `count` tiles in which `tree_ready`'s pairs complete
    early: by the bit-reversed index (tiles 0, 32, 16, 8, 24, .. of 36), so
    that each residue class of a level is squared together."""
    bits = max(0, (count - 1).bit_length())
    rev = lambda i: int(format(i, f"0{bits}b")[::-1], 2) if bits else 0
    return sorted(range(count), key=rev)
