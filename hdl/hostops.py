"""The layer operations' host form: one function each, each a fixed sequence
of NumPy float32 operations (docs/transformer.md), and the rotary tables.

This is arithmetic both sides state, as the number formats are: the runtime
(`mxu.sim`) runs these on the host between the chip's matmuls, and the golden
models (`mxu.verif`) call the same functions, so a whole forward on the chip
is bit-exact against them; neither side imports the other. Each function is
also the host form of the layer op of its name (`mxu.sim.compiler.layerops`,
whose chip form is `mxu.verif.vpu`'s function of the same name). Reductions
use `tree_sum`, a fixed pairwise tree over the last axis, so that the result
does not depend on how NumPy happens to sum; `np.exp` and `np.sqrt` are
NumPy's float32 functions.
"""

import numpy as np

__all__ = ["tree_sum", "softmax", "layer_norm", "gelu", "erf", "scale", "add", "embed",
           "mean_pool", "l2_normalize", "attention_mask", "rms_norm", "swap_pairs", "rope", "silu_mul",
           "gelu_tanh_mul", "head_rms_norm", "rope_tables", "rope_neox", "head_rms_norm_rope",
           "norm_add_rms_norm"]

F32 = np.float32


def tree_sum(x):
    """Sum over the last axis in a fixed order: pad with +0 to a power of two,
    then add the upper half onto the lower half until one element is left.
    Returns float32 with the last axis kept (size 1)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        pad = np.zeros(x.shape[:-1] + (width - n,), F32)
        x = np.concatenate([x, pad], axis=-1)
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x


def softmax(scores, mask):
    """Softmax over the last axis of float32 `scores`, where `mask` (bool,
    broadcastable) is True for the positions that may be attended to:
    ``m = max(x)``, ``e = exp(x - m)`` (masked positions 0), ``e / tree_sum(e)``.
    A row with no position allowed is all zeros."""
    x = np.asarray(scores, F32)
    mask = np.broadcast_to(mask, x.shape)
    m = np.max(np.where(mask, x, F32(-np.inf)), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, F32(0))
    with np.errstate(over="ignore", under="ignore"):
        e = np.where(mask, np.exp(x - m), F32(0)).astype(F32)
    s = tree_sum(e)
    return np.where(s > 0, e / np.where(s > 0, s, F32(1)), F32(0)).astype(F32)


def layer_norm(x, gamma, beta, eps):
    """LayerNorm over the last axis: ``d = x - tree_sum(x)/n``,
    ``var = tree_sum(d*d)/n``, ``((d * (1/sqrt(var + eps))) * gamma) + beta``."""
    x = np.asarray(x, F32)
    n = F32(x.shape[-1])
    d = x - tree_sum(x) / n
    var = tree_sum(d * d) / n
    inv = F32(1) / np.sqrt(var + F32(eps))
    return ((d * inv) * np.asarray(gamma, F32) + np.asarray(beta, F32)).astype(F32)


# Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 on the whole real line.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x):
    """The error function, Abramowitz & Stegun 7.1.26 evaluated in float64 and
    rounded to float32 (absolute error <= 1.5e-7)."""
    x64 = np.asarray(x, np.float64)
    t = 1.0 / (1.0 + _ERF_P * np.abs(x64))
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return (np.sign(x64) * (1.0 - poly * np.exp(-x64 * x64))).astype(F32)


def gelu(x):
    """GELU, erf form as BERT defines it: ``(0.5 * x) * (1 + erf(x * (1/sqrt 2)))``."""
    x = np.asarray(x, F32)
    return ((F32(0.5) * x) * (F32(1) + erf(x * F32(1 / np.sqrt(2))))).astype(F32)


def scale(x, factor):
    """``x * float32(factor)``."""
    return (np.asarray(x, F32) * F32(factor)).astype(F32)


def add(x, y):
    """The residual add, ``x + y`` in float32."""
    return (np.asarray(x, F32) + np.asarray(y, F32)).astype(F32)


def embed(ids, word, position, token_type, positions=None):
    """BERT's input embeddings of token ids (batch, seq): ``(word[id] +
    position[p]) + token_type[0]`` in float32 (before the embedding LayerNorm),
    ``p`` the token's index in its row, or `positions` (batch, seq) where rows
    hold several texts packed (each text counts from 0)."""
    ids = np.asarray(ids)
    pos = np.arange(ids.shape[-1]) if positions is None else np.asarray(positions)
    return ((word[ids] + position[pos]) + token_type[0]).astype(F32)


def attention_mask(mask):
    """A (batch, seq) key mask or a (batch, seq, seq) per-query mask, shaped
    to broadcast over scores (batch, heads, seq, seq)."""
    mask = np.asarray(mask, bool)
    return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]


def mean_pool(x, mask):
    """Mean of the token vectors x (batch, seq, hidden) over the real tokens
    (mask (batch, seq) True): ``tree_sum`` over tokens divided by their count."""
    x = np.where(np.asarray(mask)[..., None], np.asarray(x, F32), F32(0))
    total = tree_sum(np.swapaxes(x, -1, -2))[..., 0]
    count = np.maximum(np.asarray(mask).sum(axis=-1, keepdims=True), 1).astype(F32)
    return (total / count).astype(F32)


def l2_normalize(x, eps=1e-12):
    """``x / max(sqrt(tree_sum(x*x)), eps)`` over the last axis."""
    x = np.asarray(x, F32)
    norm = np.sqrt(tree_sum(x * x))
    return (x / np.maximum(norm, F32(eps))).astype(F32)


def rms_norm(x, gamma, eps):
    """RMSNorm over the last axis: ``(x * (1/sqrt(tree_sum(x*x)/n + eps))) * gamma``."""
    x = np.asarray(x, F32)
    ms = tree_sum(x * x) / F32(x.shape[-1])
    inv = F32(1) / np.sqrt(ms + F32(eps))
    return ((x * inv) * np.asarray(gamma, F32)).astype(F32)


def head_rms_norm(x, gamma, eps):
    """QK-norm: `rms_norm` over each head of the last axis, the heads as wide
    as `gamma` (one head's weights, the same for every head)."""
    x = np.asarray(x, F32)
    head = np.shape(gamma)[-1]
    heads = x.reshape(x.shape[:-1] + (x.shape[-1] // head, head))
    return rms_norm(heads, gamma, eps).reshape(x.shape)


def swap_pairs(x):
    """Adjacent pairs (2i, 2i+1) of the last axis as (-x[2i+1], x[2i])."""
    x = np.asarray(x, F32)
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def rope(x, cos, sin):
    """Rotary embedding of adjacent pairs: ``x * cos + swap_pairs(x) * sin``."""
    x = np.asarray(x, F32)
    return (x * np.asarray(cos, F32) + swap_pairs(x) * np.asarray(sin, F32)).astype(F32)


def rope_tables(head_dim, theta, positions, neox=False):
    """(cos, sin), each (len(positions), head_dim) float32, of the rotary
    embedding of llama.cpp's "normal" form: pair i = (2i, 2i+1) of a head turns
    by ``pos * theta**(-2i / head_dim)``; both lanes of a pair hold its value.
    With `neox`, its NEOX form: dims i and i + head_dim/2 turn by that angle,
    which both halves hold. The angles and their cosines are computed in
    float64 and rounded once."""
    d = head_dim
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    if neox:
        return tuple(np.tile(f(angles), (1, 2)).astype(np.float32) for f in (np.cos, np.sin))
    pairs = lambda f: np.repeat(f(angles), 2, axis=1).astype(np.float32)
    return pairs(np.cos), pairs(np.sin)


def rope_neox(x, cos, sin):
    """RoPE of the NEOX type on each head of the last axis (as wide as `cos`):
    ``x * cos + rotate_half(x) * sin``, rotate_half = (-x[d/2:], x[:d/2])."""
    x, d = np.asarray(x, F32), np.shape(cos)[-1]
    h = x.reshape(x.shape[:-1] + (x.shape[-1] // d, d))
    rot = np.concatenate([-h[..., d // 2:], h[..., :d // 2]], axis=-1)
    cos, sin = np.asarray(cos, F32)[..., None, :], np.asarray(sin, F32)[..., None, :]
    return (h * cos + rot * sin).astype(F32).reshape(x.shape)


def head_rms_norm_rope(x, gamma, eps, cos, sin):
    """QK-norm then NEOX RoPE: `rope_neox` of `head_rms_norm`."""
    return rope_neox(head_rms_norm(x, gamma, eps), cos, sin)


def norm_add_rms_norm(x, residual, gamma0, gamma1, eps):
    """A post-norm block's end: ``c = rms_norm(x, gamma0) + residual`` and
    ``rms_norm(c, gamma1)`` (c, its norm)."""
    c = add(rms_norm(x, gamma0, eps), residual)
    return c, rms_norm(c, gamma1, eps)


def silu_mul(gate, up):
    """SwiGLU: ``(gate / (1 + exp(-gate))) * up``."""
    g = np.asarray(gate, F32)
    with np.errstate(over="ignore"):
        return ((g / (F32(1) + np.exp(-g))) * np.asarray(up, F32)).astype(F32)


def gelu_tanh_mul(gate, up):
    """GeGLU with the tanh form of GELU: ``(0.5 * g * (1 + tanh(sqrt(2/pi) *
    (g + 0.044715 * g**3)))) * up``."""
    g = np.asarray(gate, F32)
    with np.errstate(over="ignore"):
        u = F32(np.sqrt(2 / np.pi)) * (g + F32(0.044715) * (g * g * g))
    return ((F32(0.5) * g * (F32(1) + np.tanh(u))) * np.asarray(up, F32)).astype(F32)
