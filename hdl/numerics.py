"""IEEE-754 number formats and the combinational datapath of one MAC.

Every operation here rounds to nearest-even, takes and produces subnormals
(gradual underflow), handles +-inf, produces the canonical quiet NaN
``0x7FC00000`` (``0x7FC0`` for bf16, sign kept) for every NaN result, and follows
the IEEE signed-zero rules. DESIGN.md section 3 is the contract; the golden model
in `mxu.verif.golden` is its NumPy statement.
"""

from amaranth.hdl import C, Cat, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "BF16", "FP32", "FP32_QNAN", "BF16_QNAN",
    "Bf16Multiplier", "Fp32Adder", "Fp32AddAlign", "Fp32AddRound", "Fp32AddPartial",
    "Fp32ToBf16", "leading_zeros",
]


class BF16(data.Struct):
    """bfloat16: 1 sign, 8 exponent (bias 127), 7 fraction bits."""
    frac: 7
    exp: 8
    sign: 1


class FP32(data.Struct):
    """IEEE-754 binary32: 1 sign, 8 exponent (bias 127), 23 fraction bits."""
    frac: 23
    exp: 8
    sign: 1


FP32_QNAN = 0x7FC00000
BF16_QNAN = 0x7FC0

def signed(width):
    return Shape(width, signed=True)


# Extra bits kept below the fp32 LSB while adding: guard, round and sticky.
_GRS = 3
# Width of the aligned significands: hidden bit + 23 fraction bits + GRS.
_ALIGNED = 24 + _GRS


def leading_zeros(value):
    """Number of leading zero bits of `value` (``len(value)`` if it is zero), as a
    balanced tree of multiplexers (logarithmic depth: it sits on the adder's
    critical path)."""
    width = len(value)
    if width == 1:
        return Mux(value[0], C(0, 1), C(1, 1))
    low_width = width // 2
    high, low = value[low_width:], value[:low_width]
    return Mux(high == 0, (width - low_width) + leading_zeros(low), leading_zeros(high))


def _classify(number, frac_bits):
    """(is_nan, is_inf, is_zero) of a BF16/FP32 view."""
    exp_max = number.exp == (1 << len(number.exp)) - 1
    frac_zero = number.frac == 0
    return exp_max & ~frac_zero, exp_max & frac_zero, (number.exp == 0) & frac_zero


def _significand(number):
    """Significand with its hidden bit, and the effective exponent (subnormals use 1)."""
    normal = number.exp != 0
    return Cat(number.frac, normal), Mux(normal, number.exp, 1)


class Bf16Multiplier(wiring.Component):
    """bf16 x bf16 -> fp32, combinational.

    The 8x8-bit significand product is exact in fp32 unless the result is
    subnormal (then rounded to nearest-even) or beyond the fp32 range (+-inf).

    Interface: ``a``, ``b``: In(BF16); ``p``: Out(FP32).
    """

    a: In(BF16)
    b: In(BF16)
    p: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b
        a_nan, a_inf, a_zero = _classify(a, 7)
        b_nan, b_inf, b_zero = _classify(b, 7)
        sign = a.sign ^ b.sign

        sig_a, exp_a = _significand(a)
        sig_b, exp_b = _significand(b)
        product = Signal(16)
        m.d.comb += product.eq(sig_a * sig_b)
        lz = Signal(range(17))
        m.d.comb += lz.eq(leading_zeros(product))
        exp_sum = Signal(range(512))
        m.d.comb += exp_sum.eq(exp_a + exp_b)

        # Biased fp32 exponent of the normalised product: value = P * 2**(ea+eb-268),
        # leading one at bit 15-lz, so the field is ea + eb - 126 - lz.
        field = Signal(signed(11))
        m.d.comb += field.eq(exp_sum - 126 - lz)
        normalised = Signal(16)
        m.d.comb += normalised.eq(product << lz)
        normal_bits = Cat(C(0, 8), normalised[:15], field[:8])

        # Subnormal result: fraction = P * 2**(ea+eb-119), rounded to nearest-even.
        left = Signal(signed(11))
        m.d.comb += left.eq(exp_sum - 119)
        right = Signal(range(19))
        m.d.comb += right.eq(Mux(-left > 18, 18, -left))
        wide = Signal(34)
        m.d.comb += wide.eq(Cat(C(0, 18), product) >> right)
        kept = wide[18:]
        round_up = wide[17] & ((wide[:17] != 0) | kept[0])
        sub_bits = Signal(31)
        with m.If(left >= 0):
            m.d.comb += sub_bits.eq(product << left[:5])
        with m.Else():
            m.d.comb += sub_bits.eq(kept + round_up)

        with m.If(a_nan | b_nan | (a_inf & b_zero) | (a_zero & b_inf)):
            m.d.comb += self.p.as_value().eq(FP32_QNAN)
        with m.Elif(a_inf | b_inf | (field >= 255)):
            m.d.comb += self.p.as_value().eq(Cat(C(0x7F800000, 31), sign))
        with m.Elif(a_zero | b_zero):
            m.d.comb += self.p.as_value().eq(Cat(C(0, 31), sign))
        with m.Elif(field >= 1):
            m.d.comb += self.p.as_value().eq(Cat(normal_bits, sign))
        with m.Else():
            m.d.comb += self.p.as_value().eq(Cat(sub_bits, sign))
        return m


class Fp32AddPartial(data.Struct):
    """What the alignment half of `Fp32Adder` hands to the rounding half."""
    sum: _ALIGNED + 1     # aligned significand sum; value = sum * 2**(exp-127-26)
    exp: 8                # effective exponent of the larger operand
    sign: 1               # sign of the larger operand
    zero_sign: 1          # sign of an exact-zero sum (IEEE: -0 only for -0 + -0)
    special: 1            # the result is `special_bits` (NaN or infinity)
    special_bits: 32


class Fp32AddAlign(wiring.Component):
    """First half of fp32 addition: special cases, operand swap, alignment with a
    sticky bit, and the significand add/subtract.

    Interface: ``a``, ``b``: In(FP32); ``partial``: Out(Fp32AddPartial).
    """

    a: In(FP32)
    b: In(FP32)
    partial: Out(Fp32AddPartial)

    def elaborate(self, platform):
        m = Module()
        a, b, out = self.a, self.b, self.partial
        a_nan, a_inf, _ = _classify(a, 23)
        b_nan, b_inf, _ = _classify(b, 23)

        swap = b.as_value()[:31] > a.as_value()[:31]
        big, small = FP32(Signal(32)), FP32(Signal(32))
        m.d.comb += [
            big.eq(Mux(swap, b.as_value(), a.as_value())),
            small.eq(Mux(swap, a.as_value(), b.as_value())),
        ]
        sig_big, exp_big = _significand(big)
        sig_small, exp_small = _significand(small)
        distance = Signal(8)
        m.d.comb += distance.eq(exp_big - exp_small)
        shift = Mux(distance > _ALIGNED, _ALIGNED, distance)

        # Shift the smaller significand right; bits falling off become one sticky bit.
        wide = Signal(2 * _ALIGNED)
        m.d.comb += wide.eq(Cat(C(0, _ALIGNED + _GRS), sig_small) >> shift)
        aligned_small = Cat(wide[_ALIGNED] | (wide[:_ALIGNED] != 0), wide[_ALIGNED + 1:])
        aligned_big = Cat(C(0, _GRS), sig_big)
        with m.If(big.sign ^ small.sign):
            m.d.comb += out.sum.eq(aligned_big - aligned_small)
        with m.Else():
            m.d.comb += out.sum.eq(aligned_big + aligned_small)

        m.d.comb += [
            out.exp.eq(exp_big),
            out.sign.eq(big.sign),
            out.zero_sign.eq(a.sign & b.sign),
        ]
        with m.If(a_nan | b_nan | (a_inf & b_inf & (a.sign != b.sign))):
            m.d.comb += [out.special.eq(1), out.special_bits.eq(FP32_QNAN)]
        with m.Elif(a_inf | b_inf):
            m.d.comb += [out.special.eq(1), out.special_bits.eq(big.as_value())]
        return m


class Fp32AddRound(wiring.Component):
    """Second half of fp32 addition: normalisation (including gradual underflow),
    round to nearest-even, overflow to infinity, and the signed-zero rule.

    Interface: ``partial``: In(Fp32AddPartial); ``s``: Out(FP32).
    """

    partial: In(Fp32AddPartial)
    s: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        p = self.partial
        total = p.sum

        lz = Signal(range(_ALIGNED + 1))
        m.d.comb += lz.eq(leading_zeros(total[:_ALIGNED]))
        normed = Signal(_ALIGNED)
        exp = Signal(9)
        with m.If(total[_ALIGNED]):
            # Carry out: shift right by one, keeping the dropped bit sticky.
            m.d.comb += [
                normed.eq(Cat(total[0] | total[1], total[2:])),
                exp.eq(p.exp + 1),
            ]
        with m.Elif(lz < p.exp):
            m.d.comb += [normed.eq(total << lz), exp.eq(p.exp - lz)]
        with m.Else():
            # Below the normal range: shift only as far as exponent field 0 allows.
            subnormal_shift = Signal(range(_ALIGNED + 1))
            m.d.comb += [
                subnormal_shift.eq(p.exp - 1),
                normed.eq(total << subnormal_shift),
                exp.eq(0),
            ]

        lsb, guard, sticky = normed[_GRS], normed[_GRS - 1], normed[:_GRS - 1] != 0
        round_up = guard & (sticky | lsb)
        magnitude = Signal(32)
        m.d.comb += magnitude.eq(Cat(normed[_GRS:_GRS + 23], exp[:8]) + round_up)

        with m.If(p.special):
            m.d.comb += self.s.as_value().eq(p.special_bits)
        with m.Elif(total == 0):
            m.d.comb += self.s.as_value().eq(Cat(C(0, 31), p.zero_sign))
        with m.Elif(exp >= 255):
            m.d.comb += self.s.as_value().eq(Cat(C(0x7F800000, 31), p.sign))
        with m.Else():
            m.d.comb += self.s.as_value().eq(Cat(magnitude[:31], p.sign))
        return m


class Fp32Adder(wiring.Component):
    """fp32 + fp32 -> fp32, combinational: `Fp32AddAlign` then `Fp32AddRound`.

    Interface: ``a``, ``b``: In(FP32); ``s``: Out(FP32).
    """

    a: In(FP32)
    b: In(FP32)
    s: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.align = align = Fp32AddAlign()
        m.submodules.round = rnd = Fp32AddRound()
        m.d.comb += [
            align.a.eq(self.a),
            align.b.eq(self.b),
            rnd.partial.eq(align.partial),
            self.s.eq(rnd.s),
        ]
        return m


class Fp32ToBf16(wiring.Component):
    """fp32 -> bf16, round to nearest-even, as ``ml_dtypes`` does: subnormals kept,
    overflow to +-inf, NaN to the quiet NaN ``0x7FC0`` with the sign kept.

    Interface: ``x``: In(FP32); ``y``: Out(BF16).
    """

    x: In(FP32)
    y: Out(BF16)

    def elaborate(self, platform):
        m = Module()
        x = self.x.as_value()
        is_nan, _, _ = _classify(self.x, 23)
        rounded = Signal(32)
        m.d.comb += rounded.eq(x[:31] + 0x7FFF + x[16])
        with m.If(is_nan):
            m.d.comb += self.y.as_value().eq(Cat(C(BF16_QNAN, 15), self.x.sign))
        with m.Else():
            m.d.comb += self.y.as_value().eq(Cat(rounded[16:31], self.x.sign))
        return m
