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

An add + LayerNorm epilogue's fp32 residual (`Epilogue.other`) can come the
same way, into *accumulator* rows laid out as its residual buffers, one per
M block: row m of tile t at ``base + (m // Mb) * NT * Mb + t * Mb + m % Mb``.

Regions are stacked down from the top of VMEM (of the accumulator) and live
from the first producer's op to the consumer's: every op in between plans
below them (`Handoffs.limits`, `Handoffs.acc_limits`), and in no more steps
than it would without them. A transient output (`Operand.transient`) that no
other op reads is not stored at all.
"""

import functools
from dataclasses import dataclass, replace

from .epilogue import Epilogue
from .operands import MatmulOp, Operand, Scatter
from .plan import OpPlan, ceil_div, plan_op, ring_rows

__all__ = ["Source", "Handoff", "Handoffs", "Preload", "plan_handoffs"]


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
    """Op `consumer`'s `operand` ("a" or "b" in VMEM, "other" in the
    accumulator) in rows from `base`, in the layout of its `plan` (whose
    ``a_buffers`` is its block count when the activations are handed off),
    written by the epilogues of its `sources`."""
    consumer: int
    operand: str
    base: int
    plan: OpPlan
    sources: tuple
    tile: int           # rows = cols of the chip
    in_place: bool = False   # a residual left in its producer's output buffers (at base)

    def has(self, t, j):
        """Whether tile (t, j) of the consumer's weights is in the region
        (every one: a `Preload` has some)."""
        return True

    @functools.cached_property
    def rows(self):
        p = self.plan
        return {"a": p.blocks * p.Mb * p.KT, "b": p.KT * p.NT * self.tile,
                "other": p.blocks * p.NT * p.Mb}[self.operand]

    @property
    def to_vmem(self):
        return self.operand != "other"

    @property
    def in_acc(self):
        return self.operand == "other"

    @functools.cached_property
    def first(self):
        """The first op of the region's range: its first producer."""
        return min(s.producer for s in self.sources)

    def residual_row(self, m0):
        """The first accumulator row of the residual of the block holding row m0."""
        return self.base + (m0 // self.plan.Mb) * self.plan.NT * self.plan.Mb

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
        if self.operand == "other":
            return (c // Mb + 1) * Mb - c, self.residual_row(c) + t * Mb + c % Mb
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
class Preload:
    """Weight tiles of op `consumer` that the segment of op `first` loads into
    VMEM rows from `base`, one tile after another as its steps leave the bus
    room: whole tiles of external memory that no op of the program before
    the consumer writes (a decode step's cached keys and values; docs/
    compiler.md, "Preloaded weights"). The consumer loads its other tiles
    itself, through its ring."""
    consumer: int
    first: int
    base: int
    tiles: tuple        # ((t, j), ...) in the order they are loaded
    tile: int           # rows = cols of the chip
    operand = "b"
    in_acc = False
    to_vmem = True
    in_place = False
    sources = ()

    @functools.cached_property
    def _index(self):
        return {tj: i for i, tj in enumerate(self.tiles)}

    @property
    def rows(self):
        return len(self.tiles) * self.tile

    def has(self, t, j):
        return (t, j) in self._index

    def weight_row(self, t, j):
        """The VMEM row of weight tile (t, j)."""
        return self.base + self._index[t, j] * self.tile

    def loads(self, op):
        """The LOADs (`Program.load` keywords) of the tiles of `op`'s weights."""
        b, T = op.b, self.tile
        return [dict(vmem_row=self.weight_row(t, j), ext_addr=b.addr + t * T * b.stride + 2 * j * T,
                     rows=T, row_bytes=2 * T, ext_stride=b.stride) for t, j in self.tiles]


@dataclass(frozen=True)
class Handoffs:
    """The hand-offs of a program's ops; ``ops``: the ops as compiled (plain
    producers with a copy epilogue); ``limits[i]``: the VMEM rows op i may use
    (below the regions live at it); ``stored``: the producer outputs that
    must still be written to external memory."""
    items: tuple
    ops: tuple
    limits: tuple
    acc_limits: tuple
    stored: frozenset = frozenset()

    def out_base(self, producer):
        """The accumulator row where `producer` puts its output buffers, when
        a consumer reads its result there (an in-place residual), or None."""
        return next((h.base for h in self.items if h.in_place and h.first == producer), None)

    def plan(self, consumer):
        """The plan a consumer of handed-off activations or residual is
        compiled with (its regions' layout), or None."""
        h = self.to(consumer, "a") or self.to(consumer, "other")
        return None if h is None else h.plan

    def to(self, consumer, operand="a"):
        return next((h for h in self.items if h.consumer == consumer and h.operand == operand),
                    None)

    def of(self, producer):
        """[(Handoff, Source)] that op `producer` writes."""
        return [(h, s) for h in self.items for s in h.sources if s.producer == producer]

    def preloads(self, first):
        """The `Preload`s the segment of op `first` loads, in program order."""
        return [h for h in self.items if isinstance(h, Preload) and h.first == first]

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


OPERANDS = ("other", "a", "b")    # a consumer's hand-offs, in the order they are tried


def _operand(op, name):
    if name == "other":
        ep = op.epilogue
        return ep.other if ep is not None and ep.desc.handoff_other else None
    if name == "b" and op.quantized:
        return None          # GGUF blocks in external memory: nothing writes them
    return getattr(op, name)


def _producer_ok(op, out, operand):
    return (isinstance(op, MatmulOp) and not op.relu and op.bias_kind != "matrix"
            and out.dtype == ("fp32" if operand == "other" else "bf16")
            and (operand == "b" or not op.transposed)
            and not isinstance(op.c, Scatter)
            and (op.epilogue is None or (op.epilogue.desc.producer
                                         and not op.epilogue.is_paired)))


def _sources(config, ops, k, operand):
    """The `Source`s that cover op k's `operand` ("a", "b" or "other")
    exactly, or None: the outputs of earlier matmuls with no ReLU and no
    matrix bias, bf16 (fp32 for a residual), disjoint, whole tiles, and no
    vector op in between. Weights and residuals come from one producer (of
    weights, perhaps a transpose); activations from any number."""
    x = _operand(ops[k], operand)
    if x is None:
        return None
    found = []
    for i in range(k):
        for out in _writes(ops[i]):
            if not out.overlaps(x):
                continue
            if not _producer_ok(ops[i], out, operand):
                return None
            source = (_weight_source(config, i, out, x, ops[i].transposed) if operand == "b"
                      else _source(config, i, out, x))
            if source is None:
                return None
            found.append(source)
    if not found or any(not isinstance(o, MatmulOp) for o in ops[found[0].producer:k]):
        return None
    if operand != "a":
        return found if len(found) == 1 and _covers(config, found, x) else None
    # Not to an op after another that reads the same activations without a
    # hand-off: a hand-off fixes its consumer's plan, which would cut it from
    # the ops beside it into a segment of its own (a decode step's V and Q
    # after K, which reads the previous layer's norm from memory).
    if any(isinstance(o, MatmulOp) and o.a == x
           for o in ops[max(s.producer for s in found) + 1:k]):
        return None
    return found if _covers(config, found, x) else None


def _covers(config, found, x):
    """Whether the sources cover x's tiles once each (no gaps, no overlaps)."""
    if found[0].transposed:
        return True       # one source, whole tiles of x by `_weight_source`
    area = sum((s.rows[1] - s.rows[0]) * (s.tiles[1] - s.tiles[0]) for s in found)
    return area == x.rows * ceil_div(x.cols, config.cols)


@functools.lru_cache(maxsize=4096)
def _cached_plan(config, M, K, N, bias, epilogue, vmem_rows, acc_rows, extra=()):
    return plan_op(config, M, K, N, bias, vmem_rows=vmem_rows, acc_rows=acc_rows,
                   epilogue=epilogue, **dict(extra))


def _op_plan(config, op, vmem_rows, acc_rows):
    args = op.plan_args(config)
    kind = args.pop("epilogue", None)
    return _cached_plan(config, op.M, op.K, op.N, op.bias_kind, kind, vmem_rows, acc_rows,
                        tuple(sorted(args.items())))


def _op_steps(config, op, vmem_rows, acc_rows):
    """MATMUL steps of the op's plan within the rows given, or None if none fits."""
    plan = _op_plan(config, op, vmem_rows, acc_rows)
    return None if plan is None else plan.steps


def _full_steps(config, op):
    return _op_steps(config, op, config.vmem_rows - ring_rows(config, op), config.acc_rows)


def _consumer_plan(config, op, vmem_rows, acc_rows, a_handed, resident):
    """The consumer's plan within the rows given, every M block in a buffer of
    its own when its activations are handed off, without residual buffers
    when its residual is; or None. (Of weights only the tile counts matter:
    without other hand-offs the segment plans the op again.)"""
    KT = ceil_div(op.K, config.rows)
    plan = plan_op(config, op.M, op.K, op.N, op.bias_kind,
                   vmem_rows=min(vmem_rows, op.M * KT) if a_handed else vmem_rows,
                   acc_rows=acc_rows, resident=resident, **op.plan_args(config))
    if plan is None or not a_handed:
        return plan
    plan = replace(plan, a_buffers=plan.blocks)
    return plan if plan.vmem_rows <= vmem_rows else None


def _with_copy(op):
    return op if op.epilogue is not None else replace(op, epilogue=Epilogue("copy"))


@dataclass
class _State:
    """What `plan_handoffs` has decided so far."""
    ops: list
    limits: list
    acc_limits: list
    items: list

    def fixed(self, k):
        """The plan op k's regions are laid out for, or None."""
        h = self.to(k, "a") or self.to(k, "other")
        return None if h is None else h.plan

    def to(self, k, operand):
        return self.index.get((k, operand))

    @property
    def index(self):
        if getattr(self, "_index", None) is None or self._indexed is not self.items:
            self._index = {(h.consumer, h.operand): h for h in self.items}
            self._indexed = self.items
        return self._index

    def copy(self):
        return _State(list(self.ops), list(self.limits), list(self.acc_limits), list(self.items))


def _in_place(config, given, state, k, sources):
    """`state` with op k's residual left where its producer's LayerNorm wrote
    it, or None. That needs a producer whose groups each have an output
    buffer of their own (a row-wise epilogue, no more M blocks than buffers),
    laid out as the consumer's residual (same M blocks, N tiles): the
    producer's segment puts its output buffers at the top of the accumulator
    (`_Ring.out_base`) and nothing uses those rows until the consumer."""
    (s,), op = sources, state.ops[k]
    prod = state.ops[s.producer]
    if s.operand != prod.c or prod.epilogue is None or not prod.epilogue.row_wise:
        return None
    pplan = state.fixed(s.producer) or _op_plan(
        config, prod, state.limits[s.producer] - ring_rows(config, prod),
        state.acc_limits[s.producer])
    if pplan is None or pplan.blocks > pplan.out_buffers or pplan.G < pplan.NT:
        return None
    h = Handoff(k, "other", config.acc_rows - pplan.out_rows, None, tuple(sources), config.cols,
                in_place=True)
    plan = _consumer_plan(config, op, state.limits[k] - ring_rows(config, op), h.base, False,
                          True)
    if (plan is None or (plan.Mb, plan.blocks) != (pplan.Mb, pplan.blocks)
            or plan.steps > _full_steps(config, op) or pplan.acc_rows - pplan.out_rows > h.base):
        return None
    h = replace(h, plan=plan)
    if pplan.acc_rows - pplan.out_rows > state.acc_limits[s.producer] or any(
            x.in_acc and x.first <= k and s.producer <= x.consumer and x.base + x.rows > h.base
            for x in state.items):
        return None          # the producer's other rows, or another region, in the way
    new = state.copy()
    new.items = new.items + [h]
    new.acc_limits[s.producer + 1:k + 1] = [min(x, h.base)
                                            for x in new.acc_limits[s.producer + 1:k + 1]]
    ok = plan.acc_rows <= new.acc_limits[k] and all(
        _no_worse(config, new, given, j) for j in range(s.producer + 1, k))
    return new if ok else None


def _take(config, given, state, k, operand, sources):
    """`state` with op k's `operand` handed off from `sources`, or None if it
    does not fit or would make an op take more steps."""
    op = state.ops[k]
    ring = ring_rows(config, op)
    fixed = state.fixed(k)
    if operand == "other" and fixed is None:
        new = _in_place(config, given, state, k, sources)
        if new is not None:
            return new
    if operand == "other":
        # The region takes about M * NT rows; the consumer plans below that.
        plan = _consumer_plan(config, op, state.limits[k] - ring,
                              state.acc_limits[k] - op.M * ceil_div(op.N, config.cols),
                              False, True)
    elif operand == "a":
        plan = (replace(fixed, a_buffers=fixed.blocks) if fixed else
                _consumer_plan(config, op, config.vmem_rows - ring, state.acc_limits[k], True,
                               False))
    else:
        plan = fixed or plan_op(config, op.M, op.K, op.N, op.bias_kind)
    if plan is None or (operand != "b" and plan.steps > _full_steps(config, op)):
        return None
    h = Handoff(k, operand, 0, plan, tuple(sources), config.cols)
    top = config.acc_rows if operand == "other" else config.vmem_rows
    base = _fit(state.items, h, top)
    if base is None or (operand != "other" and base < ring):
        return None
    new = state.copy()
    for s in sources:
        new.ops[s.producer] = _with_copy(new.ops[s.producer])
    # The consumer's plan is its regions' layout: an "a" hand-off after an
    # "other" one widens a_buffers, which the "other" region does not see.
    new.items = [replace(x, plan=plan) if x.consumer == k and operand == "a" else x
                 for x in new.items] + [replace(h, base=base)]
    limits = new.acc_limits if h.in_acc else new.limits     # only h's rows are new
    limits[h.first:k + 1] = [min(x, base) for x in limits[h.first:k + 1]]
    if not _refit(config, new, sources) or not _aligned(config, new):
        return None
    last = k if fixed is None and operand == "b" else k - 1
    if operand == "other" and plan.acc_rows > new.acc_limits[k]:
        return None
    return new if all(_no_worse(config, new, given, j) for j in range(h.first, last + 1)) else None


def _fit(items, h, top):
    """The highest base for `h`'s region, below `top` and clear of every region
    in the same memory whose range overlaps its range; or None."""
    busy = sorted(((x.base, x.base + x.rows) for x in items
                   if x.in_acc == h.in_acc and x.first <= h.consumer and h.first <= x.consumer),
                  key=lambda span: -span[1])
    rows, ceiling = h.rows, top          # walk the gaps from the top down
    for lo, hi in busy:
        if ceiling - hi >= rows:
            return ceiling - rows
        ceiling = min(ceiling, lo)
    return ceiling - rows if ceiling >= rows else None


def _no_worse(config, state, given, j):
    """Whether op j still fits below the regions live at it, in no more steps
    than the op as given with the whole chip: a hand-off must not cut another
    op into smaller blocks."""
    ring, fixed = ring_rows(config, state.ops[j]), state.fixed(j)
    vmem, acc = state.limits[j] - ring, state.acc_limits[j]
    if fixed is not None:
        return fixed.acc_rows <= acc and (state.to(j, "a") is not None or fixed.vmem_rows <= vmem)
    steps = _op_steps(config, state.ops[j], vmem, acc)
    return steps is not None and steps <= _full_steps(config, given[j])


def _refit(config, state, sources):
    """Make the plans of consumers that `sources` turn into producers with a
    copy epilogue again for that epilogue; False if their regions' layout
    (Mb, blocks) would change."""
    for s in sources:
        old = state.fixed(s.producer)
        if old is None or old.epilogue is not None:
            continue
        a_handed = old.a_buffers == old.blocks and any(
            h.consumer == s.producer and h.operand == "a" for h in state.items)
        new = _consumer_plan(config, state.ops[s.producer],
                             old.vmem_rows if a_handed else
                             state.limits[s.producer]
                             - ring_rows(config, state.ops[s.producer]),
                             state.acc_limits[s.producer], a_handed, old.resident)
        if new is None or (new.Mb, new.blocks) != (old.Mb, old.blocks):
            return False
        state.items = [replace(h, plan=new) if h.consumer == s.producer else h
                       for h in state.items]
    return True


def _aligned(config, state):
    """Whether every transposed source's producer cuts its rows into blocks
    that start a tile (its transposed blocks then fill whole weight tiles)."""
    for h in state.items:
        for s in h.sources:
            if s.transposed:
                op = state.ops[s.producer]
                plan = _cached_plan(config, op.M, op.K, op.N, op.bias_kind, "transpose",
                                    state.limits[s.producer] - ring_rows(config, op),
                                    state.acc_limits[s.producer])
                if plan is None or (plan.blocks > 1 and plan.Mb % config.cols):
                    return False
    return True


def plan_handoffs(config, ops):
    """The `Handoffs` of `ops` (MatmulOps and VectorOps in program order),
    taken op by op (residual, activations, weights) while each region fits
    beside those already live and every op in its range still plans below it
    in no more steps. Tiles must line up: a result tile (cols wide) is a K
    tile (rows deep) only when rows == cols, and K must be whole tiles."""
    given = list(ops)
    state = _State(list(ops), [config.vmem_rows] * len(ops), [config.acc_rows] * len(ops), [])
    if config.vpu and config.rows == config.cols:
        for k, op in enumerate(given):
            if not isinstance(op, MatmulOp) or op.K % config.rows:
                continue
            for operand in OPERANDS:
                sources = _sources(config, state.ops, k, operand)
                new = sources and _take(config, given, state, k, operand, sources)
                state = new or state
        state = _preloaded(config, given, state)
    return Handoffs(tuple(state.items), tuple(state.ops), tuple(state.limits),
                    tuple(state.acc_limits), _stored(state.ops, state.items))


# Cycles a LOAD of a preloaded tile takes besides its beats (a 16-row K^T
# tile of the 128-bit bus: 32 beats in 38 cycles, docs/llm.md).
_PRELOAD_START = 6


def _bus_room(config, op):
    """Bus beats that quantized matmul `op`'s steps leave free: at each step
    the array takes a block's rows or its weight port's cycles, the bus a
    weight tile's beats (at batch 16, 16 cycles against Q4_1's 10 beats;
    at batch 1, 9 against 10: none)."""
    step = max(min(op.M, config.rows), config.weight_load_cycles + 1)
    beats = op.b.tile_beats(config.rows, config.axi_data_bytes)
    return (_full_steps(config, op) or 0) * max(0, step - beats)


def _written_before(ops, k, tile):
    return any(tile.shares_bytes(o) for op in ops[:k] for w in _writes(op)
               for o in getattr(w, "operands", (w,)))


def _preload_tiles(config, ops, k):
    """The whole tiles of op k's bf16 weights in external memory that no op
    before it writes, in (t, j) order."""
    b, T = ops[k].b, config.rows
    out = []
    for t in range(b.rows // T):
        for j in range(b.cols // T):
            tile = Operand(b.addr + t * T * b.stride + 2 * j * T, T, T, b.stride, "bf16")
            if not _written_before(ops, k, tile):
                out.append((t, j))
    return out


def _preloaded(config, given, state):
    """`state` with `Preload`s: the quantized matmuls whose steps leave the
    bus room (at batch 16: a decode step's K, V and Q projections, and the
    FFN before them when the program holds the previous layer's end) load
    the weight tiles of the plain matmuls after them that nothing in the
    program writes (the heads' cached keys and values) in that room, into
    regions stacked below the others. Each loader in turn, the most room
    first, takes as many tiles as its room and the ops in between still
    planning in no more steps allow."""
    ops = state.ops
    loaders = [i for i, op in enumerate(ops) if isinstance(op, MatmulOp) and op.quantized
               and any(isinstance(o, MatmulOp) and not o.quantized for o in ops[i + 1:])]
    for first in sorted(loaders, key=lambda i: (-_bus_room(config, ops[i]), i)):
        state = _preloaded_by(config, given, state, first)
    return state


def _preloaded_by(config, given, state, first):
    """`state` with the `Preload`s that op `first`'s segment loads: the
    tiles of the plain matmuls after it that have none yet, in program
    order, as many as its room takes (`_preloaded`)."""
    ops, T = state.ops, config.rows
    budget = _bus_room(config, ops[first]) // (
        T * ceil_div(2 * config.cols, config.axi_data_bytes) + _PRELOAD_START)
    # The loader's segment may begin with the quantized matmuls before it
    # that it does not read (`plan_segments`), and its LOADs go out from
    # the segment's first steps: the regions clear every region those use.
    start = first
    while start and isinstance(ops[start - 1], MatmulOp) and ops[start - 1].quantized and not any(
            r.overlaps(w) for w in ops[start - 1].writes for o in ops[start:first + 1]
            for r in o.reads):
        start -= 1
    items = list(state.items)
    for k in range(first + 1, len(ops)):
        op = ops[k]
        if budget <= 0:
            break
        if (not isinstance(op, MatmulOp) or op.quantized or state.to(k, "b") is not None
                or op.b.dtype != "bf16"):
            continue
        chosen = _preload_tiles(config, ops, k)[:budget]
        if not chosen:
            continue
        h = Preload(k, first, 0, tuple(chosen), config.cols)
        base = _fit(items, replace(h, first=start), config.vmem_rows)
        if base is None:
            break
        items.append(replace(h, base=base))
        budget -= len(chosen)
    added = items[len(state.items):]
    if not added:
        return state
    # The most of them (in program order) under which every op in their
    # range still plans in no more steps.
    lo, hi = 0, len(added)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _with_preloads(config, given, state, added[:mid]) is not None:
            lo = mid
        else:
            hi = mid - 1
    return _with_preloads(config, given, state, added[:lo]) if lo else state


def _with_preloads(config, given, state, added):
    """`state` with the `Preload`s `added` and their ops' limits, or None if
    an op in their range would then take more steps."""
    new = state.copy()
    new.items = new.items + list(added)
    for h in added:
        new.limits[h.first:h.consumer + 1] = [min(x, h.base)
                                              for x in new.limits[h.first:h.consumer + 1]]
    last = max(h.consumer for h in added)
    ok = all(_no_worse(config, new, given, j) for j in range(added[0].first, last + 1))
    return new if ok else None


def _stored(ops, items):
    """(producer, output) pairs that must still be stored: not transient, or
    read by an op that does not have them in VMEM."""
    handed = {}            # (producer, output) -> the consumers that have it on the chip
    for h in items:
        for s in h.sources:
            handed.setdefault((s.producer, s.operand), set()).add(h.consumer)
    reads = [_reads(o) for o in ops]
    stored = set()
    for (producer, out), consumers in handed.items():
        if not out.transient or any(
                j not in consumers and any(r.overlaps(out) for r in reads[j])
                for j in range(producer + 1, len(ops))):
            stored.add((producer, out))
    return frozenset(stored)
