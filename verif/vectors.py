"""Stimulus for the numeric units: every special class crossed pairwise, directed
corner cases, and seeded random vectors biased toward the hard cases."""

import itertools

import numpy as np

from . import golden

__all__ = ["BF16_CLASSES", "FP32_CLASSES", "special_bf16", "special_fp32", "pairs", "salt",
           "random_bf16", "random_fp32", "mac_vectors", "add_vectors", "directed_add"]


def _classes(frac_bits, exp_bits, rng):
    """name -> positive bit pattern of each special class, for one format."""
    exp_max = (1 << exp_bits) - 1
    frac_max = (1 << frac_bits) - 1
    one = ((exp_max >> 1) << frac_bits)
    return {
        "zero": 0,
        "sub_min": 1,
        "sub_max": frac_max,
        "sub_rand": int(rng.integers(2, frac_max)),
        "norm_min": 1 << frac_bits,
        "norm_max": ((exp_max - 1) << frac_bits) | frac_max,
        "one": one,
        "norm_rand": (int(rng.integers(1, exp_max)) << frac_bits) | int(rng.integers(0, frac_max + 1)),
        "inf": exp_max << frac_bits,
        "qnan": (exp_max << frac_bits) | (1 << (frac_bits - 1)),
        "snan": (exp_max << frac_bits) | 1,
    }


def _signed(classes, sign_bit):
    out = {}
    for name, bits in classes.items():
        out["+" + name] = bits
        out["-" + name] = bits | sign_bit
    return out


BF16_CLASSES = _signed(_classes(7, 8, np.random.default_rng(16)), 0x8000)
FP32_CLASSES = _signed(_classes(23, 8, np.random.default_rng(32)), 0x80000000)


def special_bf16():
    return np.array(list(BF16_CLASSES.values()), np.uint16)


def special_fp32():
    return np.array(list(FP32_CLASSES.values()), np.uint32)


def pairs(x, y):
    """Every (x[i], y[j]) pair as two flat arrays."""
    xs, ys = zip(*itertools.product(x, y))
    return np.array(xs, x.dtype), np.array(ys, y.dtype)


def salt(rng, bits, pool, percent):
    """Replace about `percent` % of the bit patterns in `bits` (in place) by
    patterns drawn from `pool` (e.g. `special_bf16()`)."""
    mask = rng.integers(100, size=bits.shape) < percent
    bits[mask] = rng.choice(pool, size=int(mask.sum()))


def random_bf16(rng, n):
    """Random bf16 bit patterns: half uniform over all patterns, half with small
    exponents (subnormal and underflowing products) or near 1 (ordinary math)."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32)
    kind = rng.integers(0, 4, n)
    exp = np.where(kind == 1, rng.integers(0, 40, n), rng.integers(100, 150, n))
    shaped = (bits & 0x807F) | (exp.astype(np.uint32) << 7)
    return np.where(kind == 0, bits, np.where(kind == 3, bits & 0x807F, shaped)).astype(np.uint16)


def random_fp32(rng, n):
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    kind = rng.integers(0, 4, n)
    exp = np.where(kind == 1, rng.integers(0, 40, n), rng.integers(100, 150, n))
    shaped = (bits & 0x807FFFFF) | (exp.astype(np.uint32) << 23)
    return np.where(kind == 0, bits, np.where(kind == 3, bits & 0x807FFFFF, shaped)).astype(np.uint32)


def _near_negation(rng, bits):
    """fp32 patterns close to -x: cancellation with a few ulps of difference."""
    delta = rng.integers(-4, 5, bits.size).astype(np.int64)
    return ((bits.astype(np.int64) + delta) & 0x7FFFFFFF | ((~bits) & 0x80000000)).astype(np.uint32)


def mac_vectors(rng, n):
    """(a, w, acc) for the MAC: random operands; a quarter of the accumulators are
    near -a*w (cancellation), a quarter are near a*w (ties and carries)."""
    a, w = random_bf16(rng, n), random_bf16(rng, n)
    acc = random_fp32(rng, n)
    product = golden.mul(a, w)
    kind = rng.integers(0, 4, n)
    acc = np.where(kind == 1, _near_negation(rng, product), acc)
    acc = np.where(kind == 2, _near_negation(rng, _near_negation(rng, product)), acc)
    return a, w, acc.astype(np.uint32)


def directed_add():
    """Hand-picked fp32 additions: ties at every rounding position, exact
    cancellation, overflow to inf, underflow into and out of the subnormals."""
    cases = [
        (0x3F800000, 0x33800000),  # 1 + 2**-24: tie, round to even (down)
        (0x3F800001, 0x33800000),  # tie, round to even (up)
        (0x3F800000, 0x33800001),  # just above the tie
        (0x3F800000, 0xB3800000),  # 1 - 2**-24: exact in fp32 below 1
        (0x4B7FFFFF, 0x3F000000),  # 16777215 + 0.5: tie into carry
        (0x7F7FFFFF, 0x73800000),  # max + half ulp: tie, even -> overflow to inf
        (0x7F7FFFFF, 0x737FFFFF),  # max + just under half ulp: stays max
        (0x7F7FFFFF, 0x7F7FFFFF),  # overflow
        (0x00800000, 0x80000001),  # min normal - min subnormal -> max subnormal
        (0x007FFFFF, 0x00000001),  # max subnormal + min subnormal -> min normal
        (0x00000001, 0x80000001),  # x + -x = +0
        (0x80000000, 0x80000000),  # -0 + -0 = -0
        (0x80000000, 0x00000000),  # -0 + +0 = +0
        (0x3F800000, 0xBF800000),  # 1 - 1 = +0
        (0x3F800000, 0xBF7FFFFF),  # massive cancellation
        (0x4C000000, 0xBF800001),  # 2**25 - (1+ulp): sticky during subtraction
        (0x7F800000, 0xFF800000),  # inf - inf = NaN
        (0x7F800000, 0x7F800000),
        (0xFF800000, 0x3F800000),
    ]
    x, y = zip(*cases)
    x, y = np.array(x, np.uint32), np.array(y, np.uint32)
    return np.concatenate([x, y]), np.concatenate([y, x])


def add_vectors(rng, n):
    """(x, y) for the adder: random, plus near-cancellations and near-ties."""
    x, y = random_fp32(rng, n), random_fp32(rng, n)
    kind = rng.integers(0, 4, n)
    y = np.where(kind == 1, _near_negation(rng, x), y)
    shift = rng.integers(20, 27, n).astype(np.uint32)
    tie = ((x & 0x7F800000) - np.minimum(x & 0x7F800000, shift << 23)) | (x & 0x80000000)
    y = np.where(kind == 2, tie, y)
    return x, y.astype(np.uint32)
