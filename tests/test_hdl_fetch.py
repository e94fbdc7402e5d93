"""`InstructionFetch` alone, in Amaranth's simulator, on every bus width: a
program of any length arrives whole and in order (a 256- or 512-bit bus
carries several instructions a beat; its bursts must still fit the queue),
and its `hungry` output (the chip then holds back the load DMA's bursts)
always leads to a burst."""

import random

import pytest
from amaranth.sim import Simulator

from mxu.hdl import ChipConfig
from mxu.hdl.fetch import InstructionFetch
from mxu.hdl.isa import INSTR_BYTES


def _fetch(bits, count, seed=1):
    config = ChipConfig(rows=2, cols=2, vmem_bytes=4 << 10, acc_bytes=4 << 10,
                        ext_mem_bytes=1 << 16, axi_data_bits=bits)
    dut = InstructionFetch(config)
    bb = config.axi_data_bytes
    base = 0x400
    words = [random.Random(seed + i).getrandbits(128) | 1 for i in range(count)]
    memory = {}
    for i, w in enumerate(words):
        addr = base + i * INSTR_BYTES
        for b in range(INSTR_BYTES):
            memory[addr + b] = (w >> (8 * b)) & 0xFF
    got, samples = [], []
    rng = random.Random(seed)

    async def bench(ctx):
        ctx.set(dut.base, base)
        ctx.set(dut.length, count)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        bursts = []
        for _ in range(40 * count + 200):
            ctx.set(dut.axi.arready, rng.random() < 0.7)
            ctx.set(dut.instr.ready, rng.random() < 0.8)
            if bursts and rng.random() < 0.8:
                addr, left = bursts[0]
                ctx.set(dut.axi.rvalid, 1)
                ctx.set(dut.axi.rdata, sum(memory.get(addr + b, 0) << (8 * b) for b in range(bb)))
                ctx.set(dut.axi.rlast, left == 1)
            else:
                ctx.set(dut.axi.rvalid, 0)
            await ctx.delay(1e-9)
            samples.append((ctx.get(dut.hungry), ctx.get(dut.axi.arvalid), ctx.get(dut.busy)))
            if ctx.get(dut.axi.arvalid) and ctx.get(dut.axi.arready):
                bursts.append([ctx.get(dut.axi.araddr), ctx.get(dut.axi.arlen) + 1])
            if ctx.get(dut.axi.rvalid) and ctx.get(dut.axi.rready):
                bursts[0][0] += bb
                bursts[0][1] -= 1
                if bursts[0][1] == 0:
                    bursts.pop(0)
            if ctx.get(dut.instr.valid) and ctx.get(dut.instr.ready):
                got.append((ctx.get(dut.instr.payload.word), ctx.get(dut.instr.payload.pc)))
                if got[-1][1] == count:     # the end marker after the last instruction
                    return
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return words, got, samples


@pytest.mark.parametrize("bits", [64, 128, 256, 512])
@pytest.mark.parametrize("count", [1, 30, 31, 70])
def test_every_program_length_arrives_on_every_bus(bits, count):
    words, got, _ = _fetch(bits, count)
    assert got, f"no instruction arrived on a {bits}-bit bus"
    assert [w for w, _ in got[:-1]] == words, f"{bits}-bit bus, {count} instructions"
    assert [pc for _, pc in got] == list(range(count + 1))


@pytest.mark.parametrize("bits", [64, 128, 512])
def test_a_hungry_fetch_requests_a_burst_at_once(bits):
    """While `hungry` the chip's load DMA starts no burst, so a hungry fetch
    must have room for a burst and ask for it in the next cycle (else the
    loads would wait for ever); it stops being hungry once the program is
    all requested."""
    words, got, samples = _fetch(bits, 150, seed=3)
    assert [w for w, _ in got[:-1]] == words
    hungry = [i for i, (h, _, _) in enumerate(samples) if h]
    assert hungry, f"the fetch was never hungry on a {bits}-bit bus"
    for i in hungry:
        _, arvalid, busy = samples[i]
        assert arvalid or busy or samples[i + 1][1], f"cycle {i}: hungry but no burst asked for"
    last_ar = max(i for i, (_, arvalid, _) in enumerate(samples) if arvalid)
    assert not any(h for h, _, _ in samples[last_ar + 1:]), "hungry after the last burst"
