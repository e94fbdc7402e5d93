"""cocotb regression of the numeric units in `NumericsTestTop`, bit-exact against
the golden model. Parameters come from ``MXU_TB_ARGS`` (JSON): ``random`` (random
vectors per unit) and ``seed``."""

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, Timer

from mxu.hdl.mac import MAC_STAGES
from mxu.verif import golden, vectors

ARGS = json.loads(os.environ.get("MXU_TB_ARGS", "{}"))
RANDOM = int(ARGS.get("random", 2000))
SEED = int(ARGS.get("seed", 1))
WATCHDOG_CYCLES = 1000   # a MAC result later than this is a hang


class CombChecker:
    """Drives a combinational unit one vector per nanosecond and checks every output."""

    def __init__(self, dut, inputs, output, model):
        self.dut, self.inputs, self.output, self.model = dut, inputs, output, model

    async def run(self, *operands, what):
        handles = [getattr(self.dut, name) for name in self.inputs]
        out = getattr(self.dut, self.output)
        got = np.zeros(operands[0].size, np.uint64)
        for i in range(operands[0].size):
            for handle, values in zip(handles, operands):
                handle.value = int(values[i])
            await Timer(1, "ns")
            got[i] = out.value.to_unsigned()
        expected = self.model(*operands)
        golden.assert_bits_equal(got.astype(expected.dtype), expected, what,
                                 dict(zip(self.inputs, operands)), SEED)


class MacTB:
    """Owns the clock, one driver and one monitor per `MacUnit`, the golden model and
    the checker. Inputs arrive with random gaps; outputs see random back-pressure."""

    def __init__(self, dut):
        self.dut = dut
        self.rng = np.random.default_rng(SEED)
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())

    async def reset(self):
        self.dut.rst.value = 1
        for stages in MAC_STAGES:
            getattr(self.dut, f"mac{stages}_i__valid").value = 0
            getattr(self.dut, f"mac{stages}_o__ready").value = 0
        await RisingEdge(self.dut.clk)
        await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0

    async def drive(self, stages, payload, valid_percent):
        port = lambda s: getattr(self.dut, f"mac{stages}_i__{s}")
        rng = np.random.default_rng(SEED + stages)
        i = 0
        while i < payload.size:
            valid = bool(rng.integers(100) < valid_percent)
            port("valid").value = int(valid)
            port("payload").value = int(payload[i])
            # Decide the handshake mid-cycle, when everything has settled.
            await FallingEdge(self.dut.clk)
            fire = valid and port("ready").value == 1
            await RisingEdge(self.dut.clk)
            i += fire
        port("valid").value = 0

    async def monitor(self, stages, n, ready_percent):
        port = lambda s: getattr(self.dut, f"mac{stages}_o__{s}")
        rng = np.random.default_rng(SEED + 10 * stages)
        got = np.zeros(n, np.uint32)
        count = idle = 0
        while count < n:
            ready = bool(rng.integers(100) < ready_percent)
            port("ready").value = int(ready)
            await FallingEdge(self.dut.clk)
            if ready and port("valid").value == 1:
                got[count] = port("payload").value.to_unsigned()
                count += 1
                idle = 0
            else:
                idle += 1
                assert idle < WATCHDOG_CYCLES, (
                    f"watchdog: MacUnit(stages={stages}) gave no result for {idle} cycles "
                    f"after {count} of {n}")
            await RisingEdge(self.dut.clk)
        port("ready").value = 0
        return got

    async def check(self, a, w, acc, valid_percent, ready_percent, what):
        payload = a.astype(np.uint64) | (w.astype(np.uint64) << 16) | (acc.astype(np.uint64) << 32)
        monitors = []
        for stages in MAC_STAGES:
            cocotb.start_soon(self.drive(stages, payload, valid_percent))
            monitors.append(cocotb.start_soon(self.monitor(stages, a.size, ready_percent)))
        expected = golden.mac(a, w, acc)
        for stages, monitor in zip(MAC_STAGES, monitors):
            got = await monitor
            golden.assert_bits_equal(got, expected, f"{what} stages={stages}",
                                     {"a": a, "w": w, "acc": acc}, SEED)


def _rng(salt):
    return np.random.default_rng(SEED * 1000 + salt)


@cocotb.test(timeout_time=50, timeout_unit="ms")
async def multiplier(dut):
    a, b = vectors.pairs(vectors.special_bf16(), vectors.special_bf16())
    checker = CombChecker(dut, ["mul_a", "mul_b"], "mul_p", golden.mul)
    await checker.run(a, b, what="mul special pairs")
    rng = _rng(1)
    await checker.run(vectors.random_bf16(rng, RANDOM), vectors.random_bf16(rng, RANDOM),
                      what="mul random")


@cocotb.test(timeout_time=50, timeout_unit="ms")
async def adder(dut):
    checker = CombChecker(dut, ["add_a", "add_b"], "add_s", golden.add)
    await checker.run(*vectors.pairs(vectors.special_fp32(), vectors.special_fp32()),
                      what="add special pairs")
    await checker.run(*vectors.directed_add(), what="add directed")
    await checker.run(*vectors.add_vectors(_rng(2), RANDOM), what="add random")


@cocotb.test(timeout_time=50, timeout_unit="ms")
async def fp32_to_bf16(dut):
    checker = CombChecker(dut, ["cvt_x"], "cvt_y", golden.fp32_to_bf16)
    ties = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7F8000, 0x7F7FFFFF,
                     0x00008000, 0x00018000, 0x807F8000], np.uint32)
    await checker.run(np.concatenate([vectors.special_fp32(), ties]), what="cvt directed")
    await checker.run(vectors.random_fp32(_rng(3), RANDOM), what="cvt random")


@cocotb.test(timeout_time=50, timeout_unit="ms")
async def mac_streams(dut):
    tb = MacTB(dut)
    await tb.reset()
    a, w = vectors.pairs(vectors.special_bf16(), vectors.special_bf16())
    acc = np.resize(vectors.special_fp32(), a.size)
    await tb.check(a, w, acc, 100, 100, "mac special pairs, no stalls")
    # A tenth of the units' share: each vector goes through all seven MAC
    # depths; the numerics get 14M vectors from `simulate_mac`, this is the protocol.
    a, w, acc = vectors.mac_vectors(_rng(4), max(RANDOM // 10, 100))
    await tb.check(a, w, acc, 100, 100, "mac random, full rate")
    a, w, acc = vectors.mac_vectors(_rng(5), max(RANDOM // 20, 100))
    await tb.check(a, w, acc, 70, 50, "mac random, gaps and back-pressure")
