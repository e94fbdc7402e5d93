"""The weight expander: tile-blocks of GGUF block-quantized weights, as bus
beats, in; bf16 weight rows out (docs/numerics.md, "Quantized weights";
docs/memory.md, "Quantized loads").

Every weight is ``bf16_rne(fp32_add(fp32_mul(s, q), t))`` with per-(sub-)block
fp32 scalars ``s = fp32(d) * sc`` and ``t`` (``-0``, ``fp32(m)`` or
``-(fp32(dmin) * m_j)``) and an integer code ``q``, the order of the golden
model `mxu.verif.quant`. The datapath reuses the four parts of `Fp32Adder`
(`FpAddOrder`, `FpAddShiftAdd`, `Fp32AddNormAmount`, `Fp32AddNormalize`) and
`Fp32ToBf16` of `mxu.hdl.numerics`.
"""

import functools
import operator

from amaranth.hdl import C, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .numerics import (FP32, FP32_QNAN, Fp32AddNormalize, Fp32AddNormAmount, Fp32AddNormPlan,
                       Fp32AddPartial, Fp32ToBf16, FpAddOrder, FpAddOrdered, FpAddShiftAdd,
                       leading_zeros, unpack_fp32)
from .quant import QUANT_INFO, QuantFormat

__all__ = ["Fp16ToFp32", "scale_product_layout", "ScaleMultiply", "ScaleRound", "ScaleMultiplier",
           "Expander", "expander_rows_layout"]


class Fp16ToFp32(wiring.Component):
    """fp16 -> fp32, exact (every fp16 is an fp32; subnormals become normals).

    Interface: ``x``: In(16) (fp16 bits); ``y``: Out(FP32).
    """

    x: In(16)
    y: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        x = self.x
        sign, exp, frac = x[15], x[10:15], x[:10]
        lz = Signal(range(11))
        m.d.comb += lz.eq(leading_zeros(frac, "onehot", m))
        # A subnormal frac * 2**-24 with its leading one at bit 9 - lz: the
        # exponent field 127 - 15 - lz, the frac shifted up past the leading one.
        sub_frac = Signal(10)
        m.d.comb += sub_frac.eq(frac << (lz + 1))
        with m.If(exp == 0x1F):
            m.d.comb += self.y.as_value().eq(Cat(C(0, 13), frac, C(0xFF, 8), sign))
        with m.Elif(exp != 0):
            m.d.comb += self.y.as_value().eq(Cat(C(0, 13), frac, exp + (127 - 15), sign))
        with m.Elif(frac != 0):
            m.d.comb += self.y.as_value().eq(
                Cat(C(0, 13), sub_frac, (C(127 - 15, 8) - lz)[:8], sign))
        with m.Else():
            m.d.comb += self.y.as_value().eq(Cat(C(0, 31), sign))
        return m


# Integers the datapath carries: a code minus its offset (-128..127), a
# sub-block scale (Q6_K: -128..127, Q4_K: 0..63).
_INT = 9


def scale_product_layout(width=_INT):
    """What `ScaleMultiply` hands to `ScaleRound`: the exact significand
    product of ``|a| * |n|`` (``24 + width`` bits), ``a``'s exponent field, the
    result's sign, and the special cases."""
    return data.StructLayout({"product": 24 + width, "exp": 8, "sign": 1,
                              "nan": 1, "inf": 1, "zero": 1})


class ScaleMultiply(wiring.Component):
    """First half of `ScaleMultiplier`: the special cases and the integer
    product of the significand and ``|n|`` (a DSP on an FPGA).

    Interface: ``a``: In(FP32); ``n``: In(signed(width));
    ``x``: Out(scale_product_layout(width)).
    """

    def __init__(self, width=None):
        self.width = width = width or _INT
        super().__init__({"a": In(FP32), "n": In(signed(width)),
                          "x": Out(scale_product_layout(width))})

    def elaborate(self, platform):
        m = Module()
        a, n, x = self.a, self.n, self.x
        exp_max = a.exp == 0xFF
        a_nan, a_inf = exp_max & (a.frac != 0), exp_max & (a.frac == 0)
        mag = Signal(self.width)
        m.d.comb += [
            mag.eq(Mux(n < 0, -n, n)),
            x.product.eq(Cat(a.frac, a.exp != 0) * mag),
            x.exp.eq(a.exp), x.sign.eq(a.sign ^ (n < 0)),
            x.nan.eq(a_nan | (a_inf & (n == 0))), x.inf.eq(a_inf),
            x.zero.eq(((a.exp == 0) & (a.frac == 0)) | (n == 0)),
        ]
        return m


class ScaleRound(wiring.Component):
    """Second half of `ScaleMultiplier`: normalise the product and round it
    to nearest-even (see `ScaleMultiplier` for why no subnormal path).

    Under `ScaleMultiplier`'s precondition a nonzero product's leading one is
    at bit ``23 + r`` with ``r`` in ``0..width`` (a significand of 24 bits
    with its top bit set, times ``1 <= |n| < 2**width``): the normalisation is
    a choice among those ``width + 1`` places, not a leading-zero count and a
    shift over the whole product, so that the stage fits the fpga chip's
    clock (docs/synth.md, "The weight expander on the `fpga` chip").

    Interface: ``x``: In(scale_product_layout(width)); ``p``: Out(FP32).
    """

    def __init__(self, width=None):
        self.width = width = width or _INT
        super().__init__({"x": In(scale_product_layout(width)), "p": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        x, W = self.x, self.width
        product = x.product
        # `top[r]`: the leading one is at bit 23 + r.
        top = Signal(W + 1)
        m.d.comb += top.eq(Cat(*(product[23 + r] & (product[24 + r:] == 0)
                                 for r in range(W + 1))))
        # For each place, the significand, the guard bit and the sticky bits
        # below it; the place's word is chosen by AND-OR on the one-hot `top`.
        sig, guard, sticky, shift = Signal(24), Signal(), Signal(), Signal(range(W + 1))
        m.d.comb += [
            sig.eq(_select(top, [product[r:r + 24] for r in range(W + 1)])),
            guard.eq(_select(top, [product[r - 1] if r else C(0) for r in range(W + 1)])),
            sticky.eq(_select(top, [product[:r - 1] != 0 if r > 1 else C(0)
                                    for r in range(W + 1)])),
            shift.eq(_select(top, [C(r, len(shift)) for r in range(W + 1)])),
        ]
        round_up = guard & (sticky | sig[0])
        # The leading one at bit 23 + r of the product, of weight
        # 2**(exp - 150): the biased exponent is exp + r.
        field = Signal(9)
        m.d.comb += field.eq(x.exp + shift)
        magnitude = Signal(32)
        m.d.comb += magnitude.eq(Cat(sig[:23], field[:8]) + round_up)
        with m.If(x.nan):
            m.d.comb += self.p.as_value().eq(FP32_QNAN)
        with m.Elif(x.inf):
            m.d.comb += self.p.as_value().eq(Cat(C(0x7F800000, 31), x.sign))
        with m.Elif(x.zero):
            m.d.comb += self.p.as_value().eq(Cat(C(0, 31), x.sign))
        with m.Else():
            m.d.comb += self.p.as_value().eq(Cat(magnitude[:31], x.sign))
        return m


def _select(onehot, words):
    """``words[i]`` where ``onehot[i]`` is set (zero if none): an AND-OR."""
    width = max(len(Value.cast(w)) for w in words)
    terms = [Mux(onehot[i], w, C(0, width)) for i, w in enumerate(words)]
    return functools.reduce(operator.or_, terms)


class ScaleMultiplier(wiring.Component):
    """fp32 x a signed integer -> fp32, round to nearest-even: the expander's
    products ``fp32(d) * sc``, ``fp32(dmin) * m`` and ``s * q``.

    Precondition (why this is not `Fp32Multiplier`, whose general
    subnormal path is ten times the logic): `a` is a zero, an infinity, a
    NaN, or a normal number whose products with the integers stay normal.
    The expander's operands are fp16 values (at least 2**-24 in magnitude
    unless zero) times at most two integers of 8 bits (below 2**31): their
    products are normal fp32 numbers, and a product can round only when its
    significand passes 24 bits (Q6_K's ``s * q``).

    Interface: ``a``: In(FP32); ``n``: In(signed(width)); ``p``: Out(FP32).
    """

    def __init__(self, width=_INT):
        self.width = width
        super().__init__({"a": In(FP32), "n": In(signed(width)), "p": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.multiply = mul = ScaleMultiply(self.width)
        m.submodules.round = rnd = ScaleRound(self.width)
        m.d.comb += [mul.a.eq(self.a), mul.n.eq(self.n), rnd.x.eq(mul.x), self.p.eq(rnd.p)]
        return m


def expander_rows_layout(config):
    """The expander's output: ``quant_rows`` weight rows of ``cols`` bf16."""
    return data.ArrayLayout(data.ArrayLayout(16, config.cols), config.quant_rows)


class Expander(wiring.Component):
    """Tile-blocks in, bf16 weight rows out, one group of ``quant_rows`` rows
    (all of one sub-block) per cycle at most: for 4-bit codes on the default
    chip, one beat a cycle in, two rows a cycle out.

    A tile-block (docs/memory.md) is ``cols`` headers (whole beats), then the
    block's codes as a bitstream (whole beats): ``block`` rows of ``cols``
    codes, row-major. The beats go into the header words or into a gearbox
    from which groups of rows are taken; each group captures its columns'
    scale fields, so the next header may arrive while it is in flight.

    Pipeline (a global stall: every stage moves when the output is free),
    `LATENCY` registers, the output the last: take a group and its scale
    fields -> ``fp32(d)`` (and ``fp32(m)`` or ``fp32(dmin)``) -> the products
    ``fp32(d) * sc`` (and ``fp32(dmin) * m``) -> their
    rounding, ``s`` and ``t`` -> the products ``s * q`` -> their rounding,
    ``p`` -> for ``p + t``: order and distance -> alignment and add ->
    normalising amount -> normalisation and fp32 rounding, then bf16
    rounding. Each product is split in two (`ScaleMultiply`, `ScaleRound`)
    and the add in four, as the PE's at ``mac_stages`` 7 (docs/synth.md), so
    that the expander closes above the fpga chip's 50 MHz.

    Parameters
    ----------
    config : ChipConfig
        ``cols``, ``axi_data_bits``, ``quant_rows`` and ``quant_formats`` (the
        formats built; at least one).

    Interface
    ---------
    format : In(QuantFormat)
        The format of the beat offered on ``beats`` (of its tile-block).
        The expander keeps a block's format, taken with its last header
        beat, for the block's rows: blocks of another format (the next
        load's) may follow at once.
    clear : In(1)
        Drop every beat and row in flight (between loads).
    beats : In(stream.Signature(axi_data_bits))
        The tile-blocks, beat by beat.
    rows : Out(stream.Signature(expander_rows_layout(config)))
        The weight rows, ``quant_rows`` at a time, in order.
    """

    def __init__(self, config):
        if not config.quant_formats:
            self._MustUse__silence = True
            raise ValueError("Expander: the chip's quant_formats is empty")
        self.config = config
        self.formats = [QuantFormat[n] for n in config.quant_formats]
        super().__init__({
            "format": In(QuantFormat), "clear": In(1),
            "beats": In(stream.Signature(config.axi_data_bits)),
            "rows": Out(stream.Signature(expander_rows_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        R, N, BW = c.quant_rows, c.cols, c.axi_data_bits
        BB = BW // 8
        infos = {f: QUANT_INFO[f] for f in self.formats}
        hdr_words = max(-(-N * i.header_bytes // BB) for i in infos.values())
        max_group = max(R * N * i.bits for i in infos.values())
        cap = max_group + BW
        # The format of the beat offered, and that of the block whose codes
        # are in (taken with its last header beat): the next block, of the
        # next load, may be of another format.
        fmt, bfmt = self.format, Signal(QuantFormat)

        def per_format(fn, width, fmt):
            """A value chosen by the format among the formats built."""
            out = Signal(width, name=None)
            with m.Switch(fmt):
                for f, i in infos.items():
                    with m.Case(f):
                        m.d.comb += out.eq(fn(f, i))
            return out

        hdr_beats = per_format(lambda f, i: N * i.header_bytes // BB, range(hdr_words + 1), fmt)
        code_beats = per_format(lambda f, i: N * i.code_bytes // BB, 16, fmt)
        block = per_format(lambda f, i: i.block, 10, bfmt)
        group_bits = per_format(lambda f, i: R * N * i.bits, range(cap + 1), bfmt)

        header = Signal(hdr_words * BW)
        codes = Signal(cap)                 # the gearbox: bits from bit 0 up
        have = Signal(range(cap + 1))       # bits in it
        in_codes = Signal()                 # the block's header is in
        hdr_i = Signal(range(hdr_words + 1))
        code_left = Signal(16)              # code beats of the block still to take
        k = Signal(10)                      # the block's next row

        # The pipeline registers' valid bits; every stage moves on `adv`.
        v = [Signal(name=f"v{i}") for i in range(self.LATENCY)]
        adv = Signal()
        m.d.comb += [adv.eq(~self.rows.valid | self.rows.ready), self.rows.valid.eq(v[-1])]

        emit = Signal()
        last_group = Signal()
        m.d.comb += [emit.eq(adv & in_codes & (have >= group_bits)),
                     last_group.eq(k + R >= block)]
        after = Signal(range(cap + 1))
        m.d.comb += after.eq(Mux(emit, have - group_bits, have))
        take_header = ~in_codes | (emit & last_group)
        take_code = in_codes & (code_left != 0) & (after + BW <= cap)
        m.d.comb += self.beats.ready.eq(take_header | take_code)
        fire = self.beats.valid & self.beats.ready
        shifted = Signal(cap)
        m.d.comb += shifted.eq(Mux(emit, codes >> group_bits, codes))
        with m.If(fire & take_code):
            m.d.sync += [codes.eq(shifted | (self.beats.payload << after)),
                         have.eq(after + BW), code_left.eq(code_left - 1)]
        with m.Else():
            m.d.sync += [codes.eq(shifted), have.eq(after)]
        with m.If(emit):
            m.d.sync += k.eq(k + R)
            with m.If(last_group):
                m.d.sync += [in_codes.eq(0), hdr_i.eq(0)]
        with m.If(fire & take_header):
            index = Mux(in_codes, 0, hdr_i)
            with m.Switch(index):
                for w in range(hdr_words):
                    with m.Case(w):
                        m.d.sync += header[w * BW:(w + 1) * BW].eq(self.beats.payload)
            with m.If(index + 1 == hdr_beats):
                m.d.sync += [in_codes.eq(1), k.eq(0), code_left.eq(code_beats), bfmt.eq(fmt)]
            with m.Else():
                m.d.sync += [hdr_i.eq(index + 1), in_codes.eq(0)]

        value = self._take_group(m, infos, header, codes, k, bfmt)
        moves = []
        for stage in self._STAGES:
            reg = Signal.like(value, name=f"in{stage.__name__}")    # e.g. in_widen
            moves.append(reg.eq(value))
            value = stage(self, m, reg)
        with m.If(adv):
            m.d.sync += [*moves, self.rows.payload.eq(value), v[0].eq(emit),
                         *(v[i + 1].eq(v[i]) for i in range(len(v) - 1))]
        with m.If(self.clear):
            m.d.sync += [have.eq(0), in_codes.eq(0), hdr_i.eq(0), code_left.eq(0), k.eq(0),
                         *(x.eq(0) for x in v)]
        return m

    # Stage 1: the group's codes and its columns' scale fields.
    def _take_group(self, m, infos, header, codes, k, fmt):
        c = self.config
        R, N = c.quant_rows, c.cols
        col = data.StructLayout({"d": 16, "e": 16, "sc": signed(_INT), "mm": 6, "tsel": 2})
        layout = data.StructLayout({"cols": data.ArrayLayout(col, N),
                                    "q": data.ArrayLayout(signed(_INT), R * N)})
        out = Signal(layout)
        with m.Switch(fmt):
            for f, i in infos.items():
                with m.Case(f):
                    self._fields(m, f, i, header, codes, k, out)
        return out

    def _fields(self, m, f, info, header, codes, k, out):
        c = self.config
        R, N, H = c.quant_rows, c.cols, info.header_bytes
        for r in range(R * N):
            code = codes[r * info.bits:(r + 1) * info.bits]
            if info.offset is None:
                q = code.as_signed()
            else:
                q = code.as_unsigned() - info.offset
            m.d.comb += out.q[r].eq(q)
        j = k[5:8] if f is QuantFormat.Q4_K else k[4:8]
        for n in range(N):
            base = 8 * n * H
            o = out.cols[n]
            m.d.comb += [o.d.eq(header[base:base + 16]), o.sc.eq(1), o.tsel.eq(0)]
            if f is QuantFormat.Q4_1:
                m.d.comb += [o.e.eq(header[base + 16:base + 32]), o.tsel.eq(1)]
            elif f is QuantFormat.Q4_K:
                fields = header[base + 32:base + 128]
                m.d.comb += [o.e.eq(header[base + 16:base + 32]), o.tsel.eq(2),
                             o.sc.eq(fields.word_select(j, 6)),
                             o.mm.eq(fields.word_select(j + 8, 6))]
            elif f is QuantFormat.Q6_K:
                m.d.comb += o.sc.eq(header[base + 16:base + 144].word_select(j, 8).as_signed())

    # Stage 2: fp32(d) and fp32(e) (exact).
    def _widen(self, m, s1):
        c = self.config
        R, N = c.quant_rows, c.cols
        col = data.StructLayout({"d": FP32, "e": FP32, "sc": signed(_INT), "mm": 6, "tsel": 2})
        out = Signal(data.StructLayout({"cols": data.ArrayLayout(col, N),
                                        "q": data.ArrayLayout(signed(_INT), R * N)}))
        for n in range(N):
            i, o = s1.cols[n], out.cols[n]
            m.submodules[f"d{n}"] = d = Fp16ToFp32()
            m.submodules[f"e{n}"] = e = Fp16ToFp32()
            m.d.comb += [d.x.eq(i.d), e.x.eq(i.e), o.d.eq(d.y), o.e.eq(e.y),
                         o.sc.eq(i.sc), o.mm.eq(i.mm), o.tsel.eq(i.tsel)]
        m.d.comb += out.q.eq(s1.q)
        return out

    # Stage 3: the products d * sc and e * mm.
    def _scale_products(self, m, s2):
        c = self.config
        R, N = c.quant_rows, c.cols
        layout = data.StructLayout({
            "s": data.ArrayLayout(scale_product_layout(), N),
            "tm": data.ArrayLayout(scale_product_layout(), N),
            "e": data.ArrayLayout(FP32, N), "tsel": data.ArrayLayout(2, N),
            "q": data.ArrayLayout(signed(_INT), R * N)})
        out = Signal(layout)
        for n in range(N):
            col = s2.cols[n]
            m.submodules[f"s{n}"] = s = ScaleMultiply()
            m.submodules[f"tm{n}"] = tm = ScaleMultiply()
            m.d.comb += [s.a.eq(col.d), s.n.eq(col.sc), tm.a.eq(col.e), tm.n.eq(col.mm),
                         out.s[n].eq(s.x), out.tm[n].eq(tm.x), out.e[n].eq(col.e),
                         out.tsel[n].eq(col.tsel)]
        m.d.comb += out.q.eq(s2.q)
        return out

    # Stage 4: s = fp32(d) * sc, and t.
    def _scalars(self, m, s2):
        c = self.config
        R, N = c.quant_rows, c.cols
        layout = data.StructLayout({"s": data.ArrayLayout(FP32, N), "t": data.ArrayLayout(FP32, N),
                                    "q": data.ArrayLayout(signed(_INT), R * N)})
        out = Signal(layout)
        for n in range(N):
            m.submodules[f"sr{n}"] = s = ScaleRound()
            m.submodules[f"tr{n}"] = tm = ScaleRound()
            m.d.comb += [s.x.eq(s2.s[n]), tm.x.eq(s2.tm[n]), out.s[n].eq(s.p)]
            with m.Switch(s2.tsel[n]):
                with m.Case(0):
                    m.d.comb += out.t[n].as_value().eq(0x80000000)     # -0: x + -0 == x
                with m.Case(1):
                    m.d.comb += out.t[n].eq(s2.e[n])
                with m.Default():
                    m.d.comb += out.t[n].as_value().eq(tm.p.as_value() ^ 0x80000000)
        m.d.comb += out.q.eq(s2.q)
        return out

    # Stage 5: the products s * q, unrounded.
    def _code_products(self, m, s3):
        c = self.config
        R, N = c.quant_rows, c.cols
        layout = data.StructLayout({"x": data.ArrayLayout(scale_product_layout(), R * N),
                                    "t": data.ArrayLayout(FP32, N)})
        out = Signal(layout)
        m.d.comb += out.t.eq(s3.t)
        for r in range(R * N):
            m.submodules[f"p{r}"] = p = ScaleMultiply()
            m.d.comb += [p.a.eq(s3.s[r % N]), p.n.eq(s3.q[r]), out.x[r].eq(p.x)]
        return out

    # Stage 6: p = s * q.
    def _products(self, m, s4):
        c = self.config
        R, N = c.quant_rows, c.cols
        layout = data.StructLayout({"p": data.ArrayLayout(FP32, R * N),
                                    "t": data.ArrayLayout(FP32, N)})
        out = Signal(layout)
        m.d.comb += out.t.eq(s4.t)
        for r in range(R * N):
            m.submodules[f"pr{r}"] = p = ScaleRound()
            m.d.comb += [p.x.eq(s4.x[r]), out.p[r].eq(p.p)]
        return out

    # Stage 7: p + t: the special cases, magnitude order, alignment distance.
    def _order(self, m, s5):
        c = self.config
        R, N = c.quant_rows, c.cols
        out = Signal(data.ArrayLayout(FpAddOrdered, R * N))
        for r in range(R * N):
            m.submodules[f"o{r}"] = o = FpAddOrder()
            m.d.comb += [o.x.eq(unpack_fp32(m, s5.p[r], f"p{r}_unpacked")),
                         o.y.eq(unpack_fp32(m, s5.t[r % N], f"t{r}_unpacked")),
                         out[r].eq(o.ordered)]
        return out

    # Stage 8: the alignment shift and the add.
    def _shift_add(self, m, s6):
        c = self.config
        out = Signal(data.ArrayLayout(Fp32AddPartial, c.quant_rows * c.cols))
        for r in range(len(out)):
            m.submodules[f"sa{r}"] = sa = FpAddShiftAdd()
            m.d.comb += [sa.ordered.eq(s6[r]), out[r].eq(sa.partial)]
        return out

    # Stage 9: the normalising shift amount.
    def _norm_amount(self, m, s7):
        c = self.config
        out = Signal(data.ArrayLayout(Fp32AddNormPlan, c.quant_rows * c.cols))
        for r in range(len(out)):
            m.submodules[f"na{r}"] = na = Fp32AddNormAmount("onehot")
            m.d.comb += [na.partial.eq(s7[r]), out[r].eq(na.plan)]
        return out

    # Stage 10: the shift and fp32 rounding, then bf16(p + t).
    def _sums(self, m, s8):
        c = self.config
        R, N = c.quant_rows, c.cols
        out = Signal(expander_rows_layout(c))
        for r in range(R * N):
            m.submodules[f"x{r}"] = x = Fp32AddNormalize()
            m.submodules[f"b{r}"] = b = Fp32ToBf16()
            m.d.comb += [x.plan.eq(s8[r]), b.x.eq(x.s),
                         out[r // N][r % N].eq(b.y.as_value())]
        return out

    # The stages after the first, in order; a register before each and after the last.
    _STAGES = (_widen, _scale_products, _scalars, _code_products, _products, _order, _shift_add,
               _norm_amount, _sums)
    LATENCY = len(_STAGES) + 1
