"""Tensor parallelism on a pod (docs/pod.md, "Tensor parallel"): a BERT-style
encoder layer split Megatron-style over the chips of a `Pod`.

Chip ``c`` of ``n`` holds heads ``c*h/n .. (c+1)*h/n - 1`` (their columns of
Wq, Wk and Wv and their rows of Wo) and FFN columns ``c*F/n ..`` (those
columns of W1, those rows of W2). Each all-reduce of Megatron's layer is a
reduce-scatter and an all-gather, and the LayerNorm after it runs between the
two, each chip on the rows it holds (as sequence parallelism does): the
LayerNorms are not repeated on every chip, and no more bytes cross the links.
A layer is seven phases, the pod waiting for all chips at each:

1. each chip: Q, K^T, V of its heads, their attention, and ``context_c @
   Wo_c`` (chip 0 seeds it with Wo's bias) -- one program;
2. the ring reduce-scatter of those partial sums (`Pod.reduce_scatter`):
   chip i holds the sum of token rows ``r_i``, chunk ``(i + 1) mod n``;
3. each chip: ``x1[r_i] = LayerNorm(x[r_i] + attention[r_i])``;
4. the ring all-gather of x1 (`Pod.all_gather`);
5. each chip: ``gelu(x1 @ W1_c + b1_c) @ W2_c`` (chip 0 seeds it with b2);
6. the ring reduce-scatter of those;
7. each chip: ``LayerNorm(x1[r_i] + ffn[r_i])``, its rows of the output.

The layer's cycles are the slowest chip's of each chip phase plus the
collectives' (their whole programs: LOAD, ring, STORE). The result is
bit-exact to the golden pod form
(docs/pod.md, "Sharded work"): the partial sums
added in the ring order, every other operation as on one chip.
"""

import math

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..runtime.vector import layer_norm_params, softmax_bias
from .blocks import Linear, attention, sequence_heads

__all__ = ["TensorParallelLayer", "shard_ranges"]


def shard_ranges(total, n, what):
    """``[(lo, hi)]`` of `n` equal shards of `total`, which `n` must divide."""
    if total % n:
        raise ValueError(f"{what} ({total}) must be a multiple of the pod's chips ({n})")
    size = total // n
    return [(c * size, (c + 1) * size) for c in range(n)]


class TensorParallelLayer:
    """One encoder layer (`LayerWeights` of an `EncoderConfig`) on a `Pod`,
    its shards resident on the chips from construction.

    Call it with the layer's input ``x`` (tokens, hidden) float32 and the
    (B, L) boolean mask: returns the output (tokens, hidden) float32, equal on
    every chip, and sets ``last_cycles`` (the layer's cycles) and
    ``last_phases`` (each phase's)."""

    def __init__(self, pod, config, weights):
        if not pod.config.vpu:
            raise ValueError("a tensor-parallel layer runs its layer ops on the vector unit: "
                             "the pod's chips need vpu=True")
        self.pod, self.config = pod, config
        n = pod.n_chips
        heads = shard_ranges(config.heads, n, "the heads")
        ffn = shard_ranges(config.ffn, n, "the FFN width")
        d = config.head_dim
        shards = [_shard(weights, (lo * d, hi * d), f, c == 0) for c, ((lo, hi), f)
                  in enumerate(zip(heads, ffn))]
        pod.map(_load_shard, [(s, config) for s in shards], "loading the layer's shards")
        self.last_cycles, self.last_phases = None, None

    def __call__(self, x, mask):
        x = np.ascontiguousarray(x, np.float32)
        mask = np.asarray(mask, bool)
        B, L = mask.shape
        cfg, pod, n = self.config, self.pod, self.pod.n_chips
        if x.shape != (B * L, cfg.hidden):
            raise ValueError(f"x must be (tokens, hidden) = {(B * L, cfg.hidden)} for a "
                             f"mask of {mask.shape}, not {x.shape}")
        if (B * L) % n or cfg.hidden % pod.config.cols:
            raise ValueError(f"the tokens ({B * L}) must be a multiple of the chips ({n}) and "
                             f"hidden ({cfg.hidden}) of the chips' columns "
                             f"({pod.config.cols}): each chip normalises whole rows")
        per = B * L // n
        # Chip i holds token rows of chunk (i + 1) mod n after a reduce-scatter.
        rows = [slice(((i + 1) % n) * per, ((i + 1) % n + 1) * per) for i in range(n)]
        phases = {}

        def chips(name, fn, args):
            out = pod.map(fn, args, name)
            phases[name] = max(cycles for _, cycles in out)
            return [result for result, _ in out]

        def collective(name, fn, parts):
            out = fn(parts)
            phases[name] = pod.last_stats.cycles
            return out

        partial = chips("attention", _attention_partial, [(x, mask, rows[i]) for i in range(n)])
        mine = collective("reduce-scatter 1", pod.reduce_scatter, partial)
        x1 = chips("layer norm 1", _norm, [(m.reshape(per, -1), "x", "x1", "ln1") for m in mine])
        # Each chip goes on with its own copy of the gathered rows.
        gathered = collective("all-gather", pod.all_gather, x1)
        x1 = [np.concatenate([gathered[j][(c - 1) % n] for c in range(n)]) for j in range(n)]
        partial = chips("ffn", _ffn_partial, [(x1[j],) for j in range(n)])
        mine = collective("reduce-scatter 2", pod.reduce_scatter, partial)
        out = chips("layer norm 2", _norm, [(m.reshape(per, -1), "x1", None, "ln2")
                                            for m in mine])
        self.last_phases, self.last_cycles = phases, sum(phases.values())
        return np.concatenate([out[(c - 1) % n] for c in range(n)])


def _shard(w, heads, ffn, first):
    """Chip's slices of the layer's weights (host arrays): columns `heads` of
    Wq/Wk/Wv and rows of Wo, columns `ffn` of W1 and rows of W2; the output
    biases only on the `first` chip."""
    (h0, h1), (f0, f1) = heads, ffn
    return dict(
        wq=w.wq[:, h0:h1], bq=w.bq[h0:h1], wk=w.wk[:, h0:h1], bk=w.bk[h0:h1],
        wv=w.wv[:, h0:h1], bv=w.bv[h0:h1], wo=w.wo[h0:h1], bo=w.bo if first else None,
        w1=w.w1[:, f0:f1], b1=w.b1[f0:f1], w2=w.w2[f0:f1], b2=w.b2 if first else None,
        ln1=(w.ln1_gamma, w.ln1_beta), ln2=(w.ln2_gamma, w.ln2_beta))


class _ChipShard:
    """What a chip holds of the layer between phases (on its actor)."""

    def __init__(self, chip, shard, config):
        self.config = config
        self.q = Linear(chip, shard["wq"], shard["bq"])
        self.k = Linear(chip, shard["wk"], shard["bk"])
        self.v = Linear(chip, shard["wv"], shard["bv"])
        self.o = Linear(chip, shard["wo"], shard["bo"])
        self.up = Linear(chip, shard["w1"], shard["b1"])
        self.down = Linear(chip, shard["w2"], shard["b2"])
        self.ln1 = layer_norm_params(chip, *shard["ln1"])
        self.ln2 = layer_norm_params(chip, *shard["ln2"])
        self.width = shard["wq"].shape[1]
        self.x = self.x1 = None


def _load_shard(actor, shard, config):
    actor.tensor_parallel = _ChipShard(actor.chip, shard, config)


def _keep(state, name, tensor):
    old = getattr(state, name)
    if old is not None and not old.freed:
        old.free()
    setattr(state, name, tensor)


def _attention_partial(actor, x, mask, mine):
    """Phase 1 on one chip: (its partial sum of the attention output, cycles).
    Keeps its rows `mine` of x, the residual of its LayerNorm."""
    chip, s = actor.chip, actor.tensor_parallel
    cfg = s.config
    B, L = mask.shape
    d, width, R = cfg.head_dim, s.width, B * L
    local = width // d
    _keep(s, "x", chip.upload(x[mine]))
    xb, bias = chip.upload(x, dtype=bfloat16), softmax_bias(chip, mask)
    temps = [chip.empty(shape, bfloat16, transient=True)
             for shape in ((R, width), (width, R), (R, width), (B * local * L, L), (R, width))]
    q, kt, v, probs, context = temps
    partial = chip.empty((R, cfg.hidden))
    try:
        with chip.record() as rec:
            s.q(xb, out=q)
            # K^T scaled by 1/sqrt(d) before its bf16 rounding, as one chip's layer does.
            s.k(xb, out=kt, then="transpose", scale=1 / math.sqrt(d))
            s.v(xb, out=v)
            free = L % chip.config.cols == 0
            attention(chip, sequence_heads(
                q, kt, v, context, probs, B, L, d,
                lambda b: dict(bias=None if free and mask[b].all() else bias[b:b + 1])))
            s.o(context, out=partial)
        return partial.numpy(), rec.stats.cycles
    finally:
        for t in temps + [xb, bias, partial]:
            t.free()


def _norm(actor, summed, residual, keep, params):
    """Phases 3 and 7 on one chip: LayerNorm(residual + summed) of its rows;
    (the rows, cycles). The result is kept as `keep` (x1, the next residual)."""
    chip, s = actor.chip, actor.tensor_parallel
    y = chip.upload(summed)
    out = chip.empty(summed.shape)
    try:
        with chip.record() as rec:
            chip.vector("add_layer_norm", y, out=out, other=getattr(s, residual),
                        params=getattr(s, params), eps=s.config.eps)
        result = out.numpy()
        if keep:
            _keep(s, keep, out)
        return result, rec.stats.cycles
    finally:
        y.free()
        if not keep:
            out.free()


def _ffn_partial(actor, x1):
    """Phase 5 on one chip: (its partial sum of the FFN output, cycles)."""
    chip, s = actor.chip, actor.tensor_parallel
    R, H = x1.shape
    x1b = chip.upload(x1, dtype=bfloat16)
    hidden = chip.empty((R, s.up.weight.shape[1]), bfloat16, transient=True)
    partial = chip.empty((R, H))
    try:
        with chip.record() as rec:
            s.up(x1b, out=hidden, then="gelu")
            s.down(hidden, out=partial)
        return partial.numpy(), rec.stats.cycles
    finally:
        for t in (x1b, hidden, partial):
            t.free()
