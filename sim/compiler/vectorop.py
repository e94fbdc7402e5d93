"""`VectorOp`: a layer op on tensors in external memory, as the runtime
records it beside its matmuls (docs/vpu.md, "Layer programs").

`emit_vector_op` compiles it in chunks of rows: LOAD the chunk's tiles (and
the op's parameter rows) into the accumulator, run the op's VECTORs, STORE
the results, then a barrier. What the op loads and which VECTORs it runs are
its `LayerOp` descriptor's (`layerops.py`: `vector_loads`, `emit_vector`).
"""

from dataclasses import dataclass

from mxu.hdl.isa import VpuOp

from .layerops import VECTOR_KINDS, layer_op
from .operands import Operand
from .vector import Tiles, VectorEmitter, flag_instruction, move_tiles

__all__ = ["VectorOp", "emit_vector_op"]


@dataclass(frozen=True)
class VectorOp:
    """A layer op on the vector unit, on fp32 ``(R, n)`` tensors in external memory.

    kind : one of `VECTOR_KINDS` -- "softmax" (``softmax(x * scale, mask)``,
        the multiply skipped when scale is 1; `other` holds the bias rows,
        0 or -inf, ``count*cols`` wide with -inf past n, row ``i // group`` for x
        row i), "layer_norm" (`other`: gamma, beta and ones, three rows),
        "rms_norm" (`other`: gamma, one row), "add_layer_norm"
        (``layer_norm(x + y)``: `other` is y, `params` gamma and beta), "gelu",
        "copy" (``x * scale``, x itself when scale is 1: with `out_bf16` a bf16
        copy, with `out_t` also the bf16 transpose). What each reads is its
        descriptor's `vector_operands`.
    out : fp32 result (may be x), or None; out_bf16 : its bf16 copy, or None.
    out_t : "copy" only: ``x.T`` in bf16 (n, R).
    """
    kind: str
    x: Operand
    out: Operand = None
    out_bf16: Operand = None
    out_t: Operand = None
    other: Operand = None
    params: Operand = None
    group: int = 1
    scale: float = 1.0
    eps: float = 0.0

    @property
    def rows(self):
        return self.x.rows

    @property
    def desc(self):
        return layer_op(self.kind)

    def check(self, config):
        if self.kind not in VECTOR_KINDS:
            raise ValueError(f"VectorOp kind must be one of {VECTOR_KINDS}, not {self.kind!r}")
        for name in ("x", "out", "out_bf16", "out_t", "other", "params"):
            operand = getattr(self, name)
            if operand is not None:
                operand.check(name, config.ext_mem_bytes)
        if self.x.dtype != "fp32" or (self.out is not None and self.out.dtype != "fp32"):
            raise ValueError("a VectorOp's x and out are fp32")
        if self.out is None and self.out_bf16 is None and self.out_t is None:
            raise ValueError("a VectorOp needs an output")


def _chunk_rows(config, op, count):
    """Rows per chunk: the op's (m, n) regions, m spare rows and the parameter
    rows fit the accumulator (and a transpose's blocks VMEM); for an op whose
    rows share parameters by group (softmax) a divisor of the group, for a
    transpose a multiple of vmem_row_elems."""
    c = config
    limit = max(1, (c.acc_rows - 3 * count - 8) // (count * op.desc.vector_regions + 1))
    if op.desc.vector_grouped:
        return max(d for d in range(1, min(op.group, limit) + 1) if op.group % d == 0)
    if op.out_t is not None:
        E = c.vmem_row_elems
        limit = min(limit, c.vmem_rows // (count * c.cols) * E)
        if limit < E:
            raise ValueError(f"a transpose of {op.x.cols} columns does not fit this chip")
        limit -= limit % E
    return min(limit, op.rows)


def emit_vector_op(config, op, prog):
    """Append `op`'s chunks to `prog`; each chunk ends with a barrier (all its
    stores done before anything after it loads)."""
    op.check(config)
    c = config
    count = -(-op.x.cols // c.cols)
    m = _chunk_rows(c, op, count)
    for r0 in range(0, op.rows, m):
        _emit_chunk(c, op, prog, r0, min(m, op.rows - r0), count, m)


def _emit_chunk(c, op, prog, r0, m, count, m_max):
    desc = op.desc
    x = Tiles(0, m, op.x.cols, c.cols)
    region = count * m_max
    scratch = [x.like(region * (i + 1)) for i in range(4)]
    spare = region * desc.vector_regions
    params = Tiles(spare + m_max, 1, op.x.cols, c.cols)
    loads = move_tiles(prog, "load", op.x, r0, m, x, {})
    loads += desc.vector_loads(prog, op, r0, m, params, scratch)
    flag_instruction(prog, loads[-1], push_next=True)
    prog.sync("compute", pop_prev=True, push_next=True, vector=True)
    emit = VectorEmitter(prog, c).begin(pop_prev=True)
    if op.scale != 1.0 and desc.scaled:
        emit.map(VpuOp.MUL, x, x, scalar=op.scale)     # x * 1 is x: no pass
    desc.emit_vector(emit, op, x, params, scratch, spare)
    if op.out_t is not None:
        _transpose(emit, op, x, m)
    if emit.emitted:
        emit.end(push_next=True)
    else:                                   # a plain copy: the tokens pass through
        prog.sync("vector", pop_prev=True, push_next=True)
    first = dict(pop_prev=True, vector=True)
    for target, bf16 in ((op.out, False), (op.out_bf16, True)):
        if target is not None:
            move_tiles(prog, "store", target, r0, m, x, first, to_bf16=bf16)
            first = {}
    if op.out_t is not None:
        blocks = -(-m // c.vmem_row_elems)
        for t in range(count):
            for blk in range(blocks):
                width = min(c.vmem_row_elems, m - blk * c.vmem_row_elems)
                rows = min(c.cols, op.x.cols - t * c.cols)
                prog.store(vmem_row=(t * blocks + blk) * c.cols, rows=rows, row_bytes=2 * width,
                           ext_addr=op.out_t.addr + t * c.cols * op.out_t.stride
                           + 2 * (r0 + blk * c.vmem_row_elems),
                           ext_stride=op.out_t.stride, **first)
                first = {}
    prog.sync("store", push_prev=True)
    prog.sync("compute", pop_next=True, push_prev=True)
    prog.sync("load", pop_next=True)


def _transpose(emit, op, x, m):
    """VECTOR transposes of every (vmem_row_elems x cols) block of the chunk to
    VMEM: tile t's block b lands in VMEM rows (t*blocks + b)*cols."""
    c = emit.config
    blocks = -(-m // c.vmem_row_elems)
    for t in range(x.count):
        for blk in range(blocks):
            height = min(c.vmem_row_elems, m - blk * c.vmem_row_elems)
            emit.op(VpuOp.PASS, x.tile(t) + blk * c.vmem_row_elems, height,
                    (t * blocks + blk) * c.cols, to_vmem=True, transpose=True)
