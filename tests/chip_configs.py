"""Chip configurations the tests share (each distinct one is a Verilator build)."""

from mxu.hdl import ChipConfig

_SMALL_MEMORIES = dict(vmem_bytes=16 << 10, acc_bytes=16 << 10, ext_mem_bytes=1 << 20)

TINY = ChipConfig(rows=4, cols=4, **_SMALL_MEMORIES)
SHAPES = {
    "1x1": ChipConfig(rows=1, cols=1, **_SMALL_MEMORIES),
    "4x4": TINY,
    "8x8": ChipConfig(rows=8, cols=8, **_SMALL_MEMORIES),
    "3x5": ChipConfig(rows=3, cols=5, **_SMALL_MEMORIES),
    "16x16": ChipConfig(),
}

# With the vector unit (docs/vpu.md): a square and a non-square shape.
VPU_SHAPES = {
    "4x4": TINY.replace(vpu=True),
    "3x5": SHAPES["3x5"].replace(vpu=True),
}

# The cocotb chip regressions (tests/test_sim_program.py, tests/test_sim_vector.py)
# share one Verilator build: the 4x4 chip with the vector unit, fast lanes.
COCOTB_CHIP = VPU_SHAPES["4x4"]


def run_cocotb_chip(module, pause, seed, test_dir):
    """Run the cocotb test module `module` (``mxu.verif.tb_*``) on the
    `COCOTB_CHIP` build, with AXI pauses of `pause` percent."""
    import dataclasses
    import json

    from mxu.sim.backends.cocotb import cocotb_build, cocotb_test
    from mxu.sim.backends.fast_vpu import vpu_cpp_source
    from mxu.sim.backends.verilog import chip_verilog
    build = cocotb_build(chip_verilog(COCOTB_CHIP, fast_lanes=True), "top", "verilator",
                         name="chip4x4_vpu", cpp_text=vpu_cpp_source())
    args = {"config": dataclasses.asdict(COCOTB_CHIP), "pause": pause, "seed": seed}
    cocotb_test(build, "top", module, "verilator", test_dir=test_dir,
                extra_env={"MXU_TB_ARGS": json.dumps(args)})
