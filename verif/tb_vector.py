"""cocotb programs for the vector engine (a chip built with ``vpu=True``): every
VECTOR op and operand mode with its tokens, and every VECTOR error followed by
a soft reset and a good program, against the ISA's functional model, through
`ChipTB` (cocotbext-axi's AxiRam as external memory, random pauses if asked).
Parameters as `mxu.verif.tb_chip`."""

import cocotb
import numpy as np

from mxu.hdl.isa import ErrorCode
from mxu.verif import programs
from mxu.verif.tb_chip import CONFIG, SEED, ChipTB


@cocotb.test()
async def every_vector_op(dut):
    tb = ChipTB(dut)
    await tb.reset()
    program, image, outputs = programs.vector_program(CONFIG, np.random.default_rng(SEED))
    error, _, model, expected = await tb.run(program, image)
    assert error is ErrorCode.NONE and expected.error is ErrorCode.NONE, error.name
    tb.check(model, outputs, "vector program")
    assert await tb.read_reg("COUNTERS", 8 * 8) == expected.vector_rows   # vector_active


@cocotb.test()
async def every_vector_error_then_soft_reset_then_good_program(dut):
    tb = ChipTB(dut)
    await tb.reset()
    good, image, outputs = programs.vector_program(CONFIG, np.random.default_rng(SEED + 1))
    for name, (program, code, pc) in programs.vector_error_programs(CONFIG).items():
        error, error_pc, _, expected = await tb.run(program, {})
        assert error is code is expected.error, f"{name}: chip {error.name}, model {expected.error.name}"
        assert error_pc == pc, f"{name}: error pc {error_pc}, expected {pc}"
        await tb.write_reg("CTRL", 2)   # soft reset
    error, _, model, _ = await tb.run(good, image)
    assert error is ErrorCode.NONE, f"after the errors: {error.name}"
    tb.check(model, outputs, "after the errors and a soft reset")
