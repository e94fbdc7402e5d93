"""cocotb program-level testbench of the whole chip (`MxuChip`).

External memory is cocotbext-axi's `AxiRam` (a strict AXI4 slave, with random
pauses on every channel if asked); the host is an `AxiLiteMaster` on the register
file. The `ChipTB` class owns the clock, these drivers, the ISA's functional model
(`IsaModel`) and the checker. Parameters come from ``MXU_TB_ARGS`` (JSON): the
`ChipConfig` fields, ``pause`` (percent) and ``seed``.
"""

import json
import logging
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.hdl.regs import REG
from mxu.verif import golden, programs
from mxu.verif.isa_model import IsaModel

ARGS = json.loads(os.environ.get("MXU_TB_ARGS", "{}"))
CONFIG = ChipConfig(**ARGS.get("config", {}))
PAUSE = int(ARGS.get("pause", 0))
SEED = int(ARGS.get("seed", 1))
PROGRAM_BASE = CONFIG.ext_mem_bytes // 2
WATCHDOG_CYCLES = 200_000


class ChipTB:
    def __init__(self, dut):
        self.dut = dut
        self.prng = random.Random(SEED)
        # Every input defined before the bus models start (Icarus begins at X/Z;
        # the bus models drive payloads only while they send).
        dut.rst.value = 1
        for name in ("awaddr", "awprot", "awvalid", "wdata", "wstrb", "wvalid", "bready",
                     "araddr", "arprot", "arvalid", "rready"):
            getattr(dut, f"host__{name}").value = 0
        for name in ("awready", "wready", "bid", "bresp", "bvalid", "arready", "rid", "rdata",
                     "rresp", "rlast", "rvalid"):
            getattr(dut, f"axi__{name}").value = 0
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        self.mem = bytearray(CONFIG.ext_mem_bytes)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst,
                          size=CONFIG.ext_mem_bytes, mem=self.mem)
        self.host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "host_"), dut.clk, dut.rst)
        for log in (self.ram.write_if.log, self.ram.read_if.log, self.host.write_if.log,
                    self.host.read_if.log):
            log.setLevel(logging.WARNING)
        if PAUSE:
            for ch in (self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                       self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                       self.ram.read_if.r_channel):
                ch.set_pause_generator(self._pauses())
        self.ext = np.frombuffer(self.mem, dtype=np.uint8)

    def _pauses(self):
        rng = random.Random(self.prng.random())
        while True:
            yield rng.random() * 100 < PAUSE

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def write_reg(self, name, value):
        await self.host.write_dword(REG[name], value)

    async def read_reg(self, name, offset=0):
        return await self.host.read_dword(REG[name] + offset)

    async def run(self, program, image):
        """Run on the RTL and on the model; return (error, error_pc, model, expected)."""
        self.ext[:] = 0
        model = IsaModel(CONFIG)
        for addr, data in image.items():
            data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            self.ext[addr:addr + data.size] = data
            model.ext[addr:addr + data.size] = data
        code = program.to_bytes()
        self.ext[PROGRAM_BASE:PROGRAM_BASE + len(code)] = np.frombuffer(code, np.uint8)
        model.ext[PROGRAM_BASE:PROGRAM_BASE + len(code)] = np.frombuffer(code, np.uint8)
        expected = model.run(code, PROGRAM_BASE)
        await self.write_reg("PROG_BASE", PROGRAM_BASE)
        await self.write_reg("PROG_LEN", len(code) // 16)
        await self.write_reg("CTRL", 1)
        for cycle in range(WATCHDOG_CYCLES):
            await RisingEdge(self.dut.clk)
            if self.dut.irq.value == 1:
                break
        else:
            raise AssertionError(f"watchdog: no irq within {WATCHDOG_CYCLES} cycles "
                                 f"(STATUS=0x{await self.read_reg('STATUS'):x})")
        status = await self.read_reg("STATUS")
        return ErrorCode((status >> 4) & 0xF), await self.read_reg("ERROR_PC"), model, expected

    def check(self, model, ranges, what):
        for lo, hi in ranges:
            golden.assert_bits_equal(self.ext[lo:hi], model.ext[lo:hi], f"{what} {lo:#x}", seed=SEED)


@cocotb.test()
async def every_instruction(dut):
    tb = ChipTB(dut)
    await tb.reset()
    program, image = programs.every_instruction(CONFIG, np.random.default_rng(SEED))
    error, _, model, expected = await tb.run(program, image)
    assert error is ErrorCode.NONE and expected.error is ErrorCode.NONE
    tb.check(model, programs.EVERY_INSTRUCTION_OUTPUTS, "every instruction")
    assert await tb.read_reg("COUNTERS", 8 * 7) == len(program)   # instructions


@cocotb.test()
async def loops(dut):
    tb = ChipTB(dut)
    await tb.reset()
    program, image = programs.loop_program(CONFIG, np.random.default_rng(SEED + 2))
    error, _, model, expected = await tb.run(program, image)
    assert error is ErrorCode.NONE and expected.error is ErrorCode.NONE
    tb.check(model, [programs.LOOP_OUTPUTS], "loop program")


@cocotb.test()
async def random_programs(dut):
    tb = ChipTB(dut)
    await tb.reset()
    for case in range(3):
        rng = np.random.default_rng(SEED * 100 + case)
        program = programs.random_program(CONFIG, rng)
        image = programs.random_image(CONFIG, rng)
        error, _, model, expected = await tb.run(program, image)
        assert error is expected.error is ErrorCode.NONE, f"case {case}: {error.name}"
        tb.check(model, [(0, 0x8000)], f"random program {case}")


@cocotb.test()
async def every_error_then_soft_reset_then_good_program(dut):
    tb = ChipTB(dut)
    await tb.reset()
    for name, (program, code, pc) in programs.error_programs(CONFIG).items():
        error, error_pc, _, expected = await tb.run(program, {})
        assert error is code is expected.error, f"{name}: chip {error.name}, model {expected.error.name}"
        if pc is not None:
            assert error_pc == pc, f"{name}: error pc {error_pc}, expected {pc}"
        await tb.write_reg("CTRL", 2)   # soft reset
        good, image = programs.every_instruction(CONFIG, np.random.default_rng(SEED + 1))
        error, _, model, _ = await tb.run(good, image)
        assert error is ErrorCode.NONE, f"after {name}: {error.name}"
        tb.check(model, programs.EVERY_INSTRUCTION_OUTPUTS, f"after {name} and a soft reset")


@cocotb.test()
async def fetch_error_from_a_misaligned_program(dut):
    tb = ChipTB(dut)
    await tb.reset()
    await tb.write_reg("PROG_BASE", PROGRAM_BASE + 8)
    await tb.write_reg("PROG_LEN", 1)
    await tb.write_reg("CTRL", 1)
    await ClockCycles(dut.clk, 20)
    status = await tb.read_reg("STATUS")
    assert status & 2 and ErrorCode((status >> 4) & 0xF) is ErrorCode.FETCH_ERROR, hex(status)


@cocotb.test()
async def unmapped_register_answers_slverr(dut):
    tb = ChipTB(dut)
    await tb.reset()
    assert await tb.read_reg("ID") == 0x4D585531
    result = await tb.host.read(0xFFC, 4)
    assert result.resp != 0, "an unmapped register must answer SLVERR"
