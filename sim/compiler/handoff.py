"""Hand-offs in VMEM: a bf16 result of a fused epilogue that the next matmul
reading it as its activations takes straight from VMEM (docs/compiler.md,
"Hand-offs in VMEM").

The producer's epilogue writes the result, rounded to bf16 by the vector
unit (``to_vmem``: the rounding of a bf16 STORE), into a VMEM region laid out
as the consumer's activation buffers, one buffer per M block: row m of K tile
t at ``base + (m // Mb) * Mb * KT + t * Mb + m % Mb``. The consumer loads no
activations. Regions are stacked down from the top of VMEM and live from the
producer's op to the consumer's: every op in between plans below them
(`Handoffs.limits`). A transient result (`Operand.transient`) that no other
op reads is not stored at all.
"""

import functools
from dataclasses import dataclass, replace

from .operands import MatmulOp
from .plan import RING_SLOTS, OpPlan, ceil_div, plan_op

__all__ = ["Handoff", "Handoffs", "plan_handoffs"]


@dataclass(frozen=True)
class Handoff:
    """Op `producer`'s output `operand`, the activations of op `consumer`,
    in VMEM rows from `base` in the layout of the consumer's `plan` (whose
    ``a_buffers`` is its block count). `store`: whether the producer still
    writes it to external memory (another op reads it, or it is not
    transient)."""
    producer: int
    consumer: int
    operand: object
    base: int
    plan: OpPlan
    store: bool = True

    @property
    def rows(self):
        return self.plan.blocks * self.plan.Mb * self.plan.KT

    def pieces(self, m0, mrows, t):
        """(row offset from m0, rows, VMEM row) of result rows m0 .. m0+mrows-1
        of tile t, cut where the consumer's M blocks are."""
        Mb, KT, out, m = self.plan.Mb, self.plan.KT, [], m0
        while m < m0 + mrows:
            n = min(m0 + mrows, (m // Mb + 1) * Mb) - m
            out.append((m - m0, n, self.base + (m // Mb) * Mb * KT + t * Mb + m % Mb))
            m += n
        return out


@dataclass(frozen=True)
class Handoffs:
    """The hand-offs of a program's ops, and ``limits[i]``: the VMEM rows op i
    may use (below the regions live at it)."""
    items: tuple
    limits: tuple

    def to(self, consumer):
        return next((h for h in self.items if h.consumer == consumer), None)

    def of(self, producer):
        return tuple(h for h in self.items if h.producer == producer)


def _reads(op):
    if isinstance(op, MatmulOp):
        return op.reads
    return tuple(o for o in (op.x, op.other, op.params) if o is not None)


def _writes(op):
    if isinstance(op, MatmulOp):
        return op.writes
    return tuple(o for o in (op.out, op.out_bf16, op.out_t) if o is not None)


def _forwardable(config, producer, consumer):
    """Whether `consumer`'s activations can come from `producer`'s epilogue in
    VMEM: an exact bf16 output of a row-major epilogue, and whole K tiles
    whose VMEM rows hold what the vector unit writes (rows == cols)."""
    return (isinstance(producer, MatmulOp) and producer.epilogue is not None
            and not producer.transposed and consumer.a.dtype == "bf16"
            and any(w == consumer.a for w in producer.writes)
            and config.rows == config.cols and consumer.K % config.rows == 0)


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


def plan_handoffs(config, ops):
    """The `Handoffs` of `ops` (MatmulOps and VectorOps in program order):
    each matmul whose activations are the last write of an earlier fused
    epilogue, in op order, while the region fits beside those already live
    and every op in between still has a plan below it."""
    n, ring = len(ops), RING_SLOTS * config.rows
    limits, items = [config.vmem_rows] * n, []
    if not config.vpu:
        return Handoffs((), tuple(limits))
    for k, op in enumerate(ops):
        if not isinstance(op, MatmulOp):
            continue
        i = next((j for j in range(k - 1, -1, -1)
                  if any(w.overlaps(op.a) for w in _writes(ops[j]))), None)
        if (i is None or not _forwardable(config, ops[i], op)
                or any(h.operand == op.a for h in items)
                or any(not isinstance(o, MatmulOp) for o in ops[i:k])):
            continue
        top = min(limits[i:k + 1])
        plan = _consumer_plan(config, op, top - ring)
        if plan is None:
            continue
        base = top - plan.blocks * plan.Mb * plan.KT
        if not all(_fits(config, o.M, o.K, o.N, o.bias_kind, o.epilogue and o.epilogue.kind,
                         min(limits[j], base) - ring)
                   for j, o in enumerate(ops[i:k], i)):
            continue
        for j in range(i, k + 1):
            limits[j] = min(limits[j], base)
        items.append(Handoff(i, k, op.a, base, plan))
    items = [replace(h, store=not h.operand.transient or any(
        r.overlaps(h.operand) for j, o in enumerate(ops) if j > h.producer and j != h.consumer
        for r in _reads(o))) for h in items]
    return Handoffs(tuple(items), tuple(limits))
