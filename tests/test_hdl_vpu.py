"""The vector unit's numerics (docs/vpu.md): the golden sequences of
`mxu.hdl.vecmath` against IEEE facts and float64 references, and the RTL
`Fp32Multiplier` and `VectorLane` bit-exact against the golden model."""

import numpy as np
import pytest

from mxu.hdl.config import ChipConfig
from mxu.hdl.numerics import FP_STAGES
from mxu.hdl.vpu import VectorAlu, VpuOp, alu_latency, lane_latency
from mxu.sim.backends.units import (simulate_fp32_add, simulate_fp32_mul, simulate_vector_alu,
                                    simulate_vpu_lane)
from mxu.verif import vpu as gold
from mxu.verif.golden import f32_bits

SPECIALS = np.array([
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
    0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x7F7FFFFF,
    0xFF7FFFFF, 0x00400000, 0x3F000000, 0x40000000,
], np.uint32)

FUNCTIONS = {
    "exp": (gold.vpu_exp, np.exp),
    "reciprocal": (gold.vpu_reciprocal, lambda v: 1 / v),
    "rsqrt": (gold.vpu_rsqrt, lambda v: 1 / np.sqrt(v)),
}

# Measured on every 97th fp32 pattern (bench/vpu.py): the sequences are not
# correctly rounded, and these are their documented worst cases.
MAX_ULP = {"exp": 1.19, "reciprocal": 1.15, "rsqrt": 1.03}


def f(values):
    return np.asarray(values, np.float32).view(np.uint32)


def every_exponent(rng, per_exponent=64):
    """Both signs, every exponent field, random and edge mantissas."""
    fields = np.repeat(np.arange(256, dtype=np.uint32), per_exponent)
    mant = rng.integers(0, 1 << 23, fields.size, dtype=np.uint32)
    mant[::per_exponent] = 0
    mant[1::per_exponent] = 0x7FFFFF
    bits = (fields << 23) | mant
    return np.concatenate([bits, bits | 0x80000000, SPECIALS]).astype(np.uint32)


def ulp_error(got_bits, reference):
    got = got_bits.view(np.float32).astype(np.float64)
    ulp = np.maximum(np.spacing(np.abs(reference.astype(np.float32))).astype(np.float64), 2.0 ** -149)
    return np.abs(got - reference) / ulp


# --- golden model --------------------------------------------------------------------


def test_exp_ieee_facts():
    x = f([0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.8, -104.0, -200.0])
    expected = f([1.0, 1.0, np.inf, 0.0, np.nan, np.inf, np.inf, 0.0, 0.0])
    np.testing.assert_array_equal(gold.vpu_exp(x), f32_bits(expected.view(np.float32)))


def test_reciprocal_ieee_facts():
    k = np.arange(-126, 127)
    x = np.concatenate([f(np.ldexp(1.0, k)), f(-np.ldexp(1.0, k)),
                        f([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45])])
    expected = np.concatenate([f(np.ldexp(1.0, -k)), f(-np.ldexp(1.0, -k)),
                               f([np.inf, -np.inf, 0.0, -0.0, np.nan, np.inf])])
    np.testing.assert_array_equal(gold.vpu_reciprocal(x), f32_bits(expected.view(np.float32)))


def test_rsqrt_ieee_facts():
    k = np.arange(-74, 64)
    x = np.concatenate([f(np.ldexp(1.0, 2 * k)), f([0.0, -0.0, np.inf, -np.inf, -1.0, -1e-45,
                                                      np.nan])])
    expected = np.concatenate([f(np.ldexp(1.0, -k)), f([np.inf, -np.inf, 0.0, np.nan, np.nan,
                                                         np.nan, np.nan])])
    np.testing.assert_array_equal(gold.vpu_rsqrt(x), f32_bits(expected.view(np.float32)))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_accuracy_dense_sweep(name):
    func, reference = FUNCTIONS[name]
    x = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    with np.errstate(all="ignore"):
        ref = reference(x.view(np.float32).astype(np.float64))
    got = func(x)
    finite = np.isfinite(ref) & np.isfinite(x.view(np.float32)) & (np.abs(ref) <= 3.4028234e38)
    if name == "exp":
        finite &= ref > 2.0 ** -126     # below: subnormal results, compared below
    assert ulp_error(got[finite], ref[finite]).max() <= MAX_ULP[name]
    # Outside the finite range every result is what IEEE rounding gives.
    over = np.isfinite(ref) & (np.abs(ref) > 3.4028235e38)
    assert np.all(got[over] & 0x7FFFFFFF == 0x7F800000)


def test_exp_subnormal_results_within_one_quantum():
    x = f(np.linspace(-103.9, -87.4, 20001))
    ref = np.exp(x.view(np.float32).astype(np.float64))
    got = gold.vpu_exp(x).view(np.float32).astype(np.float64)
    assert np.abs(got - ref).max() <= 2.0 ** -149


def test_min_max_rules():
    a = f([0.0, -0.0, 1.0, np.nan, -np.inf, 3.0])
    b = f([-0.0, 0.0, np.nan, 1.0, -5.0, 2.0])
    np.testing.assert_array_equal(gold.fmax(a, b), f32_bits(np.float32([0, 0, np.nan, np.nan,
                                                                          -5, 3])))
    np.testing.assert_array_equal(gold.fmin(a, b), f32_bits(np.float32([-0.0, -0.0, np.nan,
                                                                          np.nan, -np.inf, 2])))


def test_clz_matches_bit_length():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(0, 1 << 32, 1000, dtype=np.uint64).astype(np.uint32),
                        (np.uint32(1) << np.arange(32, dtype=np.uint32)), np.uint32([0])])
    expected = [32 - int(v).bit_length() for v in x]
    np.testing.assert_array_equal(gold.NumpyOps.clz(x), expected)


def test_golden_rejects_non_bits():
    with pytest.raises(TypeError, match="uint32"):
        gold.vpu_exp(np.float32([1.0]))


# --- RTL -----------------------------------------------------------------------------


# The lanes' depths the RTL lane and ALU tests run: one-stage units (the
# vpu and llm presets) and the fpga-llm preset's (docs/vpu.md, "Pipeline depth").
LANE_STAGES = sorted({1, ChipConfig.preset("fpga-llm").vpu_stages})


@pytest.mark.parametrize("stages", FP_STAGES)
def test_rtl_fp32_adder_every_depth(stages):
    """The lanes' fp32 adder at every pipeline depth: the same bits (random
    words, operands a few exponents apart, every pair of specials)."""
    rng = np.random.default_rng(10 + stages)
    n = 100_000
    a = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    near = (a & 0x807FFFFF) | (((a >> 23) & 0xFF) + rng.integers(-3, 4, n).astype(np.uint32)
                               & 0xFF) << 23
    sa, sb = np.meshgrid(SPECIALS, SPECIALS)
    x = np.concatenate([a, a, sa.ravel()]).astype(np.uint32)
    y = np.concatenate([b, near ^ 0x80000000, sb.ravel()]).astype(np.uint32)
    np.testing.assert_array_equal(simulate_fp32_add(x, y, stages=stages), gold.fadd(x, y))


@pytest.mark.parametrize("stages", FP_STAGES)
def test_rtl_fp32_multiplier_bit_exact(stages):
    rng = np.random.default_rng(11)
    n = 200_000
    a = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    # Operand exponents that put the product around the subnormal range.
    ea = rng.integers(0, 255, n).astype(np.int64)
    eb = np.clip(253 - ea + rng.integers(-40, 40, n), 0, 254).astype(np.uint32)
    a2 = (a & 0x807FFFFF) | (ea.astype(np.uint32) << 23)
    b2 = (b & 0x807FFFFF) | (eb << 23)
    # A subnormal with its leading one at every place (the product's leading
    # zeros, 1 to 24) times every exponent field, both ways round.
    lead, field = np.meshgrid(np.arange(23, dtype=np.uint32), np.arange(256, dtype=np.uint32))
    lead, field = np.repeat(lead.ravel(), 4), np.repeat(field.ravel(), 4)
    low = rng.integers(0, 1 << 23, lead.size, dtype=np.uint32) & ((np.uint32(1) << lead) - 1)
    sub = (np.uint32(1) << lead) | low | (rng.integers(0, 2, lead.size, dtype=np.uint32) << 31)
    other = (field << 23) | (rng.integers(0, 1 << 23, lead.size, dtype=np.uint32)
                             & rng.choice(np.uint32([0, 0x7FFFFF]), lead.size))
    sa, sb = np.meshgrid(SPECIALS, SPECIALS)
    x = np.concatenate([a, a2, sub, other, sa.ravel()]).astype(np.uint32)
    y = np.concatenate([b, b2, other, sub, sb.ravel()]).astype(np.uint32)
    np.testing.assert_array_equal(simulate_fp32_mul(x, y, stages=stages), gold.fmul(x, y))


@pytest.mark.parametrize("stages", FP_STAGES)
def test_rtl_fp32_multiplier_by_powers_of_two(stages):
    """The multiplier-free variant equals the multiply for every power of two."""
    rng = np.random.default_rng(13)
    k = np.repeat(np.arange(1, 255, dtype=np.uint32), 800)
    a = rng.integers(0, 1 << 32, k.size, dtype=np.uint64).astype(np.uint32)
    a[: SPECIALS.size] = SPECIALS
    p = (k << 23).astype(np.uint32)
    np.testing.assert_array_equal(simulate_fp32_mul(a, p, power_of_two=True, stages=stages),
                                  gold.fmul(a, p))
    with pytest.raises(ValueError, match="power of two"):
        simulate_fp32_mul(a[:2], np.uint32([0x3F800001, 0x3F800000]), power_of_two=True)


# The deeper lane's sweep is 2.5 minutes (its build and 60k rows through a
# 5-stage lane): `slow`; in make test the ALU's rows and reductions and each
# fp32 unit check that depth.
@pytest.mark.parametrize("stages", [pytest.param(s, marks=pytest.mark.slow) if s > 1 else s
                                    for s in LANE_STAGES])
def test_rtl_lane_every_op_every_exponent(stages):
    """One stream mixing every op: each function over every exponent of both
    signs, the binary ops on random operands and on the specials."""
    rng = np.random.default_rng(12)
    sweep = every_exponent(rng)
    a, op = [], []
    for code in (VpuOp.EXP, VpuOp.RECIP, VpuOp.RSQRT, VpuOp.PASS):
        a.append(sweep)
        op.append(np.full(sweep.size, code.value))
    n = 60_000
    binary = (VpuOp.ADD, VpuOp.SUB, VpuOp.MUL, VpuOp.MAX, VpuOp.MIN)
    a.append(rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32))
    op.append(rng.choice([c.value for c in binary], n))
    sa, sb = np.meshgrid(SPECIALS, SPECIALS & 0xFFFFFFF0)
    for code in binary:
        a.append(sa.ravel())
        op.append(np.full(sa.size, code.value))
    a, op = np.concatenate(a).astype(np.uint32), np.concatenate(op).astype(np.uint8)
    b = rng.integers(0, 1 << 32, a.size, dtype=np.uint64).astype(np.uint32) & 0xFFFFFFF0
    b[-5 * sb.size:] = np.tile(sb.ravel(), 5)
    shuffle = rng.permutation(a.size)
    a, b, op = a[shuffle], b[shuffle], op[shuffle]
    np.testing.assert_array_equal(simulate_vpu_lane(op, a, b, stages=stages),
                                  gold.vector_alu(op, a[:, None], b[:, None])[:, 0])


@pytest.mark.parametrize("stages", LANE_STAGES)
@pytest.mark.parametrize("cols", [3, 4])
def test_rtl_vector_alu_rows_and_reductions(cols, stages):
    """Whole rows, every op including the row reductions (a row of 3 is padded
    to 4 in the tree), with back-pressure, on Amaranth's simulator."""
    rng = np.random.default_rng(cols)
    n = 40
    op = np.concatenate([[VpuOp.RSUM.value, VpuOp.RMAX.value] * 4,
                         rng.integers(0, len(VpuOp), n - 8)])
    a = rng.standard_normal((n, cols)).astype(np.float32).view(np.uint32)
    a[1::3] = rng.integers(0, 1 << 32, a[1::3].shape, dtype=np.uint64).astype(np.uint32)
    a[0] = 0x80000000               # -0 + -0 ...: the +0 padding decides the sign
    a[2, 0] = 0x7F800000            # inf in a sum, and a max
    b = rng.standard_normal((n, cols)).astype(np.float32).view(np.uint32)
    got = simulate_vector_alu(ChipConfig(rows=2, cols=cols, vpu_stages=stages), op, a, b,
                              ready_percent=60)
    np.testing.assert_array_equal(got, gold.vector_alu(op, a, b))


@pytest.mark.parametrize("stages", [1, 3])
def test_vector_alu_takes_a_row_a_cycle(stages):
    """No lost throughput at any depth: rows back to back (reductions and
    functions mixed) leave back to back, `alu_latency` cycles after they
    enter, and the latency is the lanes' and the tree's, each `stages` times
    the one-stage latency."""
    from mxu.sim.backends.runner import InStream, OutStream, run_amaranth
    config = ChipConfig(rows=2, cols=4, vpu_stages=stages)
    assert alu_latency(config) == stages * alu_latency(config.replace(vpu_stages=1))
    assert lane_latency(stages) == stages * lane_latency(1)
    ops = [VpuOp.RSUM, VpuOp.EXP, VpuOp.RMAX, VpuOp.MUL, VpuOp.RSQRT] * 4
    words = tuple(op.value | (0x3F800000 << 4) for op in ops)
    run = run_amaranth(VectorAlu(config), (InStream("i", 4 + 64 * config.cols, words),),
                       (OutStream("o", 32 * config.cols, len(words), 100),),
                       max_cycles=1000, name="vector_alu_rate")
    assert len(run.outputs["o"]) == len(words)
    assert run.last["o"] - run.first["o"] == len(words) - 1
    assert run.first["o"] == alu_latency(config)


def test_simulate_vpu_lane_rejects_bad_input():
    x = np.zeros(4, np.uint32)
    with pytest.raises(ValueError, match="unknown vector op"):
        simulate_vpu_lane("tanh", x)
    with pytest.raises(ValueError, match="simulate_vector_alu"):
        simulate_vpu_lane(VpuOp.RSUM, x)
    with pytest.raises(ValueError, match="low bits of b"):
        simulate_vpu_lane("add", x, np.ones(4, np.uint32))
    with pytest.raises(TypeError, match="uint32"):
        simulate_vpu_lane("exp", np.zeros(4, np.float32))


@pytest.mark.parametrize("rows, cols", [(4, 3), (2, 5)])
def test_rtl_row_transpose(rows, cols):
    """Blocks of 1..vmem_row_elems accumulator rows come out as bf16 VMEM
    columns (the transpose path), with back-pressure; the block in registers
    (synthesis) and in a memory (the simulation's fast builds) give the same
    bits in the same cycles."""
    from mxu.hdl.vpu import RowTranspose
    from mxu.sim.backends.runner import InStream, OutStream, run_amaranth
    from mxu.verif.golden import fp32_to_bf16
    config = ChipConfig(rows=rows, cols=cols)
    height = config.vmem_row_elems
    rng = np.random.default_rng(rows * 10 + cols)
    blocks = [rng.standard_normal((n, cols)).astype(np.float32).view(np.uint32)
              for n in [1, height, 2, height - 1, height]]
    blocks[1][0, 0] = 0x7F800001              # a NaN -> the canonical bf16 NaN
    words, want = [], []
    for block in blocks:
        for i, row in enumerate(block):
            last = i == len(block) - 1 and len(block) < height
            words.append(sum(int(v) << (32 * j) for j, v in enumerate(row)) | (last << (32 * cols)))
        bf = np.zeros((height, cols), np.uint16)
        bf[:len(block)] = fp32_to_bf16(block)
        want.extend(bf.T)
    timing = []
    for storage in ("registers", "memory"):
        run = run_amaranth(RowTranspose(config, storage), (InStream("i", 32 * cols + 1, tuple(words)),),
                           (OutStream("o", 16 * height, len(want), 70),), max_cycles=5000)
        got = np.array([[(v >> (16 * k)) & 0xFFFF for k in range(height)] for v in run.outputs["o"]],
                       np.uint16)
        np.testing.assert_array_equal(got, np.array(want), err_msg=storage)
        timing.append((run.first, run.last, run.cycles))
    assert timing[0] == timing[1]


@pytest.mark.parametrize("preset", ["vpu", "fpga-llm"])
def test_meta_queue_split_round_trips_with_the_flags_first(preset):
    """The meta queue's word (`_BesideSplit`) gives back every meta bit, and
    its register part is the flags the proofs name, then dst's bank bits."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from mxu.hdl.vpu import _BesideSplit
    config = ChipConfig.preset(preset)
    split = _BesideSplit(config)
    layout = split.layout
    meta, word, back = Signal(layout), Signal(layout.size), Signal(layout.size)
    m = Module()
    m.d.comb += [word.eq(split.pack(meta)), back.eq(split.unpack(word).as_value())]
    lg = (max(config.acc_banks, config.vmem_banks) - 1).bit_length()
    flags, dst = layout["to_vmem"].offset, layout["dst"].offset
    rng = np.random.default_rng(7)
    seen = []

    async def bench(ctx):
        for value in [0, (1 << layout.size) - 1,
                      *(int(v) for v in rng.integers(0, 1 << 62, 64, dtype=np.uint64))]:
            value &= (1 << layout.size) - 1
            ctx.set(meta, layout.from_bits(value))
            registers = ctx.get(word) >> split.memory_bits
            seen.append((value, ctx.get(back), registers))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    for value, returned, registers in seen:
        assert returned == value
        assert registers & 0xF == (value >> flags) & 0xF
        assert registers >> 4 == (value >> dst) & ((1 << lg) - 1)
    assert split.memory_bits == layout.size - 4 - lg
