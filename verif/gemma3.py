"""The golden transformer's Gemma 3 form, and its float32 reference (docs/llm.md).

`GoldenGemma3` is the forward `mxu.sim.models.gemma3.ChipGemma3` runs on the
chip, written again in NumPy the way `GoldenLlama` writes the Llama one
(whose KV cache per sequence and matmuls it shares): every matmul is
`golden.matmul`, every bf16 rounding where the chip rounds, every layer op
its vector-unit form (`mxu.verif.vpu`), with the row reductions of a chip
with `lanes` columns. It imports nothing of the runtime: the rotary tables
and NumPy forms come from the neutral `mxu.hdl.hostops`, the weights are any
object with the fields of the Gemma 3 weights.

The sliding window as the chip computes it: a prefill's scores cover every
key of the sequence, those more than a window back masked; a decode step on
a local layer reads at most the window's keys from its ring, slot = position
mod window: its scores and softmax in ring order (the same bits as a
prefill's row: with a window a power of two, the softmax's tree folds the
masked row onto exactly that order), and P.V in position order, as two
matmuls, the newer keys' seeded with the older keys' sums (the same
sequential sums as a prefill's, whose masked keys add +0).

`reference_logits` is the accuracy reference: the same graph in float32
throughout (the host forms, llama.cpp's order: q scaled before the scores).
"""

import math

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.dtypes import bfloat16

from . import golden, vpu
from .llama import GoldenLlama, _bf16

__all__ = ["GoldenGemma3", "reference_logits"]


class GoldenGemma3(GoldenLlama):
    """The chip's Gemma 3 forward with a KV cache per sequence.

    Parameters
    ----------
    weights : Gemma 3 weights (`mxu.sim.models.gemma3.Gemma3Weights` or the like)
    rows, lanes : int
        The array's rows (K padding of every matmul) and columns (the row
        reductions' order).
    """

    def __init__(self, weights, rows, lanes):
        self.weights, self.config = weights, weights.config
        self.rows, self.lanes = rows, lanes
        self._qkv = [np.concatenate([w.wq, w.wk, w.wv], axis=1) for w in weights.layers]
        self._unembed_t = np.ascontiguousarray(weights.unembed.T)
        self.caches, self.lengths = {}, {}

    def _tables(self, positions):
        """{RoPE base: (cos, sin)} of NEOX form at the rows' positions."""
        c = self.config
        return {base: hostops.rope_tables(c.head_dim, base, positions, neox=True)
                for base in {c.rope_base(i) for i in range(c.layers)}}

    def _embed(self, ids):
        """The embeddings times fp32 sqrt(hidden)."""
        x = self.weights.embed[ids].astype(np.float32)
        return vpu.scale(x, np.float32(math.sqrt(self.config.hidden)))

    def _layer(self, i, lw, x, xn, batch, starts, tables):
        c, w = self.config, self.weights
        Q, KV = c.q_dim, c.kv_dim
        cos, sin = tables[c.rope_base(i)]
        qkv = self._matmul(xn, self._qkv[i])
        qk = lambda r, g: _bf16(vpu.head_rms_norm_rope(r, g, c.eps, cos, sin, self.lanes))
        q, k = qk(qkv[:, :Q], lw.q_norm), qk(qkv[:, Q:Q + KV], lw.k_norm)
        v = _bf16(qkv[:, Q + KV:])
        ctx = self._attend(i, q, k, v, batch, starts)
        x, xn2 = vpu.norm_add_rms_norm(self._matmul(ctx, lw.wo), x, lw.post_attn_norm,
                                       lw.ffn_norm, c.eps, self.lanes)
        gu = self._matmul(_bf16(xn2), np.concatenate([lw.w_gate, lw.w_up], axis=1))
        h = _bf16(vpu.gelu_tanh_mul(gu[:, :c.ffn], gu[:, c.ffn:]))
        nxt = w.layers[i + 1].attn_norm if i + 1 < c.layers else w.final_norm
        x, xn = vpu.norm_add_rms_norm(self._matmul(h, lw.w_down), x, lw.post_ffw_norm, nxt,
                                      c.eps, self.lanes)
        return x, (_bf16(xn) if i + 1 < c.layers else None)

    def _attention(self, i, q, K, V, start):
        """The attention of n new rows at positions start.. over the L keys of
        the sequence (position order): layer i's window, if it has one, as
        the chip computes it (see the module docstring)."""
        c = self.config
        n, L, d = len(q), len(K), c.head_dim
        window = c.layer_windows[i]
        ring = 0
        if n == 1 and window is not None and L > window:
            # The ring: slot p % window holds position p, the oldest at slot L % window.
            order = np.arange(L - window, L)
            slots = np.argsort(order % window)
            K, V, ring = K[order[slots]], V[order[slots]], L % window
            mask = np.ones((1, window), bool)
        else:
            keys, query = np.arange(L)[None, :], start + np.arange(n)[:, None]
            mask = (keys <= query) & (query - keys < (window or L))
        out = np.zeros((n, c.q_dim), bfloat16)
        for h in range(c.heads):
            g = h // c.group
            kt = np.ascontiguousarray(K[:, g * d:(g + 1) * d].T)
            s = vpu.scale(self._matmul(q[:, h * d:(h + 1) * d], kt), 1 / math.sqrt(d))
            p = _bf16(vpu.softmax(s, mask, self.lanes))
            vh = V[:, g * d:(g + 1) * d]
            if ring:
                older = self._matmul(p[:, ring:], vh[ring:])
                r = golden.matmul(p[:, :ring], vh[:ring], seed=older, rows=self.rows)
            else:
                r = self._matmul(p, vh)
            out[:, h * d:(h + 1) * d] = _bf16(r)
        return out


def reference_logits(weights, ids):
    """Next-token logits (n, vocab) of every position of one sequence, float32
    throughout, in llama.cpp's order (the accuracy reference)."""
    c, w = weights.config, weights
    ids = np.asarray(ids, np.int64)
    n, d = len(ids), c.head_dim
    keys, query = np.arange(n)[None, :], np.arange(n)[:, None]
    x = hostops.scale(w.embed[ids], np.float32(math.sqrt(c.hidden)))
    for i, lw in enumerate(w.layers):
        window = c.layer_windows[i]
        mask = (keys <= query) & (query - keys < (window or n))
        cos, sin = hostops.rope_tables(d, c.rope_base(i), np.arange(n), neox=True)
        xn = hostops.rms_norm(x, lw.attn_norm, c.eps)
        q = hostops.head_rms_norm_rope(xn @ lw.wq, lw.q_norm, c.eps, cos, sin)
        k = hostops.head_rms_norm_rope(xn @ lw.wk, lw.k_norm, c.eps, cos, sin)
        q, v = hostops.scale(q, 1 / math.sqrt(d)), xn @ lw.wv
        heads = []
        for h in range(c.heads):
            g = h // c.group
            s = q[:, h * d:(h + 1) * d] @ k[:, g * d:(g + 1) * d].T
            heads.append(hostops.softmax(s, mask) @ v[:, g * d:(g + 1) * d])
        attn = np.concatenate(heads, axis=1) @ lw.wo
        x = hostops.add(x, hostops.rms_norm(attn, lw.post_attn_norm, c.eps))
        xn = hostops.rms_norm(x, lw.ffn_norm, c.eps)
        ffn = hostops.gelu_tanh_mul(xn @ lw.w_gate, xn @ lw.w_up) @ lw.w_down
        x = hostops.add(x, hostops.rms_norm(ffn, lw.post_ffw_norm, c.eps))
    return (hostops.rms_norm(x, w.final_norm, c.eps) @ w.unembed.T).astype(np.float32)
