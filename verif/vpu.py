"""The golden model of the vector unit (docs/vpu.md): its primitives in NumPy
float32 and uint32 arithmetic, and its functions as the sequences of
`mxu.hdl.vecmath`, run on whole arrays of bit patterns.

>>> vpu_exp(np.array([0x3F800000], np.uint32))      # bits of float32 e**1
"""

import numpy as np

from mxu.hdl import vecmath

from .golden import canonical, f32_bits

__all__ = ["NumpyOps", "fadd", "fmul", "fmax", "fmin", "vpu_exp", "vpu_reciprocal", "vpu_rsqrt",
           "vpu_function", "vector_alu", "swap_pairs", "softmax", "layer_norm", "gelu", "scale",
           "add", "rms_norm", "head_rms_norm", "rope", "silu_mul", "gelu_tanh_mul", "rope_neox",
           "head_rms_norm_rope", "norm_add_rms_norm"]

_U32 = np.uint32


def _bits(a):
    a = np.asarray(a)
    if a.dtype != _U32:
        raise TypeError(f"operands must hold fp32 bit patterns as uint32, not {a.dtype}")
    return a


def _f(a):
    return _bits(a).view(np.float32)


def fadd(a, b):
    with np.errstate(all="ignore"):
        return f32_bits(_f(a) + _f(b))


def fmul(a, b):
    with np.errstate(all="ignore"):
        return f32_bits(_f(a) * _f(b))


def _order_key(a):
    """uint32 keys that order binary32 words like their values, with -0 < +0."""
    a = _bits(a)
    return np.where(a & 0x80000000, ~a, a | 0x80000000).astype(_U32)


def _is_nan(a):
    return (a & 0x7FFFFFFF) > 0x7F800000


def _min_max(a, b, larger):
    a, b = np.broadcast_arrays(_bits(a), _bits(b))
    pick_a = _order_key(a) >= _order_key(b) if larger else _order_key(a) <= _order_key(b)
    out = np.where(pick_a, a, b)
    return canonical(np.where(_is_nan(a) | _is_nan(b), _U32(vecmath.QNAN), out).astype(_U32))


def fmax(a, b):
    """fp32 maximum: a NaN operand gives the canonical NaN; -0 < +0."""
    return _min_max(a, b, larger=True)


def fmin(a, b):
    """fp32 minimum, likewise."""
    return _min_max(a, b, larger=False)


class NumpyOps:
    """The `mxu.hdl.vecmath` operation interface on uint32 arrays."""

    @staticmethod
    def const(bits):
        return _U32(bits & 0xFFFFFFFF)

    fadd, fmul, fmax, fmin = staticmethod(fadd), staticmethod(fmul), staticmethod(fmax), \
        staticmethod(fmin)
    fscale = staticmethod(fmul)     # a multiply by a power of two is a multiply

    @staticmethod
    def iadd(a, b):
        return (np.asarray(a, _U32) + np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def isub(a, b):
        return (np.asarray(a, _U32) - np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def band(a, b):
        return np.asarray(a, _U32) & np.asarray(b, _U32)

    @staticmethod
    def bor(a, b):
        return np.asarray(a, _U32) | np.asarray(b, _U32)

    @staticmethod
    def shl(a, k):
        return (np.asarray(a, _U32) << _U32(k)).astype(_U32)

    @staticmethod
    def shr(a, k):
        return (np.asarray(a, _U32) >> _U32(k)).astype(_U32)

    @staticmethod
    def sar(a, k):
        return (np.asarray(a, _U32).view(np.int32) >> k).view(_U32)

    @staticmethod
    def shlv(a, b):
        b = np.asarray(b, _U32)
        if np.any(b > 31):
            raise ValueError("shlv: shift beyond 31")
        return (np.asarray(a, _U32) << b).astype(_U32)

    @staticmethod
    def cut(a):
        return a

    @staticmethod
    def clz(a):
        a = np.asarray(a, _U32)
        # float64 represents every uint32 exactly; frexp's exponent is bit_length.
        _, e = np.frexp(a.astype(np.float64))
        return (32 - np.where(a == 0, 0, e)).astype(_U32)

    @staticmethod
    def ieq(a, b):
        return (np.asarray(a, _U32) == np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def select(c, a, b):
        return np.where(np.asarray(c, _U32) != 0, a, b).astype(_U32)


def vpu_function(name, x):
    """`mxu.hdl.vecmath` function `name` ("exp", "reciprocal", "rsqrt") on uint32
    bit patterns `x`; returns uint32 bit patterns of the same shape."""
    x = _bits(x)
    out = vecmath.FUNCTIONS[name](NumpyOps, x)
    return np.broadcast_to(out, x.shape).astype(_U32)


def vector_alu(op, a, b):
    """The golden `VectorAlu`: rows ``op[i](a[i], b[i])`` of uint32 bit patterns.

    op : (n,) VpuOp values; a, b : (n, cols) uint32. RSUM and RMAX reduce row
    ``a[i]`` in `hostops.tree_sum` order (+0 / -inf padding) into every lane.
    """
    from mxu.hdl.vpu import VpuOp
    op, a, b = np.asarray(op), _bits(a), _bits(b)
    table = {
        VpuOp.ADD: fadd, VpuOp.SUB: lambda x, y: fadd(x, y ^ _U32(0x80000000)),
        VpuOp.MUL: fmul, VpuOp.MAX: fmax, VpuOp.MIN: fmin,
        VpuOp.EXP: lambda x, _: vpu_exp(x), VpuOp.RECIP: lambda x, _: vpu_reciprocal(x),
        VpuOp.RSQRT: lambda x, _: vpu_rsqrt(x), VpuOp.PASS: lambda x, _: x,
        VpuOp.RSUM: lambda x, _: np.broadcast_to(_sum_rows(x), x.shape),
        VpuOp.RMAX: lambda x, _: np.broadcast_to(_max_rows(x), x.shape),
    }
    out = np.zeros(a.shape, _U32)
    for code, fn in table.items():
        sel = op == code.value
        if np.any(sel):
            out[sel] = fn(a[sel], b[sel])
    return out


def swap_pairs(a):
    """VECTOR's ``swap`` on rows of uint32 words (the last axis): lanes (2i,
    2i+1) become (-a[2i+1], a[2i]) -- a sign flip of the bit pattern and a
    move, no rounding. The last axis must be even."""
    a = _bits(a)
    if a.shape[-1] % 2:
        raise ValueError(f"swap pairs lanes: the row must be even, not {a.shape[-1]} wide")
    out = np.empty_like(a)
    out[..., 0::2] = a[..., 1::2] ^ _U32(0x80000000)
    out[..., 1::2] = a[..., 0::2]
    return out


def vpu_exp(x):
    return vpu_function("exp", x)


def vpu_reciprocal(x):
    return vpu_function("reciprocal", x)


def vpu_rsqrt(x):
    return vpu_function("rsqrt", x)


# --- the layer operations in the VPU's primitives (docs/vpu.md, "Layer operations") --
#
# The same contract as `mxu.hdl.hostops` (same names, same arguments),
# but every step is one of the vector unit's operations: fp32 add, multiply and
# max, `exp`, `reciprocal` and `rsqrt` of `mxu.hdl.vecmath`, and row reductions
# in the `hostops.tree_sum` order. A forward with these functions is what the
# chip computes once the layer runs on its VPU.

_F32 = np.float32


def _b(x):
    return np.ascontiguousarray(np.asarray(x, _F32)).view(_U32)


def _v(bits):
    return np.asarray(bits, _U32).view(_F32)


def _pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def _flat_tree(x, combine, pad):
    """Pad the last axis with `pad` to a power of two, then combine the upper
    half onto the lower half until one element is left."""
    n = x.shape[-1]
    width = _pow2(n)
    if width != n:
        x = np.concatenate([x, np.full(x.shape[:-1] + (width - n,), pad, _U32)], axis=-1)
    while width > 1:
        width //= 2
        x = combine(x[..., :width], x[..., width:])
    return x


def _tree(x, combine, pad, lanes=1):
    """Reduce the last axis of uint32 words in the order of a chip with `lanes`
    columns (docs/vpu.md): the row cut into tiles of `lanes` elements (the
    last one padded with `pad`), the tiles padded with whole `pad` tiles to a
    power of two and combined upper half onto lower half until one tile is
    left, then that tile reduced as `_flat_tree` does. With ``lanes = 1`` (or
    a power of two) this is `hostops.tree_sum`'s order on the row padded to
    ``max(pow2(n), lanes)`` elements. The last axis is kept, size 1."""
    n = x.shape[-1]
    tiles = _pow2(-(-n // lanes))
    if tiles * lanes != n:
        x = np.concatenate([x, np.full(x.shape[:-1] + (tiles * lanes - n,), pad, _U32)], axis=-1)
    x = x.reshape(x.shape[:-1] + (tiles, lanes))
    while tiles > 1:
        tiles //= 2
        x = combine(x[..., :tiles, :], x[..., tiles:, :])
    return _flat_tree(x[..., 0, :], combine, pad)


def _sum_rows(x, lanes=1):
    return _tree(x, fadd, 0, lanes)


def _max_rows(x, lanes=1):
    return _tree(x, fmax, 0xFF800000, lanes)


def _word(value):
    """The fp32 bit pattern of `value` as a uint32 scalar."""
    return np.float32(value).view(_U32)


_NEG_INF, _FLT_MIN = 0xFF800000, 0x00800000


def softmax(scores, mask, lanes=1):
    """Softmax over the last axis, `mask` True where attending is allowed:
    ``x' = x + bias`` (bias 0 or -inf), ``m = max(tree_max(x'), -FLT_MAX)``,
    ``e = exp(x' - m)``, ``e * reciprocal(max(tree_sum(e), FLT_MIN))`` -- a row
    with no allowed position is all zeros. `lanes`: see `_tree`."""
    x = _b(scores)
    bias = np.where(np.broadcast_to(mask, x.shape), _U32(0), _U32(_NEG_INF))
    x = fadd(x, bias)
    m = fmax(_max_rows(x, lanes), _word(-np.finfo(np.float32).max))
    e = vpu_exp(fadd(x, fmul(m, _U32(0xBF800000))))
    total = fmax(_sum_rows(e, lanes), _U32(_FLT_MIN))
    return _v(fmul(e, vpu_reciprocal(total)))


def layer_norm(x, gamma, beta, eps, lanes=1):
    """LayerNorm over the last axis: ``d = x - tree_sum(x) * (1/n)``,
    ``var = tree_sum(d*d) * (1/n)``, ``((d * rsqrt(var + eps)) * gamma) + beta``.
    `lanes`: see `_tree`."""
    x = _b(x)
    inv_n = _word(1 / x.shape[-1])
    d = fadd(x, fmul(fmul(_sum_rows(x, lanes), inv_n), _U32(0xBF800000)))
    var = fmul(_sum_rows(fmul(d, d), lanes), inv_n)
    inv = vpu_rsqrt(fadd(var, _word(eps)))
    return _v(fadd(fmul(fmul(d, inv), _b(gamma)), _b(beta)))


_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu(x):
    """GELU, erf form, as ``relu(x) + |x| q`` where ``q = -(1 - erf(|x|/sqrt 2)) / 2``
    by Abramowitz & Stegun 7.1.26 in fp32: ``t = reciprocal(1 + |x| (p/sqrt 2))``,
    ``q = (t (b1 + t (b2 + t (b3 + t (b4 + t b5))))) * exp((x * -x) * 0.5)``
    with the coefficients ``b_i = -a_i / 2`` (the halving and the sign ride in
    them exactly, which saves a pass) and ``|x| = min(max(x, -x), 1e30)`` (the
    cap keeps ``|x| q`` from being ``inf * 0`` at +-inf: GELU(inf) = inf,
    GELU(-inf) = 0)."""
    x = _b(x)
    k = _word
    nx = fmul(x, k(-1.0))
    ax = fmin(fmax(x, nx), k(1e30))
    t = vpu_reciprocal(fadd(fmul(ax, k(_ERF_P / np.sqrt(2))), k(1.0)))
    poly = k(-0.5 * _ERF_A[4])
    for c in _ERF_A[3::-1]:
        poly = fadd(fmul(poly, t), k(-0.5 * c))
    q = fmul(fmul(poly, t), vpu_exp(fmul(fmul(x, nx), k(0.5))))
    relu = fmax(x, _U32(0))
    return _v(fadd(relu, fmul(ax, q)))


def scale(x, factor):
    """``x * float32(factor)`` (one VPU multiply; the same as the host's)."""
    return _v(fmul(_b(x), _word(factor)))


def add(x, y):
    """The residual add (one VPU add; the same as the host's)."""
    return _v(fadd(_b(x), _b(y)))


# --- the decoder's layer operations (docs/llm.md) ---------------------------------


def rms_norm(x, gamma, eps, lanes=1):
    """RMSNorm over the last axis: ``ss = tree_sum(x*x)``, ``inv = rsqrt(ss *
    fp32(1/n) + eps)``, ``(x * inv) * gamma``. `lanes`: see `_tree`."""
    x = _b(x)
    ms = fmul(_sum_rows(fmul(x, x), lanes), _word(1 / x.shape[-1]))
    inv = vpu_rsqrt(fadd(ms, _word(eps)))
    return _v(fmul(fmul(x, inv), _b(gamma)))


def head_rms_norm(x, gamma, eps, lanes=1):
    """QK-norm: `rms_norm` over each head of the last axis, the heads as wide
    as `gamma` (one head's weights, the same for every head)."""
    x = np.asarray(x, _F32)
    head = np.shape(gamma)[-1]
    heads = x.reshape(x.shape[:-1] + (x.shape[-1] // head, head))
    return rms_norm(heads, gamma, eps, lanes).reshape(x.shape)


def rope(x, cos, sin):
    """Rotary position embedding on adjacent pairs (2i, 2i+1) of the last axis
    (llama.cpp's "normal" rope): ``x * cos + swap(x) * sin`` with
    `swap_pairs`; `cos` and `sin` hold each pair's value twice and broadcast
    against `x` (one row per position)."""
    x = _b(x)
    return _v(fadd(fmul(x, _b(cos)), fmul(swap_pairs(x), _b(sin))))


def silu_mul(gate, up):
    """SwiGLU's ``silu(gate) * up`` with ``silu(g) = g * reciprocal(1 + exp(-g))``
    on ``g = max(gate, -FLT_MAX)`` (so that silu(-inf) is -0, not ``-inf * 0``):
    ``((g * reciprocal(exp(g * -1) + 1)) * up``."""
    g = fmax(_b(gate), _word(-np.finfo(np.float32).max))
    r = vpu_reciprocal(fadd(vpu_exp(fmul(g, _U32(0xBF800000))), _word(1.0)))
    return _v(fmul(fmul(g, r), _b(up)))


def gelu_tanh_mul(gate, up):
    """GeGLU's ``gelu(gate) * up`` with the tanh form of GELU, ``0.5 g (1 +
    tanh(u))`` with ``u = sqrt(2/pi) (g + 0.044715 g^3)``, written as ``g *
    sigmoid(2u)``: on ``g = max(gate, -FLT_MAX)`` (tanh-GELU(-inf) is -0, not
    ``-inf * 0``), ``w = exp(((g * g) * K3 + K1) * g)``, ``(g *
    reciprocal(w + 1)) * up`` with ``K1 = fp32(-2 sqrt(2/pi))`` and ``K3 =
    fp32(-2 sqrt(2/pi) * 0.044715)``."""
    k1 = _word(-2 * np.sqrt(2 / np.pi))
    k3 = _word(-2 * np.sqrt(2 / np.pi) * 0.044715)
    g = fmax(_b(gate), _word(-np.finfo(np.float32).max))
    w = vpu_exp(fmul(fadd(fmul(fmul(g, g), k3), k1), g))
    return _v(fmul(fmul(g, vpu_reciprocal(fadd(w, _word(1.0)))), _b(up)))


def _heads(x, width):
    """x (..., n) as (..., n // width, width)."""
    return x.reshape(x.shape[:-1] + (x.shape[-1] // width, width))


def rope_neox(x, cos, sin):
    """RoPE of the NEOX type on each head of the last axis, the heads as wide
    as `cos` and `sin` (one row per position, broadcast against x): dims i
    and i + d/2 turn together. As the chip does it, ``x * cos + partner(x) *
    sin'`` where partner(x) swaps each head's halves (a move) and sin' is
    `sin` with the first half's sign flipped -- the same bits as ``(-x2) *
    sin``."""
    x, d = _b(x), np.shape(cos)[-1]
    sign = np.concatenate([np.full(d // 2, 0x80000000, _U32), np.zeros(d - d // 2, _U32)])
    h = _heads(x, d)
    partner = np.concatenate([h[..., d // 2:], h[..., :d // 2]], axis=-1)
    cos, sin = _b(cos)[..., None, :], (_b(sin) ^ sign)[..., None, :]
    return _v(fadd(fmul(h, cos), fmul(partner, sin))).reshape(x.shape)


def head_rms_norm_rope(x, gamma, eps, cos, sin, lanes=1):
    """Gemma 3's QK-norm then NEOX RoPE: `rope_neox` of `head_rms_norm`."""
    return rope_neox(head_rms_norm(x, gamma, eps, lanes), cos, sin)


def norm_add_rms_norm(x, residual, gamma0, gamma1, eps, lanes=1):
    """A post-norm block's end: ``c = rms_norm(x, gamma0) + residual`` and
    ``rms_norm(c, gamma1)`` (c, its norm)."""
    c = add(rms_norm(x, gamma0, eps, lanes), residual)
    return c, rms_norm(c, gamma1, eps, lanes)
