"""Hand-offs in VMEM: results that later matmuls of the same program read as
their activations go from the vector unit straight into VMEM
(docs/compiler.md, "Hand-offs in VMEM").

A consumer's activations `a` may be one producer's output, part of it (a
head's columns of Q) or pieced together from several (the context, from
every head's P.V). Each producer is a fused matmul; a plain one gets an
epilogue that only copies (``Epilogue("copy")``). Its epilogue ends with
``to_vmem`` passes (the rounding of a bf16 STORE) into the consumer's region,
laid out as the consumer's activation buffers, one per M block: row m of K
tile t at ``base + (m // Mb) * Mb * KT + t * Mb + m % Mb``. The consumer
loads no activations. Regions are stacked down from the top of VMEM and live
from the first producer's op to the consumer's: every op in between plans
below them (`Handoffs.limits`). A transient output (`Operand.transient`) that
no other op reads is not stored at all.
"""

import functools
from dataclasses import dataclass, replace

from .epilogue import Epilogue
from .operands import MatmulOp
from .plan import RING_SLOTS, OpPlan, ceil_div, plan_op

__all__ = ["Source", "Handoff", "Handoffs", "plan_handoffs"]


@dataclass(frozen=True)
class Source:
    """The part of a consumer's activations that op `producer` writes: its
    output `operand`, rows ``rows[0] .. rows[1]-1`` and tiles ``tiles[0] ..
    tiles[1]-1`` of it, which are the consumer's rows ``+ dr`` and K tiles
    ``+ dt``."""
    producer: int
    operand: object
    rows: tuple
    tiles: tuple
    dr: int
    dt: int


@dataclass(frozen=True)
class Handoff:
    """Op `consumer`'s activations in VMEM rows from `base`, in the layout of
    its `plan` (whose ``a_buffers`` is its block count), written by the
    epilogues of its `sources`."""
    consumer: int
    base: int
    plan: OpPlan
    sources: tuple

    @property
    def rows(self):
        return self.plan.blocks * self.plan.Mb * self.plan.KT

    def pieces(self, source, m0, mrows, j):
        """(row offset from m0, rows, VMEM row) of `source`'s result rows m0
        .. m0+mrows-1 of its tile j that this consumer reads, cut where its M
        blocks are."""
        (r0, r1), (j0, j1) = source.rows, source.tiles
        if not j0 <= j < j1:
            return []
        Mb, KT, t = self.plan.Mb, self.plan.KT, j + source.dt
        out, m, end = [], max(m0, r0), min(m0 + mrows, r1)
        while m < end:
            c = m + source.dr                        # the consumer's row
            n = min(end - m, (c // Mb + 1) * Mb - c)
            out.append((m - m0, n, self.base + (c // Mb) * Mb * KT + t * Mb + c % Mb))
            m += n
        return out


@dataclass(frozen=True)
class Handoffs:
    """The hand-offs of a program's ops; ``ops``: the ops as compiled (plain
    producers with a copy epilogue); ``limits[i]``: the VMEM rows op i may use
    (below the regions live at it); ``stored``: the producer outputs that
    must still be written to external memory."""
    items: tuple
    ops: tuple
    limits: tuple
    stored: frozenset = frozenset()

    def to(self, consumer):
        return next((h for h in self.items if h.consumer == consumer), None)

    def of(self, producer):
        """[(Handoff, Source)] that op `producer` writes."""
        return [(h, s) for h in self.items for s in h.sources if s.producer == producer]

    def keeps(self, producer, operand):
        """Whether `producer` need not store `operand` (every reader has it in VMEM)."""
        return (producer, operand) not in self.stored and any(
            s.operand == operand for _, s in self.of(producer))


def _reads(op):
    if isinstance(op, MatmulOp):
        return op.reads
    return tuple(o for o in (op.x, op.other, op.params) if o is not None)


def _writes(op):
    if isinstance(op, MatmulOp):
        return op.writes
    return tuple(o for o in (op.out, op.out_bf16, op.out_t) if o is not None)


def _offset(outer, inner):
    """(row, element) of `inner`'s first element in `outer` when both are
    views of one row-major tensor (same stride and dtype) and `inner` lies in
    `outer`'s columns, else None."""
    if outer.stride != inner.stride or outer.dtype != inner.dtype:
        return None
    d = inner.addr - outer.addr
    if d < 0 or d % inner.elem:
        return None
    r, c = divmod(d, outer.stride)
    c //= inner.elem
    return (r, c) if c + inner.cols <= outer.cols else None


def _source(config, i, out, a):
    """The `Source` of output `out` of op i for activations `a`, if their
    overlap is whole tiles of both (else None)."""
    tile = config.cols
    inside = _offset(out, a)                    # a part of out (Q's columns of a head)
    if inside is not None:
        (r, c), rows, cols = inside, (inside[0], inside[0] + a.rows), a.cols
        if r + a.rows > out.rows or c % tile or cols % tile:
            return None
        return Source(i, out, rows, (c // tile, (c + cols) // tile), -r, -c // tile)
    around = _offset(a, out)                    # out is a part of a (a head's context)
    if around is None:
        return None
    r, c = around
    if r + out.rows > a.rows or c % tile or (out.cols % tile and c + out.cols < a.cols):
        return None
    return Source(i, out, (0, out.rows), (0, ceil_div(out.cols, tile)), r, c // tile)


def _sources(config, ops, k):
    """The `Source`s that cover op k's activations exactly, or None: the
    outputs of earlier matmuls with a row-major or no epilogue (no ReLU, no
    matrix bias), bf16, disjoint, whole tiles, and no vector op in between."""
    a = ops[k].a
    found = []
    for i in range(k):
        for out in _writes(ops[i]):
            if not out.overlaps(a):
                continue
            op = ops[i]
            if (not isinstance(op, MatmulOp) or op.transposed or op.relu
                    or op.bias_kind == "matrix" or out.dtype != "bf16"):
                return None
            source = _source(config, i, out, a)
            if source is None:
                return None
            found.append(source)
    if not found or any(not isinstance(o, MatmulOp) for o in ops[found[0].producer:k]):
        return None
    area = sum((s.rows[1] - s.rows[0]) * (s.tiles[1] - s.tiles[0]) for s in found)
    if area != a.rows * ceil_div(a.cols, config.cols):
        return None        # gaps, or producers that overlap
    return found


@functools.lru_cache(maxsize=4096)
def _fits(config, M, K, N, bias, epilogue, vmem_rows):
    return plan_op(config, M, K, N, bias, vmem_rows=vmem_rows, epilogue=epilogue) is not None


def _consumer_plan(config, op, room):
    """The consumer's plan with every M block in a buffer of its own, within
    `room` VMEM rows, or None."""
    KT = ceil_div(op.K, config.rows)
    ep = op.epilogue and op.epilogue.kind
    plan = plan_op(config, op.M, op.K, op.N, op.bias_kind, vmem_rows=min(room, op.M * KT),
                   epilogue=ep)
    if plan is None:
        return None
    plan = replace(plan, a_buffers=plan.blocks)
    return plan if plan.vmem_rows <= room else None


def _with_copy(op):
    return op if op.epilogue is not None else replace(op, epilogue=Epilogue("copy"))


def plan_handoffs(config, ops):
    """The `Handoffs` of `ops` (MatmulOps and VectorOps in program order),
    taken in op order while each region fits beside those already live and
    every op in its range still has a plan below it. Tiles must line up: a
    result tile (cols wide) is a K tile (rows deep) only when rows == cols,
    and K must be whole tiles."""
    ops, ring = list(ops), RING_SLOTS * config.rows
    limits, items = [config.vmem_rows] * len(ops), []
    if not config.vpu or config.rows != config.cols:
        return Handoffs((), tuple(ops), tuple(limits))
    for k, op in enumerate(ops):
        if not isinstance(op, MatmulOp) or op.K % config.rows:
            continue
        sources = _sources(config, ops, k)
        if sources is None:
            continue
        first = min(s.producer for s in sources)
        top = min(limits[first:k + 1])
        plan = _consumer_plan(config, op, top - ring)
        if plan is None:
            continue
        base = top - plan.blocks * plan.Mb * plan.KT
        trial = list(ops)
        for s in sources:
            trial[s.producer] = _with_copy(trial[s.producer])
        if not all(_fits(config, o.M, o.K, o.N, o.bias_kind, o.epilogue and o.epilogue.kind,
                         min(limits[j], base) - ring)
                   for j, o in enumerate(trial[first:k], first)):
            continue
        ops = trial
        for j in range(first, k + 1):
            limits[j] = min(limits[j], base)
        items.append(Handoff(k, base, plan, tuple(sources)))
    return Handoffs(tuple(items), tuple(ops), tuple(limits), _stored(ops, items))


def _stored(ops, items):
    """(producer, output) pairs that must still be stored: not transient, or
    read by an op that does not have them in VMEM."""
    stored = set()
    for h in items:
        for s in h.sources:
            readers = [j for j, o in enumerate(ops) if j > s.producer and j != h.consumer
                       and any(r.overlaps(s.operand) for r in _reads(o))]
            handed = {x.consumer for x in items for t in x.sources
                      if t.producer == s.producer and t.operand == s.operand}
            if not s.operand.transient or any(j not in handed for j in readers):
                stored.add((s.producer, s.operand))
    return frozenset(stored)
