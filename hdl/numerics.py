"""IEEE-754 number formats and the combinational datapath of one MAC.

Every operation here rounds to nearest-even, takes and produces subnormals
(gradual underflow), handles +-inf, produces the canonical quiet NaN
``0x7FC00000`` (``0x7FC0`` for bf16, sign kept) for every NaN result, and follows
the IEEE signed-zero rules. docs/numerics.md is the contract; the golden model
in `mxu.verif.golden` is its NumPy statement.

Datapath (docs/synth.md explains the costs): operands travel between the blocks
*unpacked* (`FpUnpacked`: sign, effective exponent, significand with its hidden
bit), so the multiplier never packs its product into the fp32 encoding only for
the adder to unpack it again.

* `Bf16ExactMultiplier` = `Bf16ProductCore` (the 8x8-bit significand product, a
  DSP block) then `Bf16ProductRound` (one left shift that both normalises the
  product and -- below the fp32 normal range -- places it on the 2**-149 grid,
  its fine part a multiplication by a power of two, a second DSP block; and
  the one rounding a bf16 product ever needs, to a subnormal). Its output is
  exactly the fp32 product, unpacked.
* `FpAddAlign`: magnitude order, alignment shift with a sticky bit (the OR of
  what each level of the shifter drops), one add or subtract.
* `Fp32AddRound`: one normalising left shift (clamped at the subnormal
  boundary, so a carry-out needs no second path), round to nearest-even,
  overflow; NaN and infinity enter the rounding add's inputs, no output
  multiplexer.

`Bf16Multiplier`, `Fp32AddAlign` and `Fp32Adder` are the packed fp32 views of the
same blocks; `MacPipeline` (hdl/mac.py) chains the unpacked ones.
"""

from amaranth.hdl import C, Cat, Module, Mux, Shape, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "BF16", "FP32", "FP32_QNAN", "BF16_QNAN", "FpUnpacked",
    "Bf16Multiplier", "Bf16ExactMultiplier", "Bf16ProductCore", "Bf16ProductRound",
    "Bf16RawProduct", "Bf16ProductPlan", "Bf16ProductAmount", "Bf16ProductShift",
    "FP_STAGES", "Fp32Adder", "FpAddAlign", "FpAddOrdered", "FpAddOrder", "FpAddShiftAdd", "Fp32AddAlign",
    "Fp32AddRound", "Fp32AddNormPlan", "Fp32AddNormAmount", "Fp32AddNormalize", "Fp32AddPartial", "Fp32ToBf16", "Fp32Multiplier", "leading_zeros",
    "LZC_FORMS",
    "unpack_fp32",
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


class FpUnpacked(data.Struct):
    """A binary32 value between datapath blocks.

    Finite values are ``(-1)**sign * sig * 2**(exp - 150)`` with ``1 <= exp <=
    254``; ``sig`` holds the hidden bit (bit 23), which is 0 only for subnormals
    (then ``exp == 1``) and zero (``sig == 0``). ``nan`` and ``inf`` flag the
    specials; ``exp`` and ``sig`` are then meaningless.
    """
    sig: 24
    exp: 8
    sign: 1
    nan: 1
    inf: 1


FP32_QNAN = 0x7FC00000
BF16_QNAN = 0x7FC0


def signed(width):
    return Shape(width, signed=True)


# Extra bits kept below the fp32 LSB while adding: guard, round and sticky.
_GRS = 3
# Width of the aligned significands: hidden bit + 23 fraction bits + GRS.
_ALIGNED = 24 + _GRS


LZC_FORMS = ("tree", "onehot")


def leading_zeros(value, form="tree", m=None):
    """Number of leading zero bits of `value` (``len(value)`` if it is zero).

    The value is first padded to a power of two with ones below it, so that
    the padded value of a zero is ``len(value)`` zeros and then a one. Two
    forms give the same count:

    ``"tree"``
        A balanced tree of multiplexers between concatenations, with no adder:
        the fewest logic levels on an FPGA, for the one-stage fp32 units of
        the vector lanes, whose critical path runs through it (docs/synth.md).
    ``"onehot"``
        The value smeared towards its low end in log2 steps (each bit the OR
        of every bit above it) leaves one set bit where the leading one sits;
        folding the upper half of that one-hot word onto the lower half, and
        again, gives the bits of its position. Every step is a word-wide OR,
        AND or constant shift, so the Verilated model spends a few dozen
        operations on it where the tree costs about ten times as many
        (docs/simulation.md). The pipelined PE uses it; on an FPGA it is a
        few LUT levels more.

    With a module `m`, each step is a signal driven in `m`'s comb domain:
    Amaranth writes a subexpression out again at every use, and in both forms
    each step uses the one before more than once, so a 28-bit count as one
    expression is about 2,000 Verilog assigns, which Icarus and the solvers
    evaluate one by one (Verilator and Yosys merge the copies). Without `m`,
    one expression.
    """
    if form not in LZC_FORMS:
        raise ValueError(f"form must be one of {LZC_FORMS}, not {form!r}")
    width = len(value)
    size = 1 << (width - 1).bit_length()
    if size != width:
        value = Cat(C((1 << (size - width)) - 1, size - width), value)

    def named(expr, name):
        if m is None:
            return expr
        signal = Signal(len(expr), name=name)
        m.d.comb += signal.eq(expr)
        return signal

    if form == "tree":
        return _leading_zeros_pow2(value, named, single_use=m is None)
    return _leading_zeros_onehot(value, named, zero_case=size == width)


def _leading_zeros_pow2(value, named, single_use):
    if len(value) == 1:
        return ~value[0]
    half = len(value) // 2
    k = half.bit_length() - 1           # bits of a count below `half`
    high, low = value[half:], value[:half]
    lz_high = _leading_zeros_pow2(high, named, single_use)
    lz_low = _leading_zeros_pow2(low, named, single_use)
    # high != 0: its count (< half). high == 0: half + the low half's count,
    # which is `half` itself (bit k) only when the low half is zero too.
    # As one expression (`single_use`), each count is used once: Amaranth
    # copies a subexpression out at every use, so a count used three times
    # a level was 4**levels copies (8,000 assigns for the fp32 multiplier's
    # 48-bit count, 17 s to elaborate, minutes for a chip's lanes;
    # docs/synth.md). Named steps are signals, free to use again.
    low_zero = (low == 0) if single_use else lz_low[k]
    return named(Mux(high == 0, Cat(lz_low[:k], ~low_zero, low_zero), Cat(lz_high[:k], C(0, 2))),
                 f"lzc_tree{len(value)}")


def _leading_zeros_onehot(value, named, zero_case):
    """`value` has a power-of-two width; it may be zero only if `zero_case`."""
    if zero_case:
        # Ones below it: the padded value is never zero, and a zero counts `len(value)`.
        value = Cat(C((1 << len(value)) - 1, len(value)), value)
    size = len(value)
    value = named(value, "lzc_value")
    smear = value
    step = 1
    while step < size:
        smear = named(smear | (smear >> step), f"lzc_smear{step}")
        step *= 2
    onehot = named(value & ~(smear >> 1), "lzc_onehot")
    # The one's position, most significant bit first: is it in the upper half?
    # Then fold the upper half onto the lower one (an OR, the other is zero).
    position = []
    half = size // 2
    while half >= 1:
        upper = onehot[half:2 * half]
        position.append(upper.any())
        onehot = named(onehot[:half] | upper, f"lzc_fold{half}")
        half //= 2
    # size - 1 - position zeros lie above the one: the position's complement.
    return ~Cat(*reversed(position))


def at_least(value, k):
    """``value >= k`` for an unsigned `value` and a constant `k`, as plain logic
    (Yosys maps a comparison to a carry chain even with a constant operand)."""
    if k <= 0:
        return C(1, 1)
    if k >= 1 << len(value):
        return C(0, 1)
    top = len(value) - 1
    if (k >> top) & 1:
        return value[top] & at_least(value[:top], k - (1 << top))
    return value[top] | at_least(value[:top], k)


def _trailing_zeros(value):
    """Number of trailing zero bits of `value` (``len(value)`` if it is zero)."""
    return leading_zeros(Cat(*(value[i] for i in reversed(range(len(value))))))


def _classify(number, frac_bits):
    """(is_nan, is_inf, is_zero) of a BF16/FP32 view."""
    exp_max = number.exp == (1 << len(number.exp)) - 1
    frac_zero = number.frac == 0
    return exp_max & ~frac_zero, exp_max & frac_zero, (number.exp == 0) & frac_zero


def _significand(number):
    """Significand with its hidden bit, and the effective exponent (subnormals use 1)."""
    normal = number.exp != 0
    return Cat(number.frac, normal), Mux(normal, number.exp, 1)


def unpack_fp32(m, number, name):
    """An `FpUnpacked` signal driven (combinationally, in `m`) from the FP32 view
    `number`."""
    out = Signal(FpUnpacked, name=name)
    nan, inf, _ = _classify(number, 23)
    sig, exp = _significand(number)
    m.d.comb += [out.sig.eq(sig), out.exp.eq(exp), out.sign.eq(number.sign),
                 out.nan.eq(nan), out.inf.eq(inf)]
    return out


def _pack(m, value, out):
    """Drive the FP32 view `out` from the `FpUnpacked` `value` (which must be an
    exact binary32 value: no rounding happens here)."""
    with m.If(value.nan):
        m.d.comb += out.as_value().eq(FP32_QNAN)
    with m.Elif(value.inf):
        m.d.comb += out.as_value().eq(Cat(C(0x7F800000, 31), value.sign))
    with m.Else():
        # The hidden bit tells a normal number from a subnormal (field 0) one.
        m.d.comb += out.as_value().eq(
            Cat(value.sig[:23], Mux(value.sig[23], value.exp, 0), value.sign))


class Bf16RawProduct(data.Struct):
    """The product of two bf16 before normalisation: ``(-1)**sign * product *
    2**(exp_sum - 268)``, or a special (``nan``; ``inf``: an infinite operand)."""
    product: 16           # the 8x8-bit significand product
    exp_sum: 9            # sum of the two effective exponents
    sign: 1
    zero: 1               # an operand is zero
    nan: 1
    inf: 1


class Bf16ProductCore(wiring.Component):
    """First half of `Bf16ExactMultiplier`: operand classes, the significand
    product (a DSP block on an FPGA) and the exponent sum.

    Interface: ``a``, ``b``: In(BF16); ``raw``: Out(Bf16RawProduct).
    """

    a: In(BF16)
    b: In(BF16)
    raw: Out(Bf16RawProduct)

    def elaborate(self, platform):
        m = Module()
        a, b, raw = self.a, self.b, self.raw
        a_nan, a_inf, a_zero = _classify(a, 7)
        b_nan, b_inf, b_zero = _classify(b, 7)
        sig_a, exp_a = _significand(a)
        sig_b, exp_b = _significand(b)
        m.d.comb += [
            raw.product.eq(sig_a * sig_b),
            raw.exp_sum.eq(exp_a + exp_b),
            raw.sign.eq(a.sign ^ b.sign),
            raw.zero.eq(a_zero | b_zero),
            raw.nan.eq(a_nan | b_nan | (a_inf & b_zero) | (a_zero & b_inf)),
            raw.inf.eq(a_inf | b_inf),
        ]
        return m


class Bf16ProductPlan(data.Struct):
    """What `Bf16ProductAmount` hands to `Bf16ProductShift`: the raw product, the
    shift that places it, and the exponent field of a normal result.

    The shift ``amount`` = 16 ``coarse`` + r travels as ``coarse`` and the one-hot
    ``power`` = 2**r: decoded before the register, so that the DSP block that
    multiplies by it sees a register at its input (docs/synth.md)."""
    product: 16
    power: 16             # 2**(amount % 16)
    coarse: 2             # amount // 16
    normal: 1             # the result is normal (else subnormal, or zero)
    field: 8              # exponent field of a normal result
    overflow: 1           # a normal result's field is 255 or more: infinity
    sign: 1
    nan: 1
    inf: 1


class Bf16ProductAmount(wiring.Component):
    """First half of `Bf16ProductRound`: the leading-zero count of the raw
    product and the one left shift that places it (see `Bf16ProductRound`).

    Interface: ``raw``: In(Bf16RawProduct); ``plan``: Out(Bf16ProductPlan).
    """

    raw: In(Bf16RawProduct)
    plan: Out(Bf16ProductPlan)

    # Fraction bits kept below the 2**-149 grid: enough for every product whose
    # rounding can give a non-zero result (P < 2**16).
    FRACTION = 17

    def elaborate(self, platform):
        m = Module()
        raw, plan = self.raw, self.plan
        product, exp_sum = raw.product, raw.exp_sum
        lz = Signal(range(17))
        # The chip uses this block only in the pipelined MAC: the form cheapest to simulate.
        m.d.comb += lz.eq(leading_zeros(product, "onehot", m))

        # value = P * 2**(ea + eb - 268). Normal result: exponent field
        # ea + eb - 126 - lz, and P << (lz + 8) puts the hidden bit on bit 23.
        # Subnormal result: sig = P * 2**(ea + eb - 119) on the 2**-149 grid.
        # Both as one left shift of P into [sig(24) | fraction(17)]; the result
        # is normal exactly when its field is >= 1.
        t = Signal(signed(11))  # ea + eb - lz - 1, one carry chain (-lz - 1 = ~lz)
        m.d.comb += t.eq(exp_sum + ~Cat(lz, C(0, len(t) - len(lz))))
        field = Signal(8)       # the field is t - 125
        m.d.comb += field.eq(t - 125)
        # Comparisons with constants as plain logic, not carry chains.
        normal = Signal()       # field >= 1
        m.d.comb += normal.eq(~t[-1] & at_least(t[:-1], 126))
        overflow = Signal()     # field >= 255
        m.d.comb += overflow.eq(~t[-1] & at_least(t[:-1], 380))
        # The subnormal shift: grid = ea + eb - 119 + FRACTION, 0 if negative.
        # It is below the normal shift whenever it is used, so 6 bits hold it.
        grid_base = 119 - self.FRACTION
        grid = Signal(6)
        m.d.comb += grid.eq(exp_sum - grid_base)
        amount = Signal(6)
        m.d.comb += amount.eq(Mux(normal, lz + 8 + self.FRACTION,
                                  Mux(at_least(exp_sum, grid_base), grid, 0)))
        m.d.comb += [
            plan.product.eq(product),
            plan.power.eq(C(1, 16) << amount[:4]),
            plan.coarse.eq(amount[4:]),
            # A zero product must look like an fp32 zero (exp 1) to the adder's
            # magnitude comparison.
            plan.normal.eq(normal & ~raw.zero),
            plan.field.eq(field),
            plan.overflow.eq(overflow),
            plan.sign.eq(raw.sign),
            plan.nan.eq(raw.nan),
            plan.inf.eq(raw.inf),
        ]
        return m


class Bf16ProductShift(wiring.Component):
    """Second half of `Bf16ProductRound`: the shift, the one rounding a bf16
    product can need (to a subnormal), and the unpacked result.

    Interface: ``plan``: In(Bf16ProductPlan); ``p``: Out(FpUnpacked).
    """

    plan: In(Bf16ProductPlan)
    p: Out(FpUnpacked)

    def elaborate(self, platform):
        m = Module()
        plan, p = self.plan, self.p
        fraction = Bf16ProductAmount.FRACTION
        # The shift by amount = 16 coarse + r: the fine part is a multiplication by
        # 2**r, which an FPGA maps to a DSP block (MULT18X18D on the ECP5; a
        # 6-level shifter of 41 bits took 65 more LUT4), the coarse part a
        # choice of three positions.
        fine = Signal(31)
        m.d.comb += fine.eq(plan.product * plan.power)
        shifted = Signal(24 + fraction)
        with m.Switch(plan.coarse):
            with m.Case(0):
                m.d.comb += shifted.eq(fine)
            with m.Case(1):
                m.d.comb += shifted.eq(fine << 16)
            with m.Default():
                m.d.comb += shifted.eq(fine << 32)
        integer = shifted[fraction:]
        guard = shifted[fraction - 1]
        sticky = shifted[:fraction - 1] != 0
        # A normal product has no fraction bits (guard = sticky = 0).
        round_up = guard & (sticky | integer[0])
        m.d.comb += [
            p.sig.eq(integer + round_up),
            p.exp.eq(Mux(plan.normal, plan.field, 1)),
            p.sign.eq(plan.sign),
            p.nan.eq(plan.nan),
            p.inf.eq(~plan.nan & (plan.inf | (plan.normal & plan.overflow))),
        ]
        return m


class Bf16ProductRound(wiring.Component):
    """Second half of `Bf16ExactMultiplier`: the raw product as an exact fp32
    value, unpacked -- `Bf16ProductAmount` then `Bf16ProductShift`.

    The 16-bit product ``P`` has at most 16 significant bits, so the fp32 product
    is exact except below the normal range (rounded to the 2**-149 grid, to
    nearest-even) and beyond it (+-inf). One left shift of ``P`` serves both
    cases: by its leading-zero count (normal result: the hidden bit lands on bit
    23), or by ``ea + eb - 119`` (subnormal result: bit 0 lands on 2**-149, with
    17 fraction bits below for the rounding); the smaller of the two is the
    right one.

    Interface: ``raw``: In(Bf16RawProduct); ``p``: Out(FpUnpacked).
    """

    raw: In(Bf16RawProduct)
    p: Out(FpUnpacked)

    def elaborate(self, platform):
        m = Module()
        m.submodules.amount = amount = Bf16ProductAmount()
        m.submodules.shift = shift = Bf16ProductShift()
        m.d.comb += [amount.raw.eq(self.raw), shift.plan.eq(amount.plan), self.p.eq(shift.p)]
        return m


class Bf16ExactMultiplier(wiring.Component):
    """bf16 x bf16 -> the fp32 product, combinational, unpacked:
    `Bf16ProductCore` then `Bf16ProductRound`.

    Interface: ``a``, ``b``: In(BF16); ``p``: Out(FpUnpacked).
    """

    a: In(BF16)
    b: In(BF16)
    p: Out(FpUnpacked)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = Bf16ProductCore()
        m.submodules.round = rnd = Bf16ProductRound()
        m.d.comb += [core.a.eq(self.a), core.b.eq(self.b), rnd.raw.eq(core.raw),
                     self.p.eq(rnd.p)]
        return m


class Bf16Multiplier(wiring.Component):
    """bf16 x bf16 -> fp32, combinational: `Bf16ExactMultiplier`, packed.

    The 8x8-bit significand product is exact in fp32 unless the result is
    subnormal (then rounded to nearest-even) or beyond the fp32 range (+-inf).

    Interface: ``a``, ``b``: In(BF16); ``p``: Out(FP32).
    """

    a: In(BF16)
    b: In(BF16)
    p: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.exact = exact = Bf16ExactMultiplier()
        m.d.comb += [exact.a.eq(self.a), exact.b.eq(self.b)]
        _pack(m, exact.p, self.p)
        return m


class Fp32AddPartial(data.Struct):
    """What the alignment half of the adder hands to the rounding half."""
    sum: _ALIGNED + 1     # aligned significand sum; value = sum * 2**(exp-127-26)
    exp: 8                # effective exponent of the larger operand
    sign: 1               # sign of a non-zero result (of the larger operand, or the infinity)
    zero_sign: 1          # sign of an exact-zero sum (IEEE: -0 only for -0 + -0)
    nan: 1                # the result is the canonical NaN
    inf: 1                # the result is an infinity (of sign `sign`)


class FpAddOrdered(data.Struct):
    """What `FpAddOrder` hands to `FpAddShiftAdd`: the operands by magnitude and
    the alignment distance."""
    big_sig: 24
    small_sig: 24
    big_exp: 8
    shift: 5              # alignment distance, when it is below 32
    far: 1                # distance of 32 or more: the small operand is all sticky
    sub: 1                # effective subtraction
    sign: 1               # sign of a non-zero result (of the larger operand, or the infinity)
    zero_sign: 1
    nan: 1
    inf: 1


class FpAddOrder(wiring.Component):
    """First half of `FpAddAlign`: special cases, magnitude order and the
    alignment distance.

    Interface: ``x``, ``y``: In(FpUnpacked); ``ordered``: Out(FpAddOrdered).
    """

    x: In(FpUnpacked)
    y: In(FpUnpacked)
    ordered: Out(FpAddOrdered)

    def elaborate(self, platform):
        m = Module()
        x, y, out = self.x, self.y, self.ordered

        # Unpacked magnitudes order like the (exp, sig) pair. (Written as `<`:
        # Yosys maps `a > b` to a carry chain plus an equality tree, `b < a`
        # to the chain alone.)
        swap = Cat(x.sig, x.exp) < Cat(y.sig, y.exp)
        # The distance needs only the exponents (equal exponents: 0 either way),
        # so it is ready as soon as the significand comparison is.
        big_exp = Mux(swap, y.exp, x.exp)
        distance = Signal(8)
        m.d.comb += distance.eq(big_exp - Mux(swap, x.exp, y.exp))
        sub = x.sign ^ y.sign
        inf = x.inf | y.inf
        m.d.comb += [
            out.big_sig.eq(Mux(swap, y.sig, x.sig)),
            out.small_sig.eq(Mux(swap, x.sig, y.sig)),
            out.big_exp.eq(big_exp),
            # Distances of 27..31 shift everything out of the 5-bit shifter's
            # reach anyway; 32 and more are caught by the high bits (no comparator).
            out.far.eq(distance[5:] != 0),
            out.shift.eq(distance[:5]),
            out.sub.eq(sub),
            out.sign.eq(Mux(inf, Mux(x.inf, x.sign, y.sign), Mux(swap, y.sign, x.sign))),
            out.zero_sign.eq(x.sign & y.sign),
            out.nan.eq(x.nan | y.nan | (x.inf & y.inf & sub)),
            out.inf.eq(inf),
        ]
        return m


class FpAddShiftAdd(wiring.Component):
    """Second half of `FpAddAlign`: the alignment shift with its sticky bit and
    the one add or subtract.

    Interface: ``ordered``: In(FpAddOrdered); ``partial``: Out(Fp32AddPartial).
    """

    ordered: In(FpAddOrdered)
    partial: Out(Fp32AddPartial)

    def elaborate(self, platform):
        m = Module()
        o, out = self.ordered, self.partial
        shift, far = o.shift, o.far
        # Window: the small significand on top of GRS zeros, shifted right one
        # level at a time (a far operand is cleared in the first level's LUTs).
        # The sticky bit is the OR of what each level shifts out below the
        # window: 31 bits of OR trees, no mask per distance.
        window = Cat(C(0, _GRS), o.small_sig)
        lost = [far & (window != 0)]
        for k in reversed(range(len(shift))):
            n = 1 << k
            lost.append(shift[k] & (window[:n] != 0))
            level = Signal(_ALIGNED, name=f"align{n}")
            shifted = Mux(shift[k], window >> n, window)
            first = k == len(shift) - 1
            m.d.comb += level.eq(Mux(far, 0, shifted) if first else shifted)
            window = level
        sticky = Cat(*lost).any()
        aligned_small = Cat(window[0] | sticky, window[1:])
        aligned_big = Cat(C(0, _GRS), o.big_sig)

        # One carry chain for both: big + (small ^ -sub) + sub over 28 bits (the
        # carry bit included, so big - small >= 0 leaves it clear), the carry-in
        # entering through an extra low bit.
        small_ext = Cat(aligned_small, C(0, 1))
        addend = Mux(o.sub, ~small_ext, small_ext)
        total = Signal(_ALIGNED + 3)
        m.d.comb += total.eq(Cat(o.sub, aligned_big, C(0, 1)) + Cat(o.sub, addend))
        m.d.comb += [
            out.sum.eq(total[1:_ALIGNED + 2]),
            out.exp.eq(o.big_exp),
            out.sign.eq(o.sign),
            out.zero_sign.eq(o.zero_sign),
            out.nan.eq(o.nan),
            out.inf.eq(o.inf),
        ]
        return m


class FpAddAlign(wiring.Component):
    """First half of binary32 addition on unpacked operands: `FpAddOrder` (special
    cases, magnitude order, distance) then `FpAddShiftAdd` (alignment with a
    sticky bit, the significand add or subtract).

    The smaller operand's significand is shifted right into a 27-bit window (its
    24 bits and guard/round/sticky); the bits that fall off are OR-ed into the
    window's last bit. The sum of the window and the larger significand is exact
    whenever a normalising left shift of more than one bit follows (that needs a
    distance of at most one).

    Interface: ``x``, ``y``: In(FpUnpacked); ``partial``: Out(Fp32AddPartial).
    """

    x: In(FpUnpacked)
    y: In(FpUnpacked)
    partial: Out(Fp32AddPartial)

    def elaborate(self, platform):
        m = Module()
        m.submodules.order = order = FpAddOrder()
        m.submodules.shift_add = shift_add = FpAddShiftAdd()
        m.d.comb += [order.x.eq(self.x), order.y.eq(self.y),
                     shift_add.ordered.eq(order.ordered), self.partial.eq(shift_add.partial)]
        return m


class Fp32AddAlign(wiring.Component):
    """`FpAddAlign` on two FP32 operands.

    Interface: ``a``, ``b``: In(FP32); ``partial``: Out(Fp32AddPartial).
    """

    a: In(FP32)
    b: In(FP32)
    partial: Out(Fp32AddPartial)

    def elaborate(self, platform):
        m = Module()
        m.submodules.align = align = FpAddAlign()
        m.d.comb += [
            align.x.eq(unpack_fp32(m, self.a, "a_unpacked")),
            align.y.eq(unpack_fp32(m, self.b, "b_unpacked")),
            self.partial.eq(align.partial),
        ]
        return m


class Fp32AddNormPlan(data.Struct):
    """What `Fp32AddNormAmount` hands to `Fp32AddNormalize`: the sum and its
    normalising shift."""
    sum: _ALIGNED + 1
    shift: 5              # left shift: the leading-zero count, clamped by the exponent
    top: 1                # the shifted sum's top bit is set (a normal result)
    field: 8              # exponent field of a normal result, minus one
    zero: 1               # the sum is exactly zero
    sign: 1
    zero_sign: 1
    nan: 1
    inf: 1


class Fp32AddNormAmount(wiring.Component):
    """First half of `Fp32AddRound`: the normalising shift (see `Fp32AddRound`).

    Parameters
    ----------
    lzc : str
        The form of the leading-zero count, one of `LZC_FORMS` (see
        `leading_zeros`): ``"tree"`` for an adder whose whole path is one
        stage, ``"onehot"`` (cheaper to simulate) in a pipeline.

    Interface: ``partial``: In(Fp32AddPartial); ``plan``: Out(Fp32AddNormPlan).
    """

    partial: In(Fp32AddPartial)
    plan: Out(Fp32AddNormPlan)

    def __init__(self, lzc="tree"):
        if lzc not in LZC_FORMS:
            raise ValueError(f"lzc must be one of {LZC_FORMS}, not {lzc!r}")
        self.lzc = lzc
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p, plan = self.partial, self.plan
        width = _ALIGNED + 1
        lz = Signal(range(width + 1))
        m.d.comb += lz.eq(leading_zeros(p.sum, self.lzc, m))
        # One subtraction gives both the clamp and the exponent: exp - lz >= 0
        # is a shift by lz that leaves the top bit set (a normal result, field
        # exp + 1 - lz); below it the shift stops at exp (subnormal).
        diff = Signal(9)        # exp - lz; bit 8 is the borrow (exp < lz)
        m.d.comb += diff.eq(p.exp - lz)
        normal = ~diff[8]
        m.d.comb += [
            plan.sum.eq(p.sum),
            plan.shift.eq(Mux(normal, lz, p.exp)),
            plan.top.eq(normal & (lz != width)),
            plan.field.eq(diff[:8]),
            plan.zero.eq(lz == width),
            plan.sign.eq(p.sign),
            plan.zero_sign.eq(p.zero_sign),
            plan.nan.eq(p.nan),
            plan.inf.eq(p.inf),
        ]
        return m


class Fp32AddNormalize(wiring.Component):
    """Second half of `Fp32AddRound`: the shift, round to nearest-even, overflow
    and the special results.

    Interface: ``plan``: In(Fp32AddNormPlan); ``s``: Out(FP32).
    """

    plan: In(Fp32AddNormPlan)
    s: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        p = self.plan
        width = _ALIGNED + 1
        normed = Signal(width - 1)      # the top bit is p.top
        m.d.comb += normed.eq(p.sum << p.shift)
        lsb, guard = normed[_GRS + 1], normed[_GRS]
        sticky = normed[:_GRS] != 0
        # NaN and infinity (an operand, or a normal result with field 255)
        # replace the magnitude before the rounding add instead of after it:
        # the add's inputs absorb the choice, no output multiplexer.
        overflow = p.top & (p.field == 254)
        kill = p.nan | p.inf | overflow
        frac = Signal(23)
        m.d.comb += frac.eq(Mux(kill, Mux(p.nan, 1 << 22, 0), normed[_GRS + 1:]))
        # The field is carried as field - 1 and the add puts the one back; a
        # subnormal or zero result (top bit clear) has field 0 = 0xFF + 1.
        field = Signal(8)
        m.d.comb += field.eq(Mux(kill, 0xFE, Mux(p.top, p.field, 0xFF)))
        round_up = guard & (sticky | lsb) & ~kill
        magnitude = Signal(31)
        m.d.comb += magnitude.eq(Cat(frac, field) + (1 << 23) + round_up)
        # A zero sum gives magnitude 0 by itself; only its sign has a rule.
        sign = Mux(p.nan, 0, Mux(p.zero & ~p.inf, p.zero_sign, p.sign))
        m.d.comb += self.s.as_value().eq(Cat(magnitude, sign))
        return m


class Fp32AddRound(wiring.Component):
    """Second half of fp32 addition: normalisation (including gradual underflow),
    round to nearest-even, overflow to infinity, and the signed-zero rule --
    `Fp32AddNormAmount` then `Fp32AddNormalize`.

    One left shift normalises every case: the 28-bit sum (carry bit included) is
    shifted by its leading-zero count, but never further than the exponent field
    allows (then the result is subnormal); a carry-out is simply a shift of 0.

    Interface: ``partial``: In(Fp32AddPartial); ``s``: Out(FP32).
    """

    partial: In(Fp32AddPartial)
    s: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.amount = amount = Fp32AddNormAmount()
        m.submodules.normalize = normalize = Fp32AddNormalize()
        m.d.comb += [amount.partial.eq(self.partial), normalize.plan.eq(amount.plan),
                     self.s.eq(normalize.s)]
        return m


FP_STAGES = (1, 2, 3, 4, 5)


class _Stages:
    """Register boundaries of a pipelined fp32 unit: `cut(depth, *values)`
    puts a register (loaded while `en`) after each value when the unit has
    `depth` stages or more, and returns the values as the next stage sees
    them."""

    def __init__(self, m, stages, en):
        self.m, self.stages, self.en = m, stages, en

    def cut(self, depth, *values):
        if self.stages < depth:
            return values if len(values) > 1 else values[0]
        regs = []
        for k, value in enumerate(values):
            shape = value.shape() if isinstance(value, data.View) else Value.cast(value).shape()
            # No reset: a value is used only with its row's valid bit, which has
            # one (and 16k flip-flops on one reset net crowd the ECP5's routing).
            reg = Signal(shape, name=f"cut{depth}_{k}", reset_less=True)
            with self.m.If(self.en):
                self.m.d.sync += reg.eq(value)
            regs.append(reg)
        return regs if len(regs) > 1 else regs[0]


def _fp_unit_signature(result, stages):
    """Ports of a two-operand fp32 unit: ``a``, ``b``, the `result`, and
    ``en`` (advance the pipeline) when it has more than one stage."""
    if stages not in FP_STAGES:
        raise ValueError(f"fp32 unit stages must be one of {FP_STAGES}, not {stages!r}")
    members = {"a": In(FP32), "b": In(FP32), result: Out(FP32)}
    if stages > 1:
        members["en"] = In(1)
    return wiring.Signature(members)


class Fp32Adder(wiring.Component):
    """fp32 + fp32 -> fp32: `Fp32AddAlign` then `Fp32AddRound`, combinational
    with one stage, else pipelined.

    Parameters
    ----------
    stages : int
        1 to 5 (`FP_STAGES`): with 1, combinational. With more, ``stages - 1``
        register boundaries, loaded while ``en``, so that ``s`` is the sum of
        the operands ``stages - 1`` enabled cycles earlier (the caller adds the
        last register). The boundaries, as for the MAC (docs/vpu.md,
        "Pipeline depth"): 2, between alignment and rounding; 3, also between
        the magnitude order and the alignment shift; 4, also between the
        normalising shift's amount and the shift; 5, also at the inputs (the
        integer steps in front of the unit in a lane). Same bits at every depth.

    Interface: ``a``, ``b``: In(FP32); ``s``: Out(FP32); ``en``: In(1) when
    ``stages > 1``.
    """

    def __init__(self, stages=1):
        self.stages = stages
        super().__init__(_fp_unit_signature("s", stages))

    def elaborate(self, platform):
        m = Module()
        if self.stages == 1:
            m.submodules.align = align = Fp32AddAlign()
            m.submodules.round = rnd = Fp32AddRound()
            m.d.comb += [
                align.a.eq(self.a),
                align.b.eq(self.b),
                rnd.partial.eq(align.partial),
                self.s.eq(rnd.s),
            ]
            return m
        cut = _Stages(m, self.stages, self.en).cut
        m.submodules.order = order = FpAddOrder()
        m.submodules.shift_add = shift_add = FpAddShiftAdd()
        m.submodules.amount = amount = Fp32AddNormAmount()
        m.submodules.normalize = normalize = Fp32AddNormalize()
        a, b = cut(5, self.a, self.b)
        m.d.comb += [order.x.eq(unpack_fp32(m, a, "a_unpacked")),
                     order.y.eq(unpack_fp32(m, b, "b_unpacked"))]
        m.d.comb += shift_add.ordered.eq(cut(3, order.ordered))
        m.d.comb += amount.partial.eq(cut(2, shift_add.partial))
        m.d.comb += normalize.plan.eq(cut(4, amount.plan))
        m.d.comb += self.s.eq(normalize.s)
        return m


class Fp32Multiplier(wiring.Component):
    """fp32 x fp32 -> fp32, for the vector unit (the MAC's bf16 products need
    only `Bf16ExactMultiplier`); combinational with one stage, else pipelined.

    The 48-bit significand product ``P`` (value ``P * 2**(ea + eb - 300)``, with
    effective exponents) is normalised by ``amount = min(lz, ea + eb - 127)``: by
    its leading-zero count when the result is normal, or only as far as the
    2**-149 grid allows when it is subnormal (a negative amount, for results
    below the smallest normal, shifts right). The count sees the top 24 bits
    only: with one normal operand and a nonzero one ``P >= 2**23``. Both shifts
    are one window, the 25 bits of ``P`` from bit ``23 - amount`` up (the
    significand and the guard bit), and the sticky bit needs no shifted copy:
    the bits below the guard are nonzero exactly when ``P`` has fewer than ``23
    - amount`` trailing zeros, and ``P``'s trailing zeros are its factors'
    together, counted before the product. Then round to nearest-even on the
    packed magnitude (a carry moves into the exponent, and up to inf).

    With ``power_of_two=True``, `b` must be a power of two (a normal number
    whose fraction is zero): the significand product is then a shift, and no
    multiplier is built. The result is the same as the general unit's for such
    a `b`; any other `b` gives an unspecified result.

    Parameters
    ----------
    power_of_two : bool
    stages : int
        1 to 5 (`FP_STAGES`), as for `Fp32Adder`: ``stages - 1`` register
        boundaries loaded while ``en``. 2, after the significand product (the
        DSP blocks); 3, also before the rounding; 4, also between the
        normalising amount and the shifts; 5, also between the DSP blocks'
        four partial products and their sum. Same bits at every depth.

    Interface: ``a``, ``b``: In(FP32); ``p``: Out(FP32); ``en``: In(1) when
    ``stages > 1``.
    """

    # The bits the leading-zero count sees: with a normal operand and a
    # nonzero one the product is at least 2**23, 24 leading zeros at most.
    _TOP = 24
    # The MULT18X18D's width: the significands' low halves.
    _SPLIT = 18
    _SHIFTS = (0, _SPLIT, _SPLIT, 2 * _SPLIT)

    def __init__(self, *, power_of_two=False, stages=1):
        self.power_of_two = power_of_two
        self.stages = stages
        super().__init__(_fp_unit_signature("p", stages))

    def _partial_products(self, m, sig_a, sig_b):
        """The significand product as terms that `_SHIFTS` place: one term
        with ``power_of_two`` (the shift) or below depth 5, else the four
        products of the 18-bit low and 6-bit high halves, one MULT18X18D
        each, so that the depth-5 register goes between the DSP blocks and
        their sum (docs/vpu.md, "Pipeline depth")."""
        if self.power_of_two:
            return [sig_a << 23]
        if self.stages < 5:
            return [sig_a * sig_b]
        lo, hi = self._SPLIT, 24 - self._SPLIT
        parts = [Signal(2 * lo, name="pp_ll"), Signal(lo + hi, name="pp_lh"),
                 Signal(lo + hi, name="pp_hl"), Signal(2 * hi, name="pp_hh")]
        a_lo, a_hi = sig_a[:lo], sig_a[lo:]
        b_lo, b_hi = sig_b[:lo], sig_b[lo:]
        m.d.comb += [parts[0].eq(a_lo * b_lo), parts[1].eq(a_lo * b_hi),
                     parts[2].eq(a_hi * b_lo), parts[3].eq(a_hi * b_hi)]
        return parts

    def elaborate(self, platform):
        m = Module()
        cut = _Stages(m, self.stages, self.en if self.stages > 1 else None).cut
        a, b = self.a, self.b
        a_nan, a_inf, a_zero = _classify(a, 23)
        b_nan, b_inf, b_zero = _classify(b, 23)
        sig_a, exp_a = _significand(a)
        sig_b, exp_b = _significand(b)
        exp_sum = Signal(10)
        m.d.comb += exp_sum.eq(exp_a + exp_b)
        nan = Signal()
        inf = Signal()
        sign = Signal()
        if self.power_of_two:
            b_nan = b_inf = b_zero = C(0, 1)
        m.d.comb += [nan.eq(a_nan | b_nan | (a_inf & b_zero) | (a_zero & b_inf)),
                     inf.eq(a_inf | b_inf), sign.eq(a.sign ^ b.sign)]
        # The product's trailing zeros are its factors' together; 64 (bit 6)
        # when it is zero.
        tz = Signal(7)
        tz_b = C(23) if self.power_of_two else _trailing_zeros(sig_b)
        m.d.comb += tz.eq(Mux(a_zero | b_zero, 64, _trailing_zeros(sig_a) + tz_b))
        parts = self._partial_products(m, sig_a, sig_b)
        *parts, exp_sum, tz, nan, inf, sign = cut(5, *parts, exp_sum, tz, nan, inf, sign)
        product = Signal(48)
        m.d.comb += product.eq(sum(part << shift for part, shift in zip(parts, self._SHIFTS)))
        product, exp_sum, tz, nan, inf, sign = cut(2, product, exp_sum, tz, nan, inf, sign)

        # The leading zeros of the top `_TOP` bits only: more means both
        # operands are subnormal (then the grid, far below, is the amount) or
        # one is zero (then the result is zero at any amount). One expression,
        # not named steps: with them the multiplier mapped to 25.0 MHz on the
        # ECP5 (docs/synth.md).
        lz = Signal(range(self._TOP + 1))
        m.d.comb += lz.eq(leading_zeros(product[48 - self._TOP:]))
        grid = Signal(signed(11))
        m.d.comb += grid.eq(exp_sum - 127)
        amount = Signal(signed(11))
        m.d.comb += amount.eq(Mux(grid < lz, grid, lz))
        product, exp_sum, amount, tz, nan, inf, sign = cut(4, product, exp_sum, amount, tz,
                                                           nan, inf, sign)

        # The normalised product's bit j is the product's bit j - amount: `sig`
        # and the guard bit are one window of the product (a right shift when
        # amount < 0, a left one when it is above), and the bits below the guard
        # are nonzero exactly when the product has fewer trailing zeros than
        # the guard's place, 23 - amount.
        start = Signal(range(64))
        m.d.comb += start.eq(Mux(amount < self._TOP - 63, 63, self._TOP - amount))
        top = Signal(25)
        m.d.comb += top.eq(Cat(C(0, self._TOP - 23), product) >> start)
        sig = Signal(24)
        guard = Signal()
        sticky = Signal()
        m.d.comb += [sig.eq(top[1:]), guard.eq(top[0]),
                     sticky.eq(~tz[-1] & (tz + amount < 23))]
        # Bit 23 of `sig` has the biased exponent exp_sum - 126 - amount.
        biased = Signal(signed(12))
        m.d.comb += biased.eq(exp_sum - 126 - amount)
        sig, guard, sticky, biased, nan, inf, sign = cut(3, sig, guard, sticky, biased,
                                                         nan, inf, sign)

        round_up = guard & (sticky | sig[0])
        field = Signal(signed(12))
        m.d.comb += field.eq(Mux(sig[23], biased, 0))
        magnitude = Signal(32)
        m.d.comb += magnitude.eq(Cat(sig[:23], field[:8]) + round_up)
        with m.If(nan):
            m.d.comb += self.p.as_value().eq(FP32_QNAN)
        with m.Elif(inf | (field >= 255)):
            m.d.comb += self.p.as_value().eq(Cat(C(0x7F800000, 31), sign))
        with m.Else():
            m.d.comb += self.p.as_value().eq(Cat(magnitude[:31], sign))
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
