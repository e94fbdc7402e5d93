"""cocotb regression of `mxu.hdl.expander.Expander`: tile-blocks of every
format the chip's configuration builds, beat by beat with random gaps, the
rows taken under random back-pressure, bit-exact against the golden model
`mxu.verif.quant.expand_tiles`; then one run without stalls whose cycles show
that the expander keeps up with the bus. Parameters from ``MXU_TB_ARGS``
(JSON): ``config`` (ChipConfig fields), ``seed``, ``pause`` (% of cycles
without a beat or without ``ready``)."""

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from mxu.hdl import ChipConfig
from mxu.hdl.expander import Expander
from mxu.hdl.quant import QUANT_INFO, QuantFormat, repack
from mxu.verif.golden import assert_bits_equal
from mxu.verif.quant import expand_tiles, random_blocks

ARGS = json.loads(os.environ.get("MXU_TB_ARGS", "{}"))
CONFIG = ChipConfig(**ARGS.get("config", {}))
SEED = int(ARGS.get("seed", 1))
PAUSE = int(ARGS.get("pause", 30))
LATENCY = Expander.LATENCY + 1   # cycles from a group's last beat to its rows at the output
WATCHDOG = 20_000


def _strip(fmt, blocks_along_k, seed):
    """The chip bytes of one K x cols strip, and its beats."""
    info = QUANT_INFO[fmt]
    n, k = CONFIG.cols, blocks_along_k * info.block
    raw = random_blocks(fmt, n * blocks_along_k, seed)
    chip = repack(raw, fmt, (n, k), CONFIG.cols)
    bb = CONFIG.axi_data_bytes
    beats = [int.from_bytes(chip[i:i + bb].tobytes(), "little") for i in range(0, chip.size, bb)]
    return chip, beats


async def _run(dut, fmt, beats, rows_wanted, pause, rng):
    """Drive `beats`, collect `rows_wanted` rows; returns (rows, cycles).
    `fmt` is the format of every beat, or a list of each beat's."""
    R, N = CONFIG.quant_rows, CONFIG.cols
    formats = fmt if isinstance(fmt, list) else [fmt] * len(beats)
    name = "+".join(dict.fromkeys(f.name for f in formats))
    dut.format.value = formats[0].value
    dut.clear.value = 1
    await RisingEdge(dut.clk)
    dut.clear.value = 0
    got, i, cycles = [], 0, 0
    while len(got) < rows_wanted:
        assert cycles < WATCHDOG, f"watchdog: {name} gave {len(got)} of {rows_wanted} rows"
        offer = i < len(beats) and rng.integers(100) >= pause
        dut.beats__valid.value = int(offer)
        dut.beats__payload.value = beats[i] if offer else 0
        dut.format.value = formats[min(i, len(beats) - 1)].value
        dut.rows__ready.value = int(rng.integers(100) >= pause)
        await ReadOnly()
        took = offer and dut.beats__ready.value == 1
        if dut.rows__valid.value == 1 and dut.rows__ready.value == 1:
            payload = dut.rows__payload.value.to_unsigned()
            for r in range(R):
                row = payload >> (16 * N * r)
                got.append([(row >> (16 * n)) & 0xFFFF for n in range(N)])
        await RisingEdge(dut.clk)
        i += int(took)
        cycles += 1
    dut.beats__valid.value = 0
    assert i == len(beats), f"{name}: {i} of {len(beats)} beats taken for all rows"
    return np.array(got, np.uint16), cycles


async def _start(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.beats__valid.value = 0
    dut.rows__ready.value = 0
    dut.clear.value = 0
    await RisingEdge(dut.clk)
    await RisingEdge(dut.clk)
    dut.rst.value = 0


@cocotb.test()
async def every_format_with_stalls(dut):
    await _start(dut)
    rng = np.random.default_rng(SEED)
    for n, name in enumerate(CONFIG.quant_formats):
        fmt = QuantFormat[name]
        blocks = 3 if QUANT_INFO[fmt].block == 32 else 2
        chip, beats = _strip(fmt, blocks, SEED * 100 + n)
        want = expand_tiles(chip, fmt, CONFIG.cols)
        got, _ = await _run(dut, fmt, beats, want.shape[0], PAUSE, rng)
        assert_bits_equal(got[:want.shape[0]], want, what=f"{fmt.name} rows", seed=SEED)


@cocotb.test()
async def formats_back_to_back(dut):
    """Strips of every format, each after the other with no clear between
    (back-to-back quantized loads), the format changing with the beats: each
    block is expanded in its own format."""
    await _start(dut)
    rng = np.random.default_rng(SEED + 1)
    for pause in (0, PAUSE):
        names = list(CONFIG.quant_formats) * 2
        rng.shuffle(names)
        beats, formats, want = [], [], []
        for n, name in enumerate(names):
            fmt = QuantFormat[name]
            chip, strip = _strip(fmt, 1 + n % 2, SEED * 200 + n)
            beats += strip
            formats += [fmt] * len(strip)
            want.append(expand_tiles(chip, fmt, CONFIG.cols))
        want = np.concatenate(want)
        got, _ = await _run(dut, formats, beats, want.shape[0], pause, rng)
        assert_bits_equal(got[:want.shape[0]], want, what=f"rows of {names}, pause {pause}",
                          seed=SEED)


@cocotb.test()
async def keeps_up_with_the_bus(dut):
    """Without stalls, a strip takes one cycle per beat, or, where a beat
    carries more than ``quant_rows`` rows, one per group of rows and one per
    header beat (a block's header beats enter after its last group has
    left, as the groups read the header words), plus the pipeline's latency. On the default chip (two rows a
    cycle) that is the bus's rate for every format; on the fpga chip (one
    row a cycle, up to four rows a beat) it is the row rate."""
    await _start(dut)
    rng = np.random.default_rng(SEED)
    blocks = 2
    for name in CONFIG.quant_formats:
        fmt = QuantFormat[name]
        chip, beats = _strip(fmt, blocks, SEED)
        want = expand_tiles(chip, fmt, CONFIG.cols)
        got, cycles = await _run(dut, fmt, beats, want.shape[0], 0, rng)
        assert_bits_equal(got, want, what=f"{fmt.name} rows", seed=SEED)
        groups = want.shape[0] // CONFIG.quant_rows
        header_beats = blocks * CONFIG.cols * QUANT_INFO[fmt].header_bytes // CONFIG.axi_data_bytes
        bound = len(beats) if groups <= len(beats) else groups + header_beats
        assert cycles <= bound + LATENCY, \
            f"{fmt.name}: {cycles} cycles for {len(beats)} beats, {groups} groups of rows"
        dut._log.info(f"{fmt.name}: {want.shape[0]} rows from {len(beats)} beats in {cycles} cycles")
