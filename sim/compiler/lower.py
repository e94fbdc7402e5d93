"""Lowering: how one matmul (with its layer op) becomes the ops of a program
(docs/compiler.md, "Lowering").

Every choice between equivalent programs is made here, not by the runtime:

* **K split.** When one activation row of a block does not fit VMEM, K is
  cut into chunks of whole K tiles, each a matmul seeded, as a matrix bias,
  with the previous chunk's fp32 partial sums (in the output itself when it
  is fp32 without ReLU, else in an fp32 scratch operand). The sum order stays
  the sequential order of docs/numerics.md.
* **Fused or not.** A layer op rides on its matmul as an `Epilogue` when the
  chip holds the buffers; otherwise, for the kinds that have a `VectorOp`
  form, the matmul writes an fp32 scratch result and a `VectorOp` follows --
  the same bits either way.

The compiler knows no tensors: a `Lowering` says which scratch operands it
needs (`scratch`: (rows, cols, dtype) each), and `build` turns the operands
the runtime allocated for them into the op list.
"""

from dataclasses import dataclass, field, replace

from .operands import MatmulOp
from .plan import ceil_div, max_k_tiles, plan_op, ring_rows, unit_tiles
from .vectorop import VectorOp

__all__ = ["Lowering", "lower_matmul", "cols_of", "rows_of"]

def cols_of(x, k0, k1):
    """Columns k0 .. k1-1 of operand `x`."""
    return replace(x, addr=x.addr + k0 * x.elem, cols=k1 - k0)


def rows_of(x, r0, r1):
    """Rows r0 .. r1-1 of operand `x`."""
    if x.dtype == "quant":
        return x.rows_of(r0, r1)
    return replace(x, addr=x.addr + r0 * x.stride, rows=r1 - r0)


def _plans(config, op):
    """`op`'s plan on the whole chip beside its weight ring, or None."""
    return plan_op(config, op.M, op.K, op.N, op.bias_kind, **op.plan_args(config),
                   vmem_rows=config.vmem_rows - ring_rows(config, op))


@dataclass
class Lowering:
    """The ops of one matmul once the runtime has allocated `scratch`
    (``(rows, cols, dtype, fill)`` of each operand the program needs besides
    the caller's; `fill` None or the value it must hold before the program
    runs): ``build(operands)`` returns them; ``fused`` says whether the layer
    op rides on the matmul."""
    scratch: list = field(default_factory=list)
    build: object = None
    fused: bool = True


def lower_matmul(config, a, b, c, bias=None, relu=False, epilogue=None):
    """The `Lowering` of ``c = relu?(a @ b + bias)``, or with `epilogue` (an
    `Epilogue`) of that layer op on the fp32 result. Raises ValueError when
    the chip cannot run it at all."""
    if epilogue is not None:
        return _lower_fused(config, a, b, c, bias, epilogue)
    op = MatmulOp(a, b, c, bias, relu)
    op.check(config)
    if _plans(config, op):
        return Lowering([], lambda scratch: [op])
    return _lower_split(config, a, b, c, bias, relu)



def _lower_split(config, a, b, c, bias, relu):
    M, K, N = a.rows, a.cols, b.cols
    bias_kind = "none" if bias is None else ("row" if bias.rows == 1 and M > 1 else "matrix")
    fit = min(max_k_tiles(config, M, N, bias_kind, b), max_k_tiles(config, M, N, "matrix", b))
    unit = unit_tiles(config, b)          # quantized weights split between blocks
    fit = fit // unit * unit
    if fit == 0:
        raise ValueError(f"a {M}x{K} @ {K}x{N} matmul does not fit the chip even with one "
                         f"K tile at a time (VMEM {config.vmem_rows} rows, accumulator "
                         f"{config.acc_rows} rows)")
    tiles = -(-K // config.rows)
    chunks = -(-tiles // fit)             # chunks of equal size: a short last one streams no better
    step = ceil_div(ceil_div(tiles, chunks), unit) * unit * config.rows
    in_place = c.dtype == "fp32" and not relu

    def build(scratch):
        partial = c if in_place else scratch[0]
        ops = []
        for k0 in range(0, K, step):
            k1 = min(K, k0 + step)
            last = k1 == K
            seed = bias if k0 == 0 else partial
            ops.append(MatmulOp(cols_of(a, k0, k1), rows_of(b, k0, k1), c if last else partial,
                                seed, relu and last))
        return ops

    return Lowering([] if in_place else [(M, N, "fp32", None)], build)


def _lower_fused(config, a, b, c, bias, ep):
    op = MatmulOp(a, b, c, bias, False, ep)
    op.check(config)
    if _plans(config, op):
        return Lowering([], lambda scratch: [op])
    desc = ep.desc
    if not desc.unfused or ep.transpose and not desc.transposes:
        raise ValueError(f"a {op.M}x{op.K} @ {op.K}x{op.N} matmul with a {ep.kind} epilogue does "
                         f"not fit the chip's buffers ({config.acc_rows} accumulator rows, "
                         f"{config.vmem_rows} VMEM rows), and {ep.kind} has no unfused form: "
                         f"split its rows")
    M, N = op.M, op.N
    width = -(-N // config.cols) * config.cols
    # The matmul into an fp32 scratch r (split over K if need be: r is its
    # own partial sum), then the layer op's `VectorOp` form on r.
    scratch = [(M, N, "fp32", None)] + desc.unfused_scratch(ep, width)

    def build(ops_scratch):
        r = ops_scratch[0]
        ops = lower_matmul(config, a, b, r, bias).build([])
        vector = VectorOp(**desc.vector_form(ep, r, c, ops_scratch[1:]))
        vector.check(config)
        return ops + [vector]

    return Lowering(scratch, build, fused=False)
