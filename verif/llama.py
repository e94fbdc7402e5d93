"""The golden transformer's Llama form, and the float32 reference (docs/llm.md).

`GoldenLlama` is the decoder forward `mxu.sim.models.CausalLM` runs on the
chip, written again in plain NumPy: every matmul is `golden.matmul` (the
chip's numerics, bf16 operands, sequential fp32 sums over K padded to the
array's rows), every bf16 rounding is where the chip rounds, every layer op
is its vector-unit form (`mxu.verif.vpu`: RMSNorm, RoPE, the masked softmax,
SiLU(gate) * up, the residual add) with the row reductions of a chip with
`lanes` columns. It keeps a KV cache per sequence, as the chip does, so a
prefill, a decode step and a batch of sequences of different lengths are
each computed exactly as the chip computes them; the chip's logits must equal
its logits bit for bit.

`reference_logits` is the accuracy reference: the same model in float32
throughout (float32 weights as dequantized, no bf16 rounding, NumPy matmuls,
the host forms of `mxu.hdl.hostops`), one whole sequence, causal.
"""

import math

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.dtypes import bfloat16

from . import golden, vpu

__all__ = ["GoldenLlama", "reference_logits"]


def _bf16(x):
    """float32 -> bf16 as the chip stores a result (RNE, canonical NaN)."""
    return golden.fp32_to_bf16(golden.f32_bits(np.asarray(x, np.float32))).view(bfloat16)


def rope_fold(w, heads, head_dim):
    """``W @ R`` for a (in, heads * head_dim) projection: column 2i of each head
    becomes minus column 2i+1 and column 2i+1 becomes column 2i, so that
    ``x @ (W @ R)`` is the pair-swapped, sign-flipped ``x @ W`` (RoPE folded
    into the projection, docs/llm.md)."""
    w = np.asarray(w, np.float32).reshape(w.shape[0], heads, head_dim)
    out = np.empty_like(w)
    out[..., 0::2] = -w[..., 1::2]
    out[..., 1::2] = w[..., 0::2]
    return out.reshape(w.shape[0], heads * head_dim)


class GoldenLlama:
    """The chip's Llama forward with a KV cache per sequence.

    Parameters
    ----------
    weights : mxu.sim.models.llama.LlamaWeights
    rows, lanes : int
        The array's rows (K padding of every matmul) and columns (the row
        reductions' order, `mxu.verif.vpu`).
    rope : "swap" or "fold"
        How the chip turns pairs: the vector unit's lane swap (even columns),
        or the pair-swapped copy from a matmul with `rope_fold` weights.
    """

    def __init__(self, weights, rows, lanes, rope="swap"):
        if rope not in ("swap", "fold"):
            raise ValueError(f"rope must be 'swap' or 'fold', not {rope!r}")
        self.weights, self.config = weights, weights.config
        self.rows, self.lanes, self.rope_mode = rows, lanes, rope
        c = self.config
        self._qkv = [np.concatenate([w.wq, w.wk, w.wv], axis=1) for w in weights.layers]
        if rope == "fold":
            self._fold = [np.concatenate([rope_fold(w.wq, c.heads, c.head_dim),
                                          rope_fold(w.wk, c.kv_heads, c.head_dim)], axis=1)
                          for w in weights.layers]
        self._unembed_t = np.ascontiguousarray(weights.unembed.T)
        self.caches, self.lengths = {}, {}

    def _matmul(self, a, b):
        return golden.matmul(a, b, rows=self.rows)

    def _norm(self, x, gamma):
        return vpu.rms_norm(x, gamma, self.config.eps, self.lanes)

    def _rope(self, x32, x32_swapped, cos, sin, heads):
        """RoPE on (rows, heads * head_dim) fp32, every head with the rows' tables."""
        cos, sin = np.tile(cos, (1, heads)), np.tile(sin, (1, heads))
        if self.rope_mode == "swap":
            return vpu.rope(x32, cos, sin)
        b = lambda v: golden.f32_bits(np.asarray(v, np.float32))
        return golden.f32_from_bits(vpu.fadd(vpu.fmul(b(x32), b(cos)),
                                             vpu.fmul(b(x32_swapped), b(sin))))

    def forward(self, batch, logits="last"):
        """Run new tokens of several sequences: `batch` is a list of (sequence
        key, token ids); a key seen before continues that sequence from its
        cache. Returns one float32 array per entry: the logits of its last
        new token (vocab,), or of every new token (n, vocab) with
        ``logits="all"``."""
        c, w = self.config, self.weights
        ids = np.concatenate([np.asarray(t, np.int64) for _, t in batch])
        keys = [key for key, _ in batch]
        if len(set(keys)) != len(keys):
            raise ValueError("a sequence appears twice in one batch")
        starts = [self.lengths.get(key, 0) for key in keys]
        positions = np.concatenate([s + np.arange(len(t)) for s, (_, t) in zip(starts, batch)])
        tables = self._tables(positions)
        x = self._embed(ids)
        xn = _bf16(self._norm(x, w.layers[0].attn_norm))
        for i, lw in enumerate(w.layers):
            x, xn = self._layer(i, lw, x, xn, batch, starts, tables)
        for key, tokens in batch:
            self.lengths[key] = self.lengths.get(key, 0) + len(tokens)
        final = _bf16(self._norm(x, w.final_norm))
        ends = np.cumsum([len(t) for _, t in batch])
        if logits == "last":
            return list(self._matmul(final[ends - 1], self._unembed_t))
        out = self._matmul(final, self._unembed_t)
        return np.split(out, ends[:-1])

    def _tables(self, positions):
        """The rotary tables of the rows' positions."""
        return hostops.rope_tables(self.config.head_dim, self.config.rope_theta, positions)

    def _embed(self, ids):
        return self.weights.embed[ids].astype(np.float32)

    def _layer(self, i, lw, x, xn, batch, starts, tables):
        c = self.config
        cos, sin = tables
        H, KV = c.hidden, c.kv_dim
        qkv = self._matmul(xn, self._qkv[i])
        swapped = self._matmul(xn, self._fold[i]) if self.rope_mode == "fold" else None
        q = _bf16(self._rope(qkv[:, :H], swapped[:, :H] if swapped is not None else None,
                             cos, sin, c.heads))
        k = _bf16(self._rope(qkv[:, H:H + KV], swapped[:, H:] if swapped is not None else None,
                             cos, sin, c.kv_heads))
        v = _bf16(qkv[:, H + KV:])
        ctx = self._attend(i, q, k, v, batch, starts)
        x = vpu.add(x, self._matmul(ctx, lw.wo))
        xn2 = _bf16(self._norm(x, lw.ffn_norm))
        gu = self._matmul(xn2, np.concatenate([lw.w_gate, lw.w_up], axis=1))
        h = _bf16(vpu.silu_mul(gu[:, :c.ffn], gu[:, c.ffn:]))
        x = vpu.add(x, self._matmul(h, lw.w_down))
        nxt = self.weights.layers[i + 1].attn_norm if i + 1 < c.layers else None
        return x, (_bf16(self._norm(x, nxt)) if nxt is not None else None)

    def _attend(self, i, q, k, v, batch, starts):
        """The attention of each sequence's new rows (bf16 q, k, v of the
        batch) over its layer-i cache, which the new k and v join."""
        c = self.config
        ctx = np.zeros((len(q), c.q_dim), bfloat16)
        row = 0
        for (key, tokens), start in zip(batch, starts):
            n = len(tokens)
            cache = self.caches.setdefault(key, [None] * c.layers)
            old_k, old_v = cache[i] if cache[i] is not None else (k[:0], v[:0])
            K, V = np.concatenate([old_k, k[row:row + n]]), np.concatenate([old_v, v[row:row + n]])
            cache[i] = (K, V)
            ctx[row:row + n] = self._attention(i, q[row:row + n], K, V, start)
            row += n
        return ctx

    def _attention(self, i, q, K, V, start):
        """Causal attention of n new rows at positions start.. over the L cached
        keys: each query head against its KV head's K^T and V (GQA)."""
        c = self.config
        n, L, d = len(q), len(K), c.head_dim
        mask = np.arange(L)[None, :] <= start + np.arange(n)[:, None]
        out = np.zeros((n, c.hidden), bfloat16)
        for h in range(c.heads):
            g = h // c.group
            qh = q[:, h * d:(h + 1) * d]
            kt = np.ascontiguousarray(K[:, g * d:(g + 1) * d].T)
            s = vpu.scale(self._matmul(qh, kt), 1 / math.sqrt(d))
            p = _bf16(vpu.softmax(s, mask, self.lanes))
            out[:, h * d:(h + 1) * d] = _bf16(self._matmul(p, V[:, g * d:(g + 1) * d]))
        return out


def reference_logits(weights, ids):
    """Next-token logits (n, vocab) of every position of one sequence, float32
    throughout (the accuracy reference)."""
    c, w = weights.config, weights
    ids = np.asarray(ids, np.int64)
    n, d = len(ids), c.head_dim
    cos, sin = hostops.rope_tables(c.head_dim, c.rope_theta, np.arange(n))
    mask = np.tril(np.ones((n, n), bool))
    x = w.embed[ids].astype(np.float32)
    for lw in w.layers:
        xn = hostops.rms_norm(x, lw.attn_norm, c.eps)
        q, k, v = xn @ lw.wq, xn @ lw.wk, xn @ lw.wv
        q = hostops.rope(q, np.tile(cos, (1, c.heads)), np.tile(sin, (1, c.heads)))
        k = hostops.rope(k, np.tile(cos, (1, c.kv_heads)), np.tile(sin, (1, c.kv_heads)))
        heads = []
        for h in range(c.heads):
            g = h // c.group
            s = hostops.scale(q[:, h * d:(h + 1) * d] @ k[:, g * d:(g + 1) * d].T, 1 / math.sqrt(d))
            heads.append(hostops.softmax(s, mask) @ v[:, g * d:(g + 1) * d])
        x = hostops.add(x, np.concatenate(heads, axis=1) @ lw.wo)
        xn = hostops.rms_norm(x, lw.ffn_norm, c.eps)
        x = hostops.add(x, hostops.silu_mul(xn @ lw.w_gate, xn @ lw.w_up) @ lw.w_down)
    return (hostops.rms_norm(x, w.final_norm, c.eps) @ w.unembed.T).astype(np.float32)
