"""The vector unit's functions as fixed sequences of operations, written once.

``exp``, ``reciprocal`` and ``rsqrt`` are not primitives of the `VectorUnit`
(hdl/vpu.py): each is the sequence of IEEE fp32 operations (round to nearest
even, gradual underflow, canonical NaN, as in docs/numerics.md) and exact 32-bit
integer operations on bit patterns that the functions below perform. That
sequence *is* the specification (docs/vpu.md). The functions take an `ops`
object and call only its methods, so the same text builds the hardware pipeline
(`mxu.hdl.pipeline.SharedPipelineOps`) and runs the golden model (`mxu.verif.vpu.NumpyOps`);
what keeps the two bit-exact is that each primitive is IEEE-exact in both.

The `ops` interface. Every value is a 32-bit word; fp operations read it as
binary32, integer operations as two's complement, wrapping:

* ``const(bits)``: a constant word;
* ``fadd(a, b)``, ``fmul(a, b)``: fp32 add and multiply;
* ``fscale(a, p)``: ``fmul(a, p)`` where ``p`` is a power of two (a normal
  number with a zero fraction), which hardware does without a multiplier;
* ``fmax(a, b)``, ``fmin(a, b)``: fp32 maximum and minimum; a NaN operand gives
  the canonical NaN, and ``-0 < +0``;
* ``iadd(a, b)``, ``isub(a, b)``, ``band(a, b)``, ``bor(a, b)``: integer add,
  subtract, and, or;
* ``shl(a, k)``, ``shr(a, k)``, ``sar(a, k)``: shifts by a constant ``k``
  (logical left, logical right, arithmetic right);
* ``shlv(a, b)``: logical left shift by the value ``b`` (0..31);
* ``clz(a)``: leading zero bits (32 for 0);
* ``ieq(a, b)``: 1 if the words are equal, else 0;
* ``select(c, a, b)``: ``a`` where ``c`` is non-zero, else ``b``;
* ``cut(a)``: the same word. In a pipeline of fp32 units deeper than one
  stage it is a register: integer steps before it and the fp32 unit after it
  take a cycle each (a seed's integer steps and a multiplier's first stage
  did not fit one cycle at 50 MHz on the ECP5, docs/synth.md).
"""

import struct

__all__ = ["f32", "exp", "reciprocal", "rsqrt", "FUNCTIONS", "EXP_COEFFS", "EXP_LIMITS",
           "RECIP_STEPS", "RSQRT_STEPS", "RSQRT_MAGIC"]

QNAN = 0x7FC00000
INF = 0x7F800000
SIGN = 0x80000000
MAGNITUDE = 0x7FFFFFFF
ONE = 0x3F800000


def f32(value):
    """The binary32 bit pattern of a Python float, rounded to nearest even."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


# exp: x is clamped to [-104, 89], beyond which exp(x) rounds to 0 or overflows
# to inf anyway (exp(88.73) > FLT_MAX, exp(-103.98) < 2**-150).
EXP_LIMITS = (-104.0, 89.0)
_ROUND_MAGIC = 1.5 * 2 ** 23        # x + 1.5*2**23 rounds x to an integer (|x| < 2**22)
_LOG2E = 1.4426950408889634
# Cody and Waite's split of ln 2: LN2_HI has 15 significant bits, so n * LN2_HI
# is exact for |n| <= 2**9.
_LN2_HI = 0.693145751953125
_LN2_LO = 1.428606765330187e-06
# e**r on |r| <= ln(2)/2: Taylor to degree 7, highest power first (Horner).
EXP_COEFFS = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)

RECIP_STEPS = 3          # Newton steps after the linear seed (error 1/17 -> 2e-10)
RSQRT_STEPS = 3          # Newton steps after the magic seed (error 3.4e-2 -> 1.8e-3 -> 4.6e-6 -> 3e-11)
RSQRT_MAGIC = 0x5F3759DF


def _pow2(ops, k):
    """2**k as a word, for k (a word) in the normal exponent range."""
    return ops.shl(ops.iadd(k, ops.const(127)), 23)


def _scale(ops, y, k):
    """y * 2**k in two exact-or-once-rounded steps: k is split as k1 + k2 with both
    halves in the normal exponent range, y * 2**k1 is exact, and the second
    multiply rounds once (to a subnormal, or to inf)."""
    k1 = ops.sar(k, 1)
    k2 = ops.isub(k, k1)
    return ops.fscale(ops.fscale(y, _pow2(ops, k1)), _pow2(ops, k2))


def _frexp(ops, a):
    """(m, e) with a = m * 2**e, m in [1, 2) a binary32 word, for a positive finite
    non-zero binary32 word `a` (subnormals are normalised); garbage otherwise."""
    field = ops.shr(a, 23)
    subnormal = ops.ieq(field, ops.const(0))
    lz = ops.clz(a)
    shift = ops.select(subnormal, ops.isub(lz, ops.const(8)), ops.const(0))
    mant = ops.band(ops.shlv(a, shift), ops.const(0x007FFFFF))
    e = ops.select(subnormal, ops.isub(ops.const(-118 & 0xFFFFFFFF), lz),
                   ops.isub(field, ops.const(127)))
    return ops.bor(mant, ops.const(ONE)), e


def exp(ops, x):
    """e**x: clamp, n = round(x * log2 e) by the 1.5*2**23 trick, r = x - n ln 2
    (Cody-Waite), a degree-7 polynomial, and the exact exponent adjust 2**n."""
    lo, hi = EXP_LIMITS
    x = ops.fmin(ops.fmax(x, ops.const(f32(lo))), ops.const(f32(hi)))
    t = ops.fadd(ops.fmul(x, ops.const(f32(_LOG2E))), ops.const(f32(_ROUND_MAGIC)))
    nf = ops.fadd(t, ops.const(f32(-_ROUND_MAGIC)))
    n = ops.isub(t, ops.const(f32(_ROUND_MAGIC)))
    r = ops.fadd(x, ops.fmul(nf, ops.const(f32(-_LN2_HI))))
    r = ops.fadd(r, ops.fmul(nf, ops.const(f32(-_LN2_LO))))
    p = ops.const(f32(EXP_COEFFS[0]))
    for c in EXP_COEFFS[1:]:
        p = ops.fadd(ops.fmul(p, r), ops.const(f32(c)))
    return _scale(ops, p, n)


def reciprocal(ops, x):
    """1/x: |x| = m * 2**e, the seed 24/17 - 8/17 m, `RECIP_STEPS` Newton steps
    y += y (1 - m y), then y * 2**-e; +-0 -> +-inf, +-inf -> +-0, NaN -> NaN."""
    sign = ops.band(x, ops.const(SIGN))
    a = ops.band(x, ops.const(MAGNITUDE))
    m, e = _frexp(ops, a)
    m = ops.cut(m)
    neg_m = ops.bor(m, ops.const(SIGN))
    y = ops.fadd(ops.fmul(m, ops.const(f32(-8 / 17))), ops.const(f32(24 / 17)))
    for _ in range(RECIP_STEPS):
        err = ops.fadd(ops.fmul(neg_m, y), ops.const(ONE))
        y = ops.fadd(ops.fmul(y, err), y)
    q = _scale(ops, y, ops.isub(ops.const(0), e))
    q = ops.select(ops.ieq(a, ops.const(0)), ops.const(INF),
                   ops.select(ops.ieq(a, ops.const(INF)), ops.const(0), q))
    return _nan_if(ops, _is_nan(ops, a), ops.bor(q, sign))


def rsqrt(ops, x):
    """1/sqrt(x): x = m * 2**e with e even (m in [1, 4)), the seed
    0x5F3759DF - (m >> 1), `RSQRT_STEPS` Newton steps y += y (1/2 - (m/2) y**2), then
    y * 2**(-e/2) (exact); +0 -> +inf, -0 -> -inf, +inf -> +0, x < 0 or NaN -> NaN."""
    sign = ops.band(x, ops.const(SIGN))
    a = ops.band(x, ops.const(MAGNITUDE))
    m, e = _frexp(ops, a)
    odd = ops.band(e, ops.const(1))
    m = ops.iadd(m, ops.shl(odd, 23))               # m * 2 when e is odd: exact
    e = ops.isub(e, odd)
    neg_half_m = ops.bor(ops.isub(m, ops.const(1 << 23)), ops.const(SIGN))   # -m/2, exact
    y = ops.cut(ops.isub(ops.const(RSQRT_MAGIC), ops.shr(m, 1)))
    for _ in range(RSQRT_STEPS):
        u = ops.fadd(ops.fmul(neg_half_m, ops.fmul(y, y)), ops.const(f32(0.5)))
        y = ops.fadd(ops.fmul(y, u), y)
    q = ops.fscale(y, _pow2(ops, ops.sar(ops.isub(ops.const(0), e), 1)))
    zero = ops.ieq(a, ops.const(0))
    q = ops.select(zero, ops.bor(ops.const(INF), sign),
                   ops.select(ops.ieq(a, ops.const(INF)), ops.const(0), q))
    negative = ops.band(ops.ieq(sign, ops.const(SIGN)), ops.ieq(zero, ops.const(0)))
    return _nan_if(ops, ops.bor(_is_nan(ops, a), negative), q)


def _is_nan(ops, a):
    """1 if the magnitude word `a` is a NaN: a > 0x7F800000, i.e. a - 0x7F800001
    does not borrow (both below 2**31)."""
    return ops.ieq(ops.shr(ops.isub(a, ops.const(INF + 1)), 31), ops.const(0))


def _nan_if(ops, cond, value):
    return ops.select(cond, ops.const(QNAN), value)


FUNCTIONS = {"exp": exp, "reciprocal": reciprocal, "rsqrt": rsqrt}
