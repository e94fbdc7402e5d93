"""Hand-offs in VMEM: results that later matmuls of the same program read go
from the vector unit straight into VMEM (docs/compiler.md, "Hand-offs in
VMEM").

A consumer's activations `a` may be one producer's output, part of it (a
head's columns of Q) or pieced together from several (the context, from
every head's P.V); its weights `b` part of one producer's output (a head's
V, or its rows of the transposed K^T). Each producer is a fused matmul; a
plain one gets an epilogue that only copies (``Epilogue("copy")``). Its
epilogue ends with ``to_vmem`` passes (the rounding of a bf16 STORE) into
the consumer's region, laid out as the consumer reads it:

* activations, one buffer per M block: row m of K tile t at
  ``base + (m // Mb) * Mb * KT + t * Mb + m % Mb`` (the consumer loads none);
* weights, tile by tile: row k of tile (t, j) at ``base + (t * NT + j) *
  rows + k`` (LOADW reads it there instead of a ring slot; nothing loaded).

Regions are stacked down from the top of VMEM and live from the first
producer's op to the consumer's: every op in between plans below them
(`Handoffs.limits`). A transient output (`Operand.transient`) that no other
op reads is not stored at all.
"""

import functools
from dataclasses import dataclass, replace

from .epilogue import Epilogue
from .operands import MatmulOp
from .plan import RING_SLOTS, OpPlan, ceil_div, plan_op

__all__ = ["Source", "Handoff", "Handoffs", "plan_handoffs"]


@dataclass(frozen=True)
class Source:
    """The part of a consumer's operand that op `producer` writes: rows
    ``rows[0] .. rows[1]-1`` and tiles ``tiles[0] .. tiles[1]-1`` of its
    accumulator result (its output `operand`, or the transpose of it when
    `transposed`). Result row m and tile j are, of activations, row ``m +
    dr`` and K tile ``j + dt``; of weights, row ``m + dr`` and column tile
    ``j + dt``, or (transposed) column ``m + dr`` and row tile ``j + dt``."""
    producer: int
    operand: object
    rows: tuple
    tiles: tuple
    dr: int
    dt: int
    transposed: bool = False


@dataclass(frozen=True)
class Handoff:
    """Op `consumer`'s `operand` ("a" or "b") in VMEM rows from `base`, in the
    layout of its `plan` (whose ``a_buffers`` is its block count when the
    activations are handed off), written by the epilogues of its `sources`."""
    consumer: int
    operand: str
    base: int
    plan: OpPlan
    sources: tuple
    tile: int           # rows = cols of the chip

    @property
    def rows(self):
        p = self.plan
        return p.blocks * p.Mb * p.KT if self.operand == "a" else p.KT * p.NT * self.tile

    def weight_row(self, t, j):
        """The VMEM row of weight tile (t, j)."""
        return self.base + (t * self.plan.NT + j) * self.tile

    def pieces(self, source, m0, mrows, j):
        """(row offset from m0, rows, VMEM row) of `source`'s result rows m0
        .. m0+mrows-1 of its tile j that this consumer reads: runs of rows
        that land in consecutive VMEM rows (one transposed block each, when
        the source is transposed)."""
        (r0, r1), (j0, j1) = source.rows, source.tiles
        if not j0 <= j < j1:
            return []
        out, m, end = [], max(m0, r0), min(m0 + mrows, r1)
        while m < end:
            run, row = self._run(m + source.dr, j + source.dt, source.transposed)
            n = min(end - m, run)
            out.append((m - m0, n, row))
            m += n
        return out

    def _run(self, c, t, transposed):
        """(rows to the next cut, VMEM row) of the consumer's row c of tile t."""
        T, Mb, KT = self.tile, self.plan.Mb, self.plan.KT
        if self.operand == "a":
            return (c // Mb + 1) * Mb - c, self.base + (c // Mb) * Mb * KT + t * Mb + c % Mb
        if transposed:
            # c: a column of the weights; a transposed block fills a tile's rows.
            if c % T:
                raise AssertionError("a transposed hand-off block must start a tile "
                                     "(plan_handoffs checks the producer's blocks)")
            return T, self.weight_row(t, c // T)
        return T - c % T, self.weight_row(c // T, t) + c % T


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

    def to(self, consumer, operand="a"):
        return next((h for h in self.items if h.consumer == consumer and h.operand == operand),
                    None)

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


def _weight_source(config, i, out, b, transposed):
    """The `Source` of output `out` of op i for weights `b` (a part of out, in
    whole tiles), or None."""
    tile, inside = config.cols, _offset(out, b)
    if inside is None or inside[0] + b.rows > out.rows:
        return None
    r, c = inside
    if c % tile or b.cols % tile or (transposed and (r % tile or b.rows % tile)):
        return None
    if transposed:      # out's rows are the result's columns: a head's rows of K^T
        return Source(i, out, (c, c + b.cols), (r // tile, (r + b.rows) // tile), -c,
                      -r // tile, True)
    return Source(i, out, (r, r + b.rows), (c // tile, (c + b.cols) // tile), -r, -c // tile)


def _producer_ok(op, out):
    return (isinstance(op, MatmulOp) and not op.relu and op.bias_kind != "matrix"
            and out.dtype == "bf16")


def _sources(config, ops, k, operand):
    """The `Source`s that cover op k's `operand` ("a" or "b") exactly, or
    None: the outputs of earlier matmuls with no ReLU and no matrix bias,
    bf16, disjoint, whole tiles, and no vector op in between. Weights come
    from one producer, which may be a transpose; activations from any number
    of row-major ones."""
    x = getattr(ops[k], operand)
    found = []
    for i in range(k):
        for out in _writes(ops[i]):
            if not out.overlaps(x):
                continue
            op = ops[i]
            if not _producer_ok(op, out) or (operand == "a" and op.transposed):
                return None
            source = (_source(config, i, out, x) if operand == "a" else
                      _weight_source(config, i, out, x, op.transposed))
            if source is None:
                return None
            found.append(source)
    if not found or any(not isinstance(o, MatmulOp) for o in ops[found[0].producer:k]):
        return None
    if operand == "b":
        return found if len(found) == 1 else None
    area = sum((s.rows[1] - s.rows[0]) * (s.tiles[1] - s.tiles[0]) for s in found)
    if area != x.rows * ceil_div(x.cols, config.cols):
        return None        # gaps, or producers that overlap
    return found


@functools.lru_cache(maxsize=4096)
def _steps(config, M, K, N, bias, epilogue, vmem_rows):
    """MATMUL steps of the plan within `vmem_rows`, or None if none fits."""
    plan = plan_op(config, M, K, N, bias, vmem_rows=vmem_rows, epilogue=epilogue)
    return None if plan is None else plan.steps


def _no_worse(config, op, was, vmem_rows):
    """Whether `op` (perhaps now with a copy epilogue) still plans within
    `vmem_rows` in no more steps than `was` did with the whole VMEM: a
    hand-off must not cut another op into smaller blocks."""
    ring = RING_SLOTS * config.rows

    def steps(o, rows):
        return _steps(config, o.M, o.K, o.N, o.bias_kind, o.epilogue and o.epilogue.kind, rows)

    new = steps(op, vmem_rows - ring)
    return new is not None and new <= steps(was, config.vmem_rows - ring)


def _plan(config, op, vmem_rows):
    ep = op.epilogue and op.epilogue.kind
    return plan_op(config, op.M, op.K, op.N, op.bias_kind, vmem_rows=vmem_rows, epilogue=ep)


def _consumer_plan(config, op, room, a_handed):
    """The consumer's plan within `room` VMEM rows, every M block in a buffer of
    its own when its activations are handed off; or None. (Of weights only
    the tile counts matter: the segment plans the op again.)"""
    if not a_handed:
        return _plan(config, op, room)
    KT = ceil_div(op.K, config.rows)
    plan = _plan(config, op, min(room, op.M * KT))
    if plan is None:
        return None
    plan = replace(plan, a_buffers=plan.blocks)
    return plan if plan.vmem_rows <= room else None


def _with_copy(op):
    return op if op.epilogue is not None else replace(op, epilogue=Epilogue("copy"))


def _refit(config, ops, items, sources):
    """`items` with the plans of consumers that `sources` turn into producers
    with a copy epilogue made again for that epilogue, or None if their
    activations' layout (Mb, blocks) would change."""
    for s in sources:
        old = next((h.plan for h in items if h.consumer == s.producer and h.operand == "a"), None)
        if old is None or old.epilogue is not None or ops[s.producer].epilogue is None:
            continue
        new = _consumer_plan(config, ops[s.producer], old.vmem_rows, True)
        if new is None or (new.Mb, new.blocks) != (old.Mb, old.blocks):
            return None
        items = [replace(h, plan=new) if h.consumer == s.producer else h for h in items]
    return list(items)


def _aligned(config, ops, limits, items):
    """Whether every transposed source's producer cuts its rows into blocks
    that start a tile (its transposed blocks then fill whole weight tiles)."""
    ring = RING_SLOTS * config.rows
    for h in items:
        for s in h.sources:
            if s.transposed:
                plan = _plan(config, ops[s.producer], limits[s.producer] - ring)
                if plan is None or (plan.blocks > 1 and plan.Mb % config.cols):
                    return False
    return True


def plan_handoffs(config, ops):
    """The `Handoffs` of `ops` (MatmulOps and VectorOps in program order),
    taken in op order (activations, then weights) while each region fits
    beside those already live and every op in its range still has a plan
    below it. Tiles must line up: a result tile (cols wide) is a K tile (rows
    deep) only when rows == cols, and K must be whole tiles."""
    given, ops, ring = list(ops), list(ops), RING_SLOTS * config.rows
    limits, items = [config.vmem_rows] * len(ops), []
    if not config.vpu or config.rows != config.cols:
        return Handoffs((), tuple(ops), tuple(limits))
    for k, op in enumerate(ops):
        if not isinstance(op, MatmulOp) or op.K % config.rows:
            continue
        for operand in ("a", "b"):
            sources = _sources(config, ops, k, operand)
            if sources is None:
                continue
            first = min(s.producer for s in sources)
            top = min(limits[first:k + 1])
            a_handoff = next((h for h in items if h.consumer == k), None)
            # The consumer's plan: made once, with its activations' hand-off.
            plan = (a_handoff.plan if a_handoff else
                    _consumer_plan(config, op, top - ring, operand == "a"))
            if plan is None:
                continue
            h = Handoff(k, operand, 0, plan, tuple(sources), config.cols)
            base = top - h.rows
            trial, trial_limits = list(ops), list(limits)
            for s in sources:
                trial[s.producer] = _with_copy(trial[s.producer])
            for j in range(first, k + 1):
                trial_limits[j] = min(limits[j], base)
            h = replace(h, base=base)
            refit = _refit(config, trial, items, sources)
            if refit is None:
                continue
            # Every op in the range still plans below the region, in no more
            # steps (the consumer too, unless its activations are handed off:
            # then its plan is the one above).
            last = k if operand == "b" and a_handoff is None else k - 1
            if (base < ring or not _aligned(config, trial, trial_limits, items + [h])
                    or (operand == "a" and plan.steps > _steps(
                        config, op.M, op.K, op.N, op.bias_kind, op.epilogue and op.epilogue.kind,
                        config.vmem_rows - ring))
                    or not all(_no_worse(config, trial[j], given[j], trial_limits[j])
                               for j in range(first, last + 1))):
                continue
            ops, limits = trial, trial_limits
            items = refit + [h]
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
