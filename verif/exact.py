"""A second, independent IEEE-754 oracle: exact rational arithmetic (`fractions`)
with one explicit round-to-nearest-even step per operation.

It shares no code with NumPy's float32 path, so agreement between the two checks
the golden model itself (NumPy on this CPU: no flush-to-zero, no extended
precision). It is slow; use it on tens of thousands of vectors, not millions.
"""

import math
from fractions import Fraction

import numpy as np

__all__ = ["exact_mul_bf16", "exact_add_f32", "exact_mac", "exact_expand"]

_QNAN = 0x7FC00000
_INF = 0x7F800000
_MIN_QUANTUM = Fraction(1, 1 << 149)


def _decode(bits, frac_bits, bias):
    """(kind, sign, value) of a bit pattern: kind is 'nan', 'inf' or 'num'."""
    sign = bits >> (frac_bits + 8)
    exp = (bits >> frac_bits) & 0xFF
    frac = bits & ((1 << frac_bits) - 1)
    if exp == 0xFF:
        return ("nan" if frac else "inf"), sign, None
    if exp == 0:
        value = Fraction(frac) * Fraction(2) ** (1 - bias - frac_bits)
    else:
        value = Fraction(frac | (1 << frac_bits)) * Fraction(2) ** (exp - bias - frac_bits)
    return "num", sign, value


def _round(sign, magnitude):
    """Round a non-negative rational to fp32 bits (nearest-even), with the sign."""
    sign_bit = sign << 31
    if magnitude == 0:
        return sign_bit
    e = math.floor(math.log2(magnitude))
    while Fraction(2) ** e > magnitude:
        e -= 1
    while Fraction(2) ** (e + 1) <= magnitude:
        e += 1
    quantum = _MIN_QUANTUM if e < -126 else Fraction(2) ** (e - 23)
    scaled = magnitude / quantum
    n = math.floor(scaled)
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    value = n * quantum
    if value >= Fraction(2) ** 128:
        return sign_bit | _INF
    bits = int(np.float32(float(value)).view(np.uint32))   # exact: value is an fp32
    return sign_bit | bits


def _mul(ka, sa, va, kb, sb, vb):
    sign = sa ^ sb
    if "nan" in (ka, kb):
        return _QNAN
    if "inf" in (ka, kb):
        if va == 0 or vb == 0:
            return _QNAN
        return (sign << 31) | _INF
    return _round(sign, va * vb)


def _add(kx, sx, vx, ky, sy, vy):
    if "nan" in (kx, ky):
        return _QNAN
    if kx == "inf" and ky == "inf":
        return _QNAN if sx != sy else (sx << 31) | _INF
    if kx == "inf" or ky == "inf":
        return ((sx if kx == "inf" else sy) << 31) | _INF
    total = (-vx if sx else vx) + (-vy if sy else vy)
    if total == 0:
        return (sx & sy) << 31
    return _round(int(total < 0), abs(total))


def exact_mul_bf16(a, b):
    """bf16 x bf16 -> fp32 bits, for uint16 arrays."""
    return np.array([_mul(*_decode(int(x), 7, 127), *_decode(int(y), 7, 127))
                     for x, y in zip(a, b)], np.uint32)


def exact_add_f32(x, y):
    """fp32 + fp32 -> fp32 bits, for uint32 arrays."""
    return np.array([_add(*_decode(int(p), 23, 127), *_decode(int(q), 23, 127))
                     for p, q in zip(x, y)], np.uint32)


def exact_mac(a, w, acc):
    """``acc + a*w`` with two roundings, for uint16/uint16/uint32 arrays."""
    product = exact_mul_bf16(a, w)
    return exact_add_f32(acc, product)


def _decode_f16(bits):
    """(kind, sign, value) of an fp16 bit pattern."""
    sign, exp, frac = bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
    if exp == 0x1F:
        return ("nan" if frac else "inf"), sign, None
    value = Fraction(frac if exp == 0 else frac | 0x400) * Fraction(2) ** (max(exp, 1) - 25)
    return "num", sign, value


def _int(n):
    return "num", int(n < 0), Fraction(abs(int(n)))


def _to_bf16(bits):
    """fp32 bits -> bf16 bits, nearest-even on the exact value (NaN: 0x7FC0)."""
    kind, sign, value = _decode(bits, 23, 127)
    if kind == "nan":
        return 0x7FC0
    if kind == "inf" or value == 0:
        return (sign << 15) | (0x7F80 if kind == "inf" else 0)
    e = math.floor(math.log2(value))
    while Fraction(2) ** e > value:
        e -= 1
    while Fraction(2) ** (e + 1) <= value:
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 7)
    n, rest = divmod(value / quantum, 1)
    n = int(n) + (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1))
    rounded = n * quantum
    if rounded >= Fraction(2) ** 128:
        return (sign << 15) | 0x7F80
    return (sign << 15) | (_round(0, rounded) >> 16)


def exact_expand(d, scale, minimum, minimum_scale, q, neg_t):
    """One expanded weight, ``bf16(fp32(s * q) + t)``, exactly: ``s =
    fp32(fp16 d * scale)``; ``t = fp32(fp16 minimum * minimum_scale)``,
    negated if `neg_t`; ``minimum=None`` for t = -0. Arguments are Python
    ints (fp16 bit patterns and small integers); returns the bf16 bits."""
    s = _mul(*_decode_f16(d), *_int(scale))
    if minimum is None:
        t = 1 << 31
    else:
        t = _mul(*_decode_f16(minimum), *_int(minimum_scale)) ^ (int(neg_t) << 31)
    p = _mul(*_decode(s, 23, 127), *_int(q))
    return _to_bf16(_add(*_decode(p, 23, 127), *_decode(t, 23, 127)))
