"""The NumPy golden model: docs/numerics.md stated as code.

Every function works on bit patterns (uint16 for bf16, uint32 for fp32) or on
NumPy float arrays, computes in NumPy float32 in the documented order, and turns
every NaN into the canonical quiet NaN, as the hardware does.
"""

import numpy as np

from mxu.hdl.dtypes import as_bf16, bfloat16 as bf16

__all__ = [
    "FP32_QNAN", "BF16_QNAN", "bf16", "as_bf16", "bf16_to_f32", "f32_bits", "f32_from_bits",
    "canonical", "mul", "add", "mac", "fp32_to_bf16", "dot", "matmul", "assert_bits_equal",
    "ring_reduce", "ring_reduce_arrays",
]

FP32_QNAN = np.uint32(0x7FC00000)
BF16_QNAN = np.uint16(0x7FC0)


def _u16(bits, name):
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"{name} must hold bf16 bit patterns as uint16, not {bits.dtype}")
    return bits


def _u32(bits, name):
    bits = np.asarray(bits)
    if bits.dtype != np.uint32:
        raise TypeError(f"{name} must hold fp32 bit patterns as uint32, not {bits.dtype}")
    return bits


def bf16_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 values (exact)."""
    return (_u16(bits, "bits").astype(np.uint32) << 16).view(np.float32)


def f32_from_bits(bits):
    return _u32(bits, "bits").view(np.float32)


def f32_bits(values):
    """float32 values -> uint32 bit patterns, NaN made canonical."""
    return canonical(np.asarray(values, dtype=np.float32).view(np.uint32))


def canonical(bits):
    """Replace every fp32 NaN bit pattern by ``0x7FC00000``."""
    bits = _u32(bits, "bits")
    nan = (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    return np.where(nan, FP32_QNAN, bits).astype(np.uint32)


def mul(a, w):
    """bf16 x bf16 -> fp32 bits."""
    with np.errstate(all="ignore"):
        return f32_bits(bf16_to_f32(a) * bf16_to_f32(w))


def add(x, y):
    """fp32 + fp32 -> fp32 bits."""
    with np.errstate(all="ignore"):
        return f32_bits(f32_from_bits(x) + f32_from_bits(y))


def ring_reduce(xs, bidirectional=False):
    """The golden pod form of a ring reduction (docs/pod.md): `xs` (n, rows,
    cols) float32, one message per chip. The rows are cut into n chunks as
    evenly as possible, the longer first, and chunk ``c`` is summed in ring
    order from chip ``c``: ``((x[c] + x[c+1]) + x[c+2]) + ... + x[c-1]``
    (indices mod n), each sum an fp32 addition. `bidirectional`: the first
    ``ceil(rows / 2)`` rows so, the others chunked likewise and summed the
    other way round, ``((x[c] + x[c-1]) + x[c-2]) + ...``. Returns (rows,
    cols) float32."""
    xs = np.ascontiguousarray(xs, np.float32)
    rows = xs.shape[1]
    if not bidirectional:
        return _ring_sum(xs, 1)
    half = -(-rows // 2)
    return np.concatenate([_ring_sum(xs[:, :half], 1), _ring_sum(xs[:, half:], -1)])


def ring_reduce_arrays(parts, cols, bidirectional=False):
    """`ring_reduce` of equal-shaped float32 arrays, one per chip, each
    flattened into rows of `cols` (zero-padded) as a pod's collectives move
    them (`Pod.all_reduce`); returns the sum in the arrays' shape."""
    flat = [np.asarray(p, np.float32).ravel() for p in parts]
    size = flat[0].size
    rows = max(1, -(-size // cols))
    message = np.zeros((len(flat), rows * cols), np.float32)
    for i, f in enumerate(flat):
        message[i, :size] = f
    total = ring_reduce(message.reshape(len(flat), rows, cols), bidirectional)
    return total.ravel()[:size].reshape(np.shape(parts[0]))


def _ring_sum(xs, sign):
    n, rows = xs.shape[:2]
    q, r = divmod(rows, n)
    out = np.empty(xs.shape[1:], np.uint32)
    lo = 0
    for c in range(n):
        hi = lo + q + (c < r)
        total = xs[c, lo:hi].view(np.uint32)
        for k in range(1, n):
            total = add(total, xs[(c + sign * k) % n, lo:hi].view(np.uint32))
        out[lo:hi] = total
        lo = hi
    return out.view(np.float32)


def mac(a, w, acc):
    """``acc + a*w`` on bit patterns: a, w uint16 (bf16), acc uint32 (fp32)."""
    a, w, acc = _u16(a, "a"), _u16(w, "w"), _u32(acc, "acc")
    with np.errstate(all="ignore"):
        product = bf16_to_f32(a) * bf16_to_f32(w)
        return f32_bits(acc.view(np.float32) + product)


def fp32_to_bf16(x):
    """fp32 bits -> bf16 bits, round to nearest-even (ml_dtypes); NaN -> 0x7FC0 | sign."""
    x = _u32(x, "x")
    with np.errstate(all="ignore"):
        y = x.view(np.float32).astype(bf16).view(np.uint16)
    nan = (x & 0x7F800000 == 0x7F800000) & (x & 0x007FFFFF != 0)
    return np.where(nan, BF16_QNAN | ((x >> 16) & 0x8000).astype(np.uint16), y).astype(np.uint16)


def dot(a, w, seed=0.0):
    """Sequential fp32 dot product of two bf16 vectors, starting from `seed`."""
    a, w = as_bf16(a).astype(np.float32), as_bf16(w).astype(np.float32)
    acc = np.float32(seed)
    with np.errstate(all="ignore"):
        for ak, wk in zip(a, w):
            acc = np.float32(acc + np.float32(ak * wk))
    return f32_from_bits(f32_bits(acc)).reshape(())[()]


def matmul(A, B, seed=None, rows=1):
    """``seed + A @ B`` the way the array computes it (docs/numerics.md).

    A (M x K) and B (K x N) are rounded to bf16; C[i, j] starts at ``seed[i, j]``
    (fp32; zeros if None) and adds ``A[i, k] * B[k, j]`` for k = 0..K-1 in order,
    each product and each sum rounded to fp32. K is zero-padded to a multiple of
    `rows`; the padding adds ``+0`` products at the end, as the hardware does.
    Returns float32 with canonical NaNs.
    """
    A, B = as_bf16(A), as_bf16(B)
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"matmul needs 2-D operands, got {A.shape} and {B.shape}")
    (M, K), (K2, N) = A.shape, B.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {A.shape}, B is {B.shape}")
    if seed is None:
        C = np.zeros((M, N), np.float32)
    else:
        C = np.array(seed, dtype=np.float32, copy=True)
        if C.shape != (M, N):
            raise ValueError(f"seed must be {(M, N)}, not {C.shape}")
    Af, Bf = A.astype(np.float32), B.astype(np.float32)
    padded = -(-K // rows) * rows if K else rows
    with np.errstate(all="ignore"):
        for k in range(K):
            C = C + Af[:, k:k + 1] * Bf[k:k + 1, :]
        if padded > K:
            C = C + np.float32(0.0)   # a +0 product: only changes -0 to +0
    return f32_from_bits(f32_bits(C))


def assert_bits_equal(actual, expected, what="result", inputs=None, seed=None):
    """Bit-exact comparison; NaN must be the canonical NaN on both sides. On failure
    the message names the first mismatches, their inputs and the random seed."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    if actual.dtype == np.float32:
        actual = actual.view(np.uint32)
    if expected.dtype == np.float32:
        expected = expected.view(np.uint32)
    bad = np.flatnonzero(actual.ravel() != expected.ravel())
    if bad.size:
        lines = [f"{what}: {bad.size} of {actual.size} differ (seed={seed})"]
        for i in bad[:8]:
            extra = ""
            if inputs:
                extra = " inputs " + ", ".join(
                    f"{k}=0x{int(np.asarray(v).ravel()[i]):x}" for k, v in inputs.items())
            lines.append(f"  [{i}] got 0x{int(actual.ravel()[i]):08x} "
                         f"want 0x{int(expected.ravel()[i]):08x}{extra}")
        raise AssertionError("\n".join(lines))
