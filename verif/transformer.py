"""The golden transformer and the float32 reference (docs/transformer.md).

`golden_forward` is the same encoder forward as `mxu.sim.models.encoder`, written
again in plain NumPy: every matmul is `golden.matmul` (the chip's numerics), every
bf16 rounding is where the chip rounds, and the host operations are the very
same functions (`mxu.hdl.hostops`). A forward on the chip must equal it
bit for bit.

`reference_forward` is the accuracy reference: the same model with float32
matmuls and no bf16 rounding, one sequence at a time, no padding.

``vector_ops="vpu"`` replaces the host operations by their vector-unit form
(`mxu.verif.vpu`: the same functions built from the VPU's primitives,
docs/vpu.md), the forward the chip computes once the layer runs on its VPU.
"""

import functools
import math
import types

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.dtypes import bfloat16

from . import golden, vpu

# The layer operations (softmax, layer_norm, gelu, scale, add) by backend.
VECTOR_OPS = {"host": hostops, "vpu": vpu}


def _vector_ops(name, lanes=1):
    """The layer operations of backend `name`; for "vpu" with the row reductions
    in the order of a chip with `lanes` columns (`mxu.verif.vpu`)."""
    try:
        ops = VECTOR_OPS[name]
    except KeyError:
        raise ValueError(f"vector_ops must be one of {sorted(VECTOR_OPS)}, not {name!r}") from None
    if name != "vpu" or lanes == 1:
        return ops
    return types.SimpleNamespace(
        softmax=functools.partial(vpu.softmax, lanes=lanes),
        layer_norm=functools.partial(vpu.layer_norm, lanes=lanes),
        gelu=vpu.gelu, scale=vpu.scale, add=vpu.add)

__all__ = ["golden_forward", "reference_forward", "embeddings", "golden_tensor_parallel_layer"]


def _bf16(x):
    """float32 -> bf16 as the chip stores a result (RNE, canonical NaN)."""
    bits = golden.fp32_to_bf16(golden.f32_bits(np.asarray(x, np.float32)))
    return bits.view(bfloat16)


def _linear(x, w, b, rows):
    """``x @ w + b`` as the chip computes it: bf16 operands, bias seed, fp32 out."""
    M = x.shape[0]
    seed = np.broadcast_to(np.asarray(b, np.float32), (M, w.shape[1]))
    return golden.matmul(golden.as_bf16(x), golden.as_bf16(w), seed=seed, rows=rows)


def embeddings(weights, ids, vector_ops="host", lanes=1, positions=None):
    w, cfg = weights, weights.config
    return _vector_ops(vector_ops, lanes).layer_norm(
        hostops.embed(ids, w.word, w.position, w.token_type, positions), w.emb_gamma, w.emb_beta,
        cfg.eps)


def _attention(w, cfg, x, mask, rows, ops, scale_k=False):
    """With `scale_k` (the VPU form) the 1/sqrt(d) scaling is applied to K in
    fp32, before its bf16 rounding, instead of to the scores (docs/vpu.md)."""
    B, L = mask.shape[:2]
    H, heads, d = cfg.hidden, cfg.heads, cfg.head_dim
    qkv32 = _linear(x, np.concatenate([w.wq, w.wk, w.wv], axis=1),
                    np.concatenate([w.bq, w.bk, w.bv]), rows)
    qkv = _bf16(qkv32)
    if scale_k:
        qkv[:, H:2 * H] = _bf16(ops.scale(qkv32[:, H:2 * H], 1 / math.sqrt(d)))
    scores = np.zeros((B, heads, L, L), np.float32)
    for b in range(B):
        for h in range(heads):
            q = qkv[b * L:(b + 1) * L, h * d:(h + 1) * d]
            k = qkv[b * L:(b + 1) * L, H + h * d:H + (h + 1) * d]
            scores[b, h] = golden.matmul(q, np.ascontiguousarray(k.T), rows=rows)
    if not scale_k:
        scores = ops.scale(scores, 1 / math.sqrt(d))
    p = golden.as_bf16(ops.softmax(scores, hostops.attention_mask(mask)))
    context = np.zeros((B * L, H), bfloat16)
    for b in range(B):
        for h in range(heads):
            v = qkv[b * L:(b + 1) * L, 2 * H + h * d:2 * H + (h + 1) * d]
            context[b * L:(b + 1) * L, h * d:(h + 1) * d] = _bf16(
                golden.matmul(p[b, h], v, rows=rows))
    return _linear(context, w.wo, w.bo, rows)


def golden_forward(weights, ids, mask, rows, vector_ops="host", lanes=1, positions=None):
    """Token vectors (B, L, hidden) of padded ids (B, L) with `mask` (a (B, L)
    key mask, or (B, L, L) per query for rows of packed texts, with their
    `positions`), computed as the chip does with a ``rows``-deep array; with
    ``vector_ops="vpu"`` and ``lanes=cols``, as a chip with the vector unit
    does (``Encoder(..., vector_ops="chip")``)."""
    ops = _vector_ops(vector_ops, lanes)
    cfg = weights.config
    B, L = ids.shape
    x = embeddings(weights, ids, vector_ops, lanes, positions).reshape(B * L, cfg.hidden)
    for w in weights.layers:
        x1 = ops.layer_norm(ops.add(x, _attention(w, cfg, x, mask, rows, ops,
                                                  scale_k=vector_ops == "vpu")),
                            w.ln1_gamma, w.ln1_beta, cfg.eps)
        hidden = ops.gelu(_linear(x1, w.w1, w.b1, rows))
        x = ops.layer_norm(ops.add(x1, _linear(hidden, w.w2, w.b2, rows)),
                           w.ln2_gamma, w.ln2_beta, cfg.eps)
    return x.reshape(B, L, cfg.hidden)


def reference_forward(weights, ids):
    """Token vectors (n, hidden) of one unpadded sequence, float32 throughout
    (the host operations)."""
    cfg = weights.config
    heads, d = cfg.heads, cfg.head_dim
    x = embeddings(weights, np.asarray(ids)[None])[0]
    mask = np.ones(len(ids), bool)
    for w in weights.layers:
        q, k, v = (x @ w.wq + w.bq, x @ w.wk + w.bk, x @ w.wv + w.bv)
        heads_out = []
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            s = hostops.scale(q[:, sl] @ k[:, sl].T, 1 / math.sqrt(d))
            heads_out.append(hostops.softmax(s, mask) @ v[:, sl])
        attended = np.concatenate(heads_out, axis=1) @ w.wo + w.bo
        x1 = hostops.layer_norm(hostops.add(x, attended), w.ln1_gamma, w.ln1_beta, cfg.eps)
        f = hostops.gelu(x1 @ w.w1 + w.b1) @ w.w2 + w.b2
        x = hostops.layer_norm(hostops.add(x1, f), w.ln2_gamma, w.ln2_beta, cfg.eps)
    return x.astype(np.float32)


def _attention_shard(w, cfg, x, mask, rows, ops, cols_slice, seed_bias):
    """One chip's heads (`cols_slice` of Q, K, V): its partial sum of the
    attention's output projection, seeded with Wo's bias when `seed_bias`."""
    B, L = mask.shape
    d = cfg.head_dim
    q = _bf16(_linear(x, w.wq[:, cols_slice], w.bq[cols_slice], rows))
    k = _bf16(ops.scale(_linear(x, w.wk[:, cols_slice], w.bk[cols_slice], rows), 1 / math.sqrt(d)))
    v = _bf16(_linear(x, w.wv[:, cols_slice], w.bv[cols_slice], rows))
    local = q.shape[1] // d
    scores = np.zeros((B, local, L, L), np.float32)
    for b in range(B):
        for h in range(local):
            rs, hs = slice(b * L, (b + 1) * L), slice(h * d, (h + 1) * d)
            scores[b, h] = golden.matmul(q[rs, hs], np.ascontiguousarray(k[rs, hs].T), rows=rows)
    p = golden.as_bf16(ops.softmax(scores, hostops.attention_mask(mask)))
    context = np.zeros((B * L, q.shape[1]), bfloat16)
    for b in range(B):
        for h in range(local):
            rs, hs = slice(b * L, (b + 1) * L), slice(h * d, (h + 1) * d)
            context[rs, hs] = _bf16(golden.matmul(p[b, h], v[rs, hs], rows=rows))
    seed = np.broadcast_to(w.bo, (B * L, cfg.hidden)) if seed_bias else None
    return golden.matmul(context, golden.as_bf16(w.wo[cols_slice]), seed=seed, rows=rows)


def golden_tensor_parallel_layer(w, cfg, x, mask, rows, cols, n):
    """The golden pod form of `mxu.sim.models.parallel.TensorParallelLayer`:
    encoder layer `w` on `n` chips with ``rows`` x ``cols`` arrays, heads and
    FFN columns split evenly, the partial sums of the attention's and the
    FFN's output projections added in ring order (`golden.ring_reduce`),
    the output biases in chip 0's partial, the layer ops in their VPU form.
    Returns the layer's output (tokens, hidden) float32."""
    ops = _vector_ops("vpu", cols)
    hs, fs = cfg.hidden // n, cfg.ffn // n
    attn = golden.ring_reduce_arrays([_attention_shard(w, cfg, x, mask, rows, ops, slice(c * hs, (c + 1) * hs),
                                       c == 0) for c in range(n)], cols)
    x1 = ops.layer_norm(ops.add(x, attn), w.ln1_gamma, w.ln1_beta, cfg.eps)
    parts = []
    for c in range(n):
        f = slice(c * fs, (c + 1) * fs)
        hidden = ops.gelu(_linear(x1, w.w1[:, f], w.b1[f], rows))
        seed = np.broadcast_to(w.b2, (x.shape[0], cfg.hidden)) if c == 0 else None
        parts.append(golden.matmul(golden.as_bf16(hidden), golden.as_bf16(w.w2[f]), seed=seed,
                                   rows=rows))
    return ops.layer_norm(ops.add(x1, golden.ring_reduce_arrays(parts, cols)), w.ln2_gamma, w.ln2_beta, cfg.eps)
