"""DMA regression.

* cocotb + Verilator against cocotbext-axi's AxiRam (strict slave) with 0 / 50 /
  90 % random pauses on all five channels: directed, random, illegal-descriptor
  and injected-SLVERR tests (``mxu.verif.tb_dma``), on a small ChipConfig.
* Native (ctypes) runs of the default chip next to the C++ AXI memory model
  (``sim/backends/csrc/axi_mem.h``): large random transfers under latency and
  back-pressure, SLVERR/DECERR injection on both directions, exact burst
  splitting (4 KiB, 256 beats), outstanding reads, bank conflicts with array
  traffic, and the >= 90 % throughput goal in cycles.
* Parameter validation of the new ChipConfig fields and the AXI signatures.
"""

import json

import numpy as np
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator
import pytest

from mxu.hdl.axi import AXI4LiteSignature, AXI4Signature
from mxu.hdl.config import ChipConfig
from mxu.hdl.quant import QUANT_INFO, QuantFormat, repack, tile_block_bytes
from mxu.hdl.dma import DmaDir, DmaError, DmaSpace, _byte_mask, dma_descriptor_layout, \
    pack_fields, unpack_fields
from mxu.sim.backends.cocotb import cocotb_build, cocotb_test
from mxu.sim.backends.dma import NativeDma
from mxu.sim.backends.verilog import dma_system_verilog
from mxu.verif.dma_model import Descriptor, DmaModel, bursts, check_descriptor, random_descriptor
from mxu.verif.quant import random_blocks

LOAD, STORE, VMEM, ACC = DmaDir.LOAD, DmaDir.STORE, DmaSpace.VMEM, DmaSpace.ACC

# Small memories keep the cocotb build and the whole-memory checks cheap.
COCOTB_CONFIG = dict(vmem_bytes=16 << 10, acc_bytes=8 << 10, ext_mem_bytes=64 << 10)


# ------------------------------------------------------------------ cocotb + AxiRam

@pytest.fixture(scope="module")
def cocotb_dma_build():
    config = ChipConfig(**COCOTB_CONFIG)
    return cocotb_build(dma_system_verilog(config), "top", name="dma_system")


@pytest.mark.parametrize("pause,latency,random", [(0, 0, 150), (50, 6, 80), (90, 12, 40)])
def test_dma_cocotb(cocotb_dma_build, tmp_path, pause, latency, random):
    args = {"config": COCOTB_CONFIG, "pause": pause, "latency": latency, "seed": 1000 + pause,
            "random": random}
    cocotb_test(cocotb_dma_build, "top", "mxu.verif.tb_dma", test_dir=tmp_path,
                extra_env={"MXU_TB_ARGS": json.dumps(args)})


@pytest.mark.slow
@pytest.mark.parametrize("pause", [0, 50, 90])
def test_dma_cocotb_long(cocotb_dma_build, tmp_path, pause):
    args = {"config": COCOTB_CONFIG, "pause": pause, "latency": 10, "seed": 2000 + pause,
            "random": 1500}
    cocotb_test(cocotb_dma_build, "top", "mxu.verif.tb_dma", test_dir=tmp_path,
                extra_env={"MXU_TB_ARGS": json.dumps(args)})


# ------------------------------------------------------------------ native runs

CONFIG = ChipConfig()


@pytest.fixture(scope="module")
def dma():
    """The default chip's DMA subsystem next to the C++ memory model; ext memory
    and accumulator filled with random bytes, mirrored in a model."""
    dut = NativeDma(CONFIG)
    rng = np.random.default_rng(7)
    model = DmaModel(CONFIG)
    dut.ext[:] = rng.integers(0, 256, dut.ext.size, dtype=np.uint8)
    model.ext[:] = dut.ext
    acc = rng.integers(0, 256, model.acc.shape, dtype=np.uint8)
    acc.view(np.uint32)[:, ::4] = rng.choice(
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1, 0x807FFFFF,
                  0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32),
        size=acc.view(np.uint32)[:, ::4].shape)
    dut.write_acc(0, acc)
    model.acc[:] = acc
    dut.model = model
    return dut


def _check_all(dut, model, descriptors, what, seed=None):
    bad = np.flatnonzero(dut.ext != model.ext)
    assert not bad.size, (f"{what}: {bad.size} external bytes differ, first at "
                          f"{[hex(b) for b in bad[:6]]} (seed={seed}) {descriptors}")
    for space, ref in ((VMEM, model.vmem), (ACC, model.acc)):
        spans = [(d.chip_row, d.chip_row + d.rows) for d in descriptors if d.space == space]
        if not spans:
            continue
        lo = max(0, min(s for s, _ in spans) - 2)
        hi = min(ref.shape[0], max(e for _, e in spans) + 2)
        got = dut.read_rows("vmem" if space == VMEM else "acc", lo, hi - lo)
        bad = np.argwhere(got != ref[lo:hi])
        assert not bad.size, (f"{what}: {len(bad)} {space.name} bytes differ, first row "
                              f"{lo + bad[0][0]} (seed={seed}) {descriptors}")
    stats = dut.stats()
    assert stats["violations"] == 0, stats["first_violation"]
    assert stats["mem_busy"] == 0, "bursts left open on the bus"


def _write_both(dma, writes):
    """Put each (address, bytes) of `writes` in the DUT's external memory and
    the model's."""
    for at, data in writes:
        dma.ext[at:at + data.size] = data
        dma.model.ext[at:at + data.size] = data


def _run_checked(dma, batch, what, seed):
    """Run `batch` on the DUT: its completions and every memory equal the
    model's; the cycles it took."""
    expect = [(dma.model.execute(d), d.tag) for d in batch]
    got, cycles = dma.run(batch)
    assert got == expect, f"completions {got} != {expect} (seed={seed}) {batch}"
    _check_all(dma, dma.model, batch, what, seed)
    return cycles


def _random_descriptor(rng, config, big=False):
    return random_descriptor(rng, config, max_rows=2000 if big else 60,
                             max_stride_elems=3000, max_base=1 << 22)


@pytest.mark.parametrize("pause,latency", [(0, (0, 0)), (50, (0, 30)), (90, (5, 60))])
def test_native_random(dma, pause, latency):
    """Random legal descriptors (up to thousands of rows) on the default chip."""
    seed = 100 + pause
    rng = np.random.default_rng(seed)
    dma.set_params(pause=pause, latency=latency, seed=seed)
    for _ in range(40 if pause < 90 else 20):
        batch = [_random_descriptor(rng, CONFIG, big=pause == 0)
                 for _ in range(int(rng.integers(1, 6)))]
        expect = [(dma.model.execute(d), d.tag) for d in batch]
        got, _ = dma.run(batch)
        assert got == expect, f"completions {got} != {expect} (seed={seed}) {batch}"
        _check_all(dma, dma.model, batch, f"pause {pause}", seed)


def test_native_illegal(dma):
    """Every check code, matching the model, with no bus traffic."""
    dma.set_params()
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(300):
        d = Descriptor(DmaDir(int(rng.integers(2))), DmaSpace(int(rng.integers(2))),
                       int(rng.choice([0, 1, 2, 4, CONFIG.ext_mem_bytes - 8,
                                       CONFIG.ext_mem_bytes - 2, (1 << 32) - 4])),
                       int(rng.integers(0, 5)), int(rng.integers(0, 70)),
                       int(rng.choice([0, 1, 2, 4, 6, 64, 1 << 24])),
                       int(rng.choice([0, 5, CONFIG.acc_rows - 2, CONFIG.vmem_rows - 1])),
                       bool(rng.integers(2)), bool(rng.integers(2)), tag=int(rng.integers(256)))
        expect = dma.model.execute(d)
        before = dma.stats()
        got, _ = dma.run([d])
        assert got == [(expect, d.tag)], d
        seen.add(expect)
        if expect != DmaError.OK:
            after = dma.stats()
            assert (after["ar_bursts"], after["aw_bursts"]) == (before["ar_bursts"],
                                                                before["aw_bursts"]), d
    assert seen >= {DmaError.BAD_OPTION, DmaError.ROW_BYTES, DmaError.MISALIGNED,
                    DmaError.CHIP_RANGE, DmaError.EXT_RANGE}, seen
    _check_all(dma, dma.model, [], "illegal")


@pytest.mark.parametrize("resp", [2, 3], ids=["SLVERR", "DECERR"])
def test_native_error_responses(dma, resp):
    """Injected error responses on reads and writes, under back-pressure: the
    right code, the bus left clean (no open burst), bytes outside the
    descriptor untouched, and the next descriptors correct."""
    dma.set_params(pause=30, latency=(0, 20), seed=resp)
    code = DmaError.SLVERR if resp == 2 else DmaError.DECERR
    vrb, arb = CONFIG.vmem_row_bytes, CONFIG.acc_row_bytes
    follow = [Descriptor(LOAD, VMEM, 0x300, 40, vrb, vrb, 7000, tag=1),
              Descriptor(STORE, ACC, 0x90000, 40, arb // 2, arb, 10, to_bf16=True, tag=2)]
    for d in (Descriptor(LOAD, VMEM, 0x10000, 2048, vrb, vrb, 0),
              Descriptor(LOAD, ACC, 0x10004, 500, arb - 8, 3 * arb, 0),
              Descriptor(STORE, VMEM, 0x10002, 2048, vrb, vrb, 0),
              Descriptor(STORE, ACC, 0x10000, 500, arb, arb + 16, 0, relu=True)):
        ranges = d.ext_ranges()
        for where in (0.0, 0.3, 0.999):
            s, e = ranges[int(where * len(ranges))]
            lo = s + int(where * (e - s)) // 2 * 2
            dma.clear_errors()
            dma.add_error(lo, lo + 2, resp)
            snapshot = dma.ext.copy()
            got, _ = dma.run([d])
            dma.clear_errors()
            assert got == [(code, 0)], f"{d} with an error at 0x{lo:x}: {got}"
            inside = np.zeros(dma.ext.size, dtype=bool)
            if d.dir == STORE:
                for a, b in ranges:
                    inside[a:b] = True
            assert np.array_equal(dma.ext[~inside], snapshot[~inside]), \
                f"{d}: external bytes outside the descriptor changed"
            dma.model.ext[:] = dma.ext
            if d.dir == LOAD:   # rows inside are undefined; take the RTL's
                chip = dma.model.onchip(d.space)
                chip[d.chip_row:d.chip_row + d.rows] = dma.read_rows(
                    "vmem" if d.space == VMEM else "acc", d.chip_row, d.rows)
            stats = dma.stats()
            assert stats["mem_busy"] == 0 and stats["violations"] == 0, stats
            expect = [(dma.model.execute(f), f.tag) for f in follow]
            assert dma.run(follow)[0] == expect
            _check_all(dma, dma.model, follow + [d], f"after an error in {d}")


def test_native_bursts(dma):
    """Exact burst lists (4 KiB boundaries, the burst-length limit, one burst per
    row when strided) and several reads in flight under latency."""
    dma.set_params(latency=(40, 40), max_reads=16)
    vrb = CONFIG.vmem_row_bytes
    cases = [Descriptor(LOAD, VMEM, 0x20000 - 0x10, 1500, vrb, vrb, 0),
             Descriptor(STORE, VMEM, 0x40002, 700, vrb, vrb, 0),
             Descriptor(LOAD, VMEM, 0x50006, 300, vrb - 4, 4 * vrb, 3000),
             Descriptor(STORE, ACC, 0x60ff0, 20, 40, 40, 0, to_bf16=False)]
    for d in cases:
        expect = bursts(CONFIG, d)
        assert all(n <= CONFIG.dma_max_burst_beats for _, n in expect)
        before = dma.stats()
        assert dma.run([d])[0] == [(dma.model.execute(d), 0)]
        after = dma.stats()
        key = "ar_bursts" if d.dir == LOAD else "aw_bursts"
        assert after[key] - before[key] == len(expect), d
        beats = "r_beats" if d.dir == LOAD else "w_beats"
        assert after[beats] - before[beats] == sum(n for _, n in expect), d
    assert dma.stats()["max_reads_in_flight"] == CONFIG.dma_max_outstanding
    _check_all(dma, dma.model, cases, "bursts")


def test_native_throughput(dma):
    """The issue's goal, in cycles: >= 90 % of the bus peak for 64 KiB loads and
    stores with no back-pressure, also while the array reads VMEM and the
    accumulator and writes the accumulator every cycle (bank conflicts with the
    DMA's store reads and load writes)."""
    dma.set_params()
    vrb, arb = CONFIG.vmem_row_bytes, CONFIG.acc_row_bytes
    size = 64 << 10
    for d in (Descriptor(LOAD, VMEM, 0x100000, size // vrb, vrb, vrb, 0),
              Descriptor(STORE, VMEM, 0x200002, size // vrb, vrb, vrb, 0),
              Descriptor(LOAD, ACC, 0x300004, size // arb, arb, arb, 0),
              Descriptor(STORE, ACC, 0x300000, size // arb, arb, arb, 0),
              Descriptor(STORE, ACC, 0x400000, size // (arb // 2), arb // 2, arb // 2, 0,
                         to_bf16=True)):
        for traffic in (False, "read+write"):
            (res,), cycles = dma.run([d], array_traffic=traffic)
            assert res == (dma.model.execute(d), 0)
            if traffic:   # the array's writes into the last two accumulator rows
                dma.model.acc[-2:] = 0
            rate = size / cycles / CONFIG.axi_data_bytes
            assert rate >= 0.9, f"{d}: {rate:.1%} of peak (array traffic {traffic})"
    _check_all(dma, dma.model, [], "throughput")
    assert np.array_equal(dma.read_rows("acc", 0, CONFIG.acc_rows), dma.model.acc)


@pytest.mark.slow
@pytest.mark.parametrize("preset,bits", [("fpga", 64), ("default", 256), ("default", 512)])
def test_native_random_widths(preset, bits):
    """Other bus widths (the fpga preset's 64-bit bus, 256 and 512 bits) and a
    short burst limit, random traffic under back-pressure."""
    config = ChipConfig.preset(preset).replace(axi_data_bits=bits, dma_max_burst_beats=16,
                                               dma_max_outstanding=2)
    dut = NativeDma(config, pause=40, latency=(0, 20), seed=bits)
    rng = np.random.default_rng(bits)
    model = DmaModel(config)
    dut.ext[:] = rng.integers(0, 256, dut.ext.size, dtype=np.uint8)
    model.ext[:] = dut.ext
    acc = rng.integers(0, 256, model.acc.shape, dtype=np.uint8)
    dut.write_acc(0, acc)
    model.acc[:] = acc
    for _ in range(40):
        batch = [_random_descriptor(rng, config) for _ in range(int(rng.integers(1, 6)))]
        expect = [(model.execute(d), d.tag) for d in batch]
        assert dut.run(batch)[0] == expect, batch
        _check_all(dut, model, batch, f"{bits}-bit", bits)


@pytest.mark.slow
def test_native_random_long(dma):
    rng = np.random.default_rng(4242)
    for pause in (0, 50, 90):
        dma.set_params(pause=pause, latency=(0, 50), seed=pause + 1)
        for _ in range(60):
            batch = [_random_descriptor(rng, CONFIG, big=True)
                     for _ in range(int(rng.integers(1, 6)))]
            expect = [(dma.model.execute(d), d.tag) for d in batch]
            assert dma.run(batch)[0] == expect, batch
            _check_all(dma, dma.model, batch, f"long pause {pause}")


# ------------------------------------------------------------------ byte masks

@pytest.mark.parametrize("n_bytes", [1, 3, 4, 5, 64])
@pytest.mark.parametrize("bits_per_byte", [1, 8])
def test_byte_mask(n_bytes, bits_per_byte):
    """The strobe and data masks (`_byte_mask`, a shifted constant) against a
    mask built byte by byte, for every length a 7-bit count holds (lengths
    beyond `n_bytes` give every byte)."""
    m = Module()
    length, mask = Signal(7), Signal(n_bytes * bits_per_byte)
    m.d.comb += mask.eq(_byte_mask(n_bytes, length, bits_per_byte))
    sim = Simulator(m)
    ones = (1 << bits_per_byte) - 1

    async def check(ctx):
        for n in range(1 << 7):
            ctx.set(length, n)
            expected = sum(ones << (bits_per_byte * j) for j in range(min(n, n_bytes)))
            assert ctx.get(mask) == expected, f"length {n}"
    sim.add_testbench(check)
    sim.run()


# ------------------------------------------------------------------ parameters

def test_descriptor_packing():
    layout = dma_descriptor_layout(CONFIG)
    d = Descriptor(STORE, ACC, 0x12345678, 77, 32, 0xABCDE, 1000, True, True, tag=201)
    fields = unpack_fields(layout, d.pack(CONFIG))
    assert fields == dict(dir=1, space=1, to_bf16=1, relu=1, tag=201, rows=77, row_bytes=32,
                          chip_row=1000, ext_base=0x12345678, ext_stride=0xABCDE, format=0)
    q = d.replace(dir=LOAD, space=VMEM, to_bf16=False, relu=False, format=QuantFormat.Q6_K)
    assert unpack_fields(layout, q.pack(CONFIG))["format"] == QuantFormat.Q6_K.value
    with pytest.raises(ValueError, match=r"rows=70000 does not fit in \d+ bits"):
        pack_fields(layout, rows=70000)
    with pytest.raises(ValueError, match="'bogus' is not a field"):
        pack_fields(layout, bogus=1)
    assert check_descriptor(CONFIG, d) == DmaError.EXT_RANGE
    assert check_descriptor(CONFIG, d.replace(ext_base=0x1234)) == DmaError.OK


@pytest.mark.parametrize("field,value,message", [
    ("acc_banks", 3, "ChipConfig.acc_banks must be a power of two, not 3"),
    ("dma_max_outstanding", 0, "ChipConfig.dma_max_outstanding must be an integer from 1 to 64, not 0"),
    ("dma_max_outstanding", 65, "ChipConfig.dma_max_outstanding must be an integer from 1 to 64, not 65"),
    ("dma_max_burst_beats", 3, "ChipConfig.dma_max_burst_beats must be a power of two from 1 to 256, not 3"),
    ("dma_max_burst_beats", 512, "ChipConfig.dma_max_burst_beats must be a power of two from 1 to 256, not 512"),
])
def test_config_validation(field, value, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        ChipConfig().replace(**{field: value})


def test_axi_signatures():
    s = AXI4Signature(addr_width=32, data_width=128)
    assert s.members["wstrb"].shape == 16 and s.members["rdata"].flow == wiring.In
    assert s == AXI4Signature(addr_width=32, data_width=128, id_width=1)
    lite = AXI4LiteSignature(addr_width=16)
    assert lite.members["wdata"].shape == 32 and "awlen" not in lite.members
    with pytest.raises(ValueError, match="^AXI4 data width must be one of"):
        AXI4Signature(addr_width=32, data_width=96)
    with pytest.raises(ValueError, match="^AXI address width must be an integer from 12 to 64, not 8$"):
        AXI4Signature(addr_width=8, data_width=64)
    with pytest.raises(ValueError, match="^AXI4 ID width must be an integer from 1 to 16, not 0$"):
        AXI4Signature(addr_width=32, data_width=64, id_width=0)
    with pytest.raises(ValueError, match="^AXI4-Lite data width must be 32 or 64, not 128$"):
        AXI4LiteSignature(addr_width=32, data_width=128)


# ------------------------------------------------------------- quantized loads

def _quant_descriptors(rng, config):
    """Quantized loads of every format: random strips written into external
    memory (in the model and the DUT alike by the caller), contiguous or with
    gaps between tile-blocks, interleaved with plain loads."""
    out, writes = [], []
    base = 1 << 23
    for name in config.quant_formats:
        fmt = QuantFormat[name]
        info = QUANT_INFO[fmt]
        blocks = int(rng.integers(1, 4)) if info.block == 32 else int(rng.integers(1, 3))
        raw = random_blocks(fmt, config.cols * blocks, int(rng.integers(1 << 30)))
        chip = repack(raw, fmt, (config.cols, blocks * info.block), config.cols)
        tile = tile_block_bytes(fmt, config.cols)
        stride = tile + config.axi_data_bytes * int(rng.choice([0, 0, 3]))
        for i in range(blocks):
            writes.append((base + i * stride, chip[i * tile:(i + 1) * tile]))
        out.append(Descriptor(DmaDir.LOAD, VMEM, base, blocks * info.block, tile, stride,
                              int(rng.integers(0, CONFIG.vmem_rows - 1024)),
                              tag=int(rng.integers(256)), format=fmt))
        base += blocks * stride + 4096
        out.append(_random_descriptor(rng, config))
    return out, writes


@pytest.mark.parametrize("pause,latency", [(0, (0, 0)), (60, (0, 30))])
def test_native_quantized(dma, pause, latency):
    """Quantized loads of every format expand into VMEM rows as the model's
    (the golden expander), among plain loads and stores, under back-pressure."""
    seed = 300 + pause
    rng = np.random.default_rng(seed)
    dma.set_params(pause=pause, latency=latency, seed=seed)
    for _ in range(3):
        batch, writes = _quant_descriptors(rng, CONFIG)
        _write_both(dma, writes)
        _run_checked(dma, batch, f"quantized, pause {pause}", seed)


def _strip_descriptors(rng, config, names, base):
    """A contiguous quantized strip of each format in `names`, one after the
    other in external memory and in VMEM: (descriptors, writes, beats)."""
    out, writes, beats, row = [], [], 0, 0
    for name in names:
        fmt = QuantFormat[name]
        info = QUANT_INFO[fmt]
        blocks = int(rng.integers(1, 4))
        raw = random_blocks(fmt, config.cols * blocks, int(rng.integers(1 << 30)))
        chip = repack(raw, fmt, (config.cols, blocks * info.block), config.cols)
        tile = tile_block_bytes(fmt, config.cols)
        writes.append((base, chip))
        out.append(Descriptor(DmaDir.LOAD, VMEM, base, blocks * info.block, tile, tile, row,
                              tag=int(rng.integers(256)), format=fmt))
        beats += chip.size // config.axi_data_bytes
        base += chip.size + 64 * int(rng.integers(0, 3))
        row += blocks * info.block
    return out, writes, beats


@pytest.mark.parametrize("pause,latency", [(0, (0, 0)), (50, (0, 30))])
def test_native_quantized_back_to_back(dma, pause, latency):
    """Quantized loads of every format one after the other: the next one's
    bursts issue while this one's beats arrive (receive contexts), each
    block is expanded in its own load's format, completions in order; with
    no stalls the read channel stays busy: the loads take their beats, plus
    one start and one drain of the expander (17 cycles when measured), plus
    at most a cycle each."""
    seed = 500 + pause
    rng = np.random.default_rng(seed)
    dma.set_params(pause=pause, latency=latency, seed=seed)
    names = list(CONFIG.quant_formats) * 2
    rng.shuffle(names)
    batch, writes, beats = _strip_descriptors(rng, CONFIG, names, 1 << 23)
    _write_both(dma, writes)
    cycles = _run_checked(dma, batch, f"back to back, pause {pause}", seed)
    if pause == 0:
        bound = beats + 20 + len(batch)
        assert cycles <= bound, f"{cycles} cycles for {beats} beats of {len(batch)} loads"


def test_native_quantized_illegal(dma):
    """Each check of a quantized load, matching the model, with no bus traffic."""
    dma.set_params()
    q4 = QuantFormat.Q4_0
    tile = tile_block_bytes(q4, CONFIG.cols)
    good = Descriptor(DmaDir.LOAD, VMEM, 0, 64, tile, tile, 0, format=q4)
    cases = {
        DmaError.BAD_OPTION: [good.replace(space=ACC), good.replace(dir=DmaDir.STORE),
                              good.replace(relu=True)],
        DmaError.ROW_BYTES: [good.replace(row_bytes=tile - 16), good.replace(row_bytes=32)],
        DmaError.MISALIGNED: [good.replace(ext_base=8), good.replace(ext_stride=tile + 2),
                              good.replace(rows=48)],
        DmaError.CHIP_RANGE: [good.replace(chip_row=CONFIG.vmem_rows - 32)],
        DmaError.EXT_RANGE: [good.replace(ext_base=CONFIG.ext_mem_bytes - tile)],
    }
    for code, ds in cases.items():
        for d in ds:
            assert dma.model.execute(d) == code, d
            before = dma.stats()
            got, _ = dma.run([d])
            assert got == [(code, d.tag)], d
            after = dma.stats()
            assert after["ar_bursts"] == before["ar_bursts"], d


def test_native_quantized_error_response(dma):
    """An error response during a quantized load completes it with the code
    and leaves the bus clean; the next quantized load is right."""
    dma.set_params(pause=30, latency=(0, 10), seed=9)
    rng = np.random.default_rng(9)
    batch, writes = _quant_descriptors(rng, CONFIG)
    _write_both(dma, writes)
    d = batch[0]
    dma.add_error(d.ext_base + d.row_bytes // 2, d.ext_base + d.row_bytes // 2 + 1, 2)
    got, _ = dma.run([d])
    dma.clear_errors()
    assert got == [(DmaError.SLVERR, d.tag)], got
    assert dma.stats()["mem_busy"] == 0
    expect = [(dma.model.execute(x), x.tag) for x in batch]
    got, _ = dma.run(batch)
    assert got == expect
    _check_all(dma, dma.model, batch, "after an error response")
