"""The numeric units: cocotb regression on every simulator, and large random
volumes through the fast streaming path."""

import gc
import json
import warnings

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from mxu.sim import simulate_bf16_mul, simulate_fp32_add, simulate_fp32_to_bf16, simulate_mac
from mxu.sim.backends.cocotb import cocotb_build, cocotb_test
from mxu.hdl.mac import MAC_STAGES
from mxu.hdl.numerics import LZC_FORMS, Fp32AddNormAmount, leading_zeros
from mxu.sim.backends.verilog import to_verilog
from mxu.sim.backends.toolchain import icarus_available
from mxu.verif import golden, vectors
from mxu.verif.numerics_dut import NumericsTestTop

SEED = 20261122
# cocotb drives one vector per step from Python: 200k per unit on Verilator in
# `make test`; Icarus' VPI is slower, so it gets a smaller share. The MAC
# streams drive seven MACs per vector and take a tenth (`tb_numerics`).
COCOTB_VECTORS = {"verilator": 200_000, "icarus": 20_000}
_UNITS = ["multiplier", "adder", "fp32_to_bf16", "mac_streams"]
# The MAC streams on Icarus take nearly three minutes: `slow`. The same RTL runs
# them on Verilator, and the MAC on Icarus in `test_simulate_mac_other_simulators`.
_COCOTB_CASES = [pytest.param(unit, sim, id=f"{unit}-{sim}", marks=pytest.mark.slow if (
    unit, sim) == ("mac_streams", "icarus") else ()) for unit in _UNITS for sim in COCOTB_VECTORS]


def _needs(simulator):
    if simulator == "icarus" and not icarus_available():
        pytest.skip("Icarus Verilog (iverilog) not installed; install it to run this case")


@pytest.mark.parametrize("unit, simulator", _COCOTB_CASES)
def test_cocotb_numerics(unit, simulator, tmp_path):
    _needs(simulator)
    build = cocotb_build(to_verilog(NumericsTestTop()), "top", simulator, name="numerics")
    args = {"random": COCOTB_VECTORS[simulator], "seed": SEED}
    cocotb_test(build, "top", "mxu.verif.tb_numerics", simulator, test_dir=tmp_path,
                testcase=unit, extra_env={"MXU_TB_ARGS": json.dumps(args)})


def _mac_case(n, seed):
    rng = np.random.default_rng(seed)
    a, w = vectors.pairs(vectors.special_bf16(), vectors.special_bf16())
    acc = np.resize(vectors.special_fp32(), a.size)
    ra, rw, racc = vectors.mac_vectors(rng, n)
    return np.concatenate([a, ra]), np.concatenate([w, rw]), np.concatenate([acc, racc])


@pytest.mark.parametrize("stages", MAC_STAGES)
def test_simulate_mac_2m_vectors(stages):
    a, w, acc = _mac_case(2_000_000, SEED + stages)
    golden.assert_bits_equal(simulate_mac(a, w, acc, stages=stages), golden.mac(a, w, acc),
                             f"simulate_mac stages={stages}", {"a": a, "w": w, "acc": acc}, SEED)


@pytest.mark.parametrize("simulator", ["icarus", "amaranth"])
def test_simulate_mac_other_simulators(simulator):
    _needs(simulator)
    a, w, acc = _mac_case(3000, SEED)
    golden.assert_bits_equal(simulate_mac(a, w, acc, simulator=simulator), golden.mac(a, w, acc),
                             f"simulate_mac on {simulator}", {"a": a, "w": w, "acc": acc}, SEED)


def test_simulate_units_1m_vectors():
    rng = np.random.default_rng(SEED)
    a, b = vectors.random_bf16(rng, 1_000_000), vectors.random_bf16(rng, 1_000_000)
    golden.assert_bits_equal(simulate_bf16_mul(a, b), golden.mul(a, b), "mul", {"a": a, "b": b}, SEED)
    x, y = vectors.add_vectors(rng, 1_000_000)
    golden.assert_bits_equal(simulate_fp32_add(x, y), golden.add(x, y), "add", {"x": x, "y": y}, SEED)
    golden.assert_bits_equal(simulate_fp32_to_bf16(x), golden.fp32_to_bf16(x), "cvt", {"x": x}, SEED)


@pytest.mark.slow
@pytest.mark.parametrize("stages", MAC_STAGES)
def test_simulate_mac_10m_vectors(stages):
    for chunk in range(5):
        a, w, acc = _mac_case(2_000_000, SEED * 7 + 100 * stages + chunk)
        golden.assert_bits_equal(simulate_mac(a, w, acc, stages=stages), golden.mac(a, w, acc),
                                 f"simulate_mac stages={stages} chunk={chunk}",
                                 {"a": a, "w": w, "acc": acc}, SEED)


@pytest.mark.slow
def test_simulate_units_10m_vectors():
    for chunk in range(5):
        rng = np.random.default_rng(SEED + 1000 + chunk)
        a, b = vectors.random_bf16(rng, 2_000_000), vectors.random_bf16(rng, 2_000_000)
        golden.assert_bits_equal(simulate_bf16_mul(a, b), golden.mul(a, b), "mul", seed=SEED)
        x, y = vectors.add_vectors(rng, 2_000_000)
        golden.assert_bits_equal(simulate_fp32_add(x, y), golden.add(x, y), "add", seed=SEED)
        golden.assert_bits_equal(simulate_fp32_to_bf16(x), golden.fp32_to_bf16(x), "cvt", seed=SEED)


@pytest.mark.parametrize("named", [False, True], ids=["expression", "named"])
@pytest.mark.parametrize("form", LZC_FORMS)
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 16, 27, 28, 32, 48])
def test_leading_zeros(form, named, width):
    """Both forms of the leading-zero count, as one expression and with their
    steps in named signals, against Python's `int.bit_length`: every value up
    to 9 bits; zero, every power of two, every power of two with random bits below
    it, and random values of random length above."""
    rng = np.random.default_rng(SEED + width)
    if width <= 9:
        values = list(range(1 << width))
    else:
        below = [int(rng.integers(0, 1 << k)) if k else 0 for k in range(width)]
        values = [0] + [1 << k for k in range(width)] + [(1 << k) | b for k, b in enumerate(below)]
        values += [int(rng.integers(0, 1 << 62)) % (1 << int(rng.integers(1, width + 1)))
                   for _ in range(200)]
    m = Module()
    value, count = Signal(width), Signal(range(width + 1))
    m.d.comb += count.eq(leading_zeros(value, form, m if named else None))
    sim = Simulator(m)

    async def check(ctx):
        for v in values:
            ctx.set(value, v)
            assert ctx.get(count) == width - v.bit_length(), f"{form} lzc({v:#x}) of {width} bits"
    sim.add_testbench(check)
    sim.run()


def test_leading_zeros_rejects_an_unknown_form():
    with pytest.raises(ValueError, match=r"form must be one of \('tree', 'onehot'\), not 'fast'"):
        leading_zeros(Signal(8), "fast")
    with warnings.catch_warnings():
        # The component that refused its argument is never elaborated.
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"lzc must be one of \('tree', 'onehot'\), not 'fast'"):
            Fp32AddNormAmount(lzc="fast")
        gc.collect()
