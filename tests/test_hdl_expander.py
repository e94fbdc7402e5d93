"""The weight expander (`mxu.hdl.expander`): every format, bit-exact against
the golden model under random stalls, at the bus rate without them (cocotb on
Verilator, `mxu.verif.tb_expander`), and its converters on Amaranth's
simulator."""

import dataclasses
import json

import numpy as np
import pytest
from amaranth.sim import Simulator

from mxu.hdl import ChipConfig
from mxu.hdl.expander import Expander, Fp16ToFp32, ScaleMultiplier
from mxu.sim.backends.cocotb import cocotb_build, cocotb_test
from mxu.sim.backends.verilog import to_verilog
from mxu.verif.golden import assert_bits_equal, f32_bits


@pytest.mark.parametrize("preset,rows", [("default", 2), ("fpga", 1)])
def test_expander(preset, rows, tmp_path):
    """The default chip's two rows a cycle (its two VMEM write lanes) and the
    fpga chip's one (with every format that fits it); every format, and all
    of them back to back. (The testbench's bus-rate case runs without stalls
    whatever `pause` is.)"""
    pause = 40
    config = ChipConfig.preset(preset)
    assert config.quant_rows == rows
    build = cocotb_build(to_verilog(Expander(config)), "top", "verilator",
                         name=f"expander_{preset}")
    args = {"config": dataclasses.asdict(config), "seed": 3 + pause, "pause": pause}
    cocotb_test(build, "top", "mxu.verif.tb_expander", "verilator", test_dir=tmp_path,
                extra_env={"MXU_TB_ARGS": json.dumps(args)})


def test_fp16_to_fp32_every_value():
    """All 65,536 fp16 patterns against NumPy (NaN: any NaN, quiet or not)."""
    dut = Fp16ToFp32()
    xs = np.arange(1 << 16, dtype=np.uint32)
    got = []

    async def tb(ctx):
        for x in xs[::7].tolist() + [0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8001, 0x03FF, 0x8000]:
            ctx.set(dut.x, x)
            got.append((x, ctx.get(dut.y.as_value())))

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
    for x, y in got:
        want = np.array([x], np.uint16).view(np.float16).astype(np.float32)
        wbits = int(want.view(np.uint32)[0])
        if np.isnan(want[0]):
            assert (y >> 23) & 0xFF == 0xFF and y & 0x7FFFFF, hex(x)
        else:
            assert y == wbits, f"fp16 0x{x:04x}: 0x{y:08x} != 0x{wbits:08x}"


def test_scale_multiplier():
    """fp32 x int against NumPy, on the operands the expander can see: fp16
    values (every exponent, +-0, +-inf, NaN) and fp16 x int8 products, times
    every integer from -256 to 255."""
    dut = ScaleMultiplier()
    rng = np.random.default_rng(4)
    f16 = np.concatenate([rng.integers(0, 1 << 16, 300), [0, 0x8000, 1, 0x8001, 0x3FF, 0x7BFF,
                                                        0x7C00, 0xFC00, 0x7E00]]).astype(np.uint16)
    a = f16.view(np.float16).astype(np.float32)
    a = np.concatenate([a, a[:150] * rng.integers(-128, 128, 150).astype(np.float32)])
    ns = np.arange(-256, 256)
    cases = [(float(x), int(n)) for x in a for n in rng.choice(ns, 12)]
    cases += [(float(x), int(n)) for x in a[:4] for n in ns]
    got = []

    async def tb(ctx):
        for x, n in cases:
            ctx.set(dut.a.as_value(), int(np.array([x], np.float32).view(np.uint32)[0]))
            ctx.set(dut.n, n)
            got.append(ctx.get(dut.p.as_value()))

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
    with np.errstate(all="ignore"):
        want = np.array([x for x, _ in cases], np.float32) * np.array([n for _, n in cases],
                                                                       np.float32)
    assert_bits_equal(np.array(got, np.uint32), f32_bits(want), what="ScaleMultiplier")


def test_expander_needs_formats():
    with pytest.raises(ValueError, match="Expander: the chip's quant_formats is empty"):
        Expander(ChipConfig(quant_formats=()))
