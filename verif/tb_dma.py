"""cocotb testbench of ``mxu.hdl.dma.DmaSystem`` (DMA + VMEM + accumulator memory)
against cocotbext-axi's AxiRam, a strict AXI4 slave (it asserts on 4 KiB
crossings and misplaced WLAST).

Parameters come as JSON in ``MXU_TB_ARGS``:
    config  -- ChipConfig fields (the build's configuration)
    pause   -- % of cycles each of the five AXI channels pauses (random)
    latency -- maximum random extra latency (cycles) of a read beat
    seed    -- random seed (reported on failure)
    random  -- number of random descriptors in test_random

Every test checks the completion codes against ``mxu.verif.dma_model``, every
byte of the external memory (the whole AxiRam array, so untouched bytes are
checked too) and every row of VMEM and the accumulator memory that a test may
have touched (with neighbours). A watchdog bounds every descriptor batch.
"""

import json
import logging
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from mxu.hdl.config import ChipConfig
from mxu.hdl.dma import DmaDir, DmaError, DmaSpace, dma_completion_layout, unpack_fields
from mxu.hdl.vmem import _addr_shape
from mxu.verif.dma_model import Descriptor, DmaModel, check_descriptor, random_descriptor

ARGS = json.loads(os.environ.get("MXU_TB_ARGS", "{}"))
CONFIG = ChipConfig(**ARGS.get("config", {}))
PAUSE = ARGS.get("pause", 0)
LATENCY = ARGS.get("latency", 0)
SEED = ARGS.get("seed", 1)
RANDOM = ARGS.get("random", 40)
LOAD, STORE = DmaDir.LOAD, DmaDir.STORE
VMEM, ACC = DmaSpace.VMEM, DmaSpace.ACC


class AxiError(Exception):
    """Raised by the wrapped AxiRam for injected errors: AxiRam answers SLVERR."""


class Bench:
    def __init__(self, dut, seed):
        self.dut = dut
        self.rng = np.random.default_rng(seed)
        self.prng = random.Random(seed)
        self.seed = seed
        c = CONFIG
        self.mem = bytearray(c.ext_mem_bytes)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst,
                          size=c.ext_mem_bytes, mem=self.mem)
        for log in (self.ram.write_if.log, self.ram.read_if.log):
            log.setLevel(logging.WARNING)
        self.ext = np.frombuffer(self.mem, dtype=np.uint8)
        self.model = DmaModel(c)
        self.error_ranges = []      # (lo, hi): beats touching them answer SLVERR
        self.read_beats = self.write_ops = 0
        self._wrap_ram()
        if PAUSE:
            for ch in (self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                       self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                       self.ram.read_if.r_channel):
                ch.set_pause_generator(self._pauses(PAUSE))
        self.done_layout = dma_completion_layout(c)
        self.acc_abits = _addr_shape(c.acc_rows).width

    def _pauses(self, pct):
        rng = random.Random(self.prng.random())
        while True:
            yield rng.random() * 100 < pct

    def _wrap_ram(self):
        read, write = self.ram.read_if._read, self.ram.write_if._write
        bench = self

        async def _read(address, length):
            bench.read_beats += 1
            if LATENCY and bench.prng.random() < 0.1:
                await ClockCycles(bench.dut.clk, bench.prng.randint(1, LATENCY))
            if bench._hits(address, length):
                raise AxiError(f"injected read error at 0x{address:x}")
            return await read(address, length)

        async def _write(address, data):
            bench.write_ops += 1
            if bench._hits(address, len(data)):
                raise AxiError(f"injected write error at 0x{address:x}")
            return await write(address, data)

        self.ram.read_if._read = _read
        self.ram.write_if._write = _write

    def _hits(self, address, length):
        return any(address < hi and lo < address + length for lo, hi in self.error_ranges)

    async def start(self):
        dut = self.dut
        Clock(dut.clk, 10, unit="ns").start()
        for sig in (dut.cmd__valid, dut.done__ready, dut.vmem_rd__valid, dut.acc_rd__valid,
                    dut.acc_wr__valid):
            sig.value = 0
        dut.vmem_rd_data__ready.value = 1
        dut.acc_rd_data__ready.value = 1
        dut.rst.value = 1
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        # The on-chip memories keep their contents across the tests of one run.
        self.model.vmem[:] = await self.read_rows(VMEM, 0, CONFIG.vmem_rows)
        self.model.acc[:] = await self.read_rows(ACC, 0, CONFIG.acc_rows)

    def fill_ext(self):
        self.ext[:] = self.rng.integers(0, 256, self.ext.size, dtype=np.uint8)
        self.model.ext[:] = self.ext

    async def fill_acc(self, rows=None):
        """Random accumulator contents (some rows full of fp32 special values)."""
        c = CONFIG
        data = self.rng.integers(0, 256, self.model.acc.shape, dtype=np.uint8)
        specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                             0x00000001, 0x807FFFFF, 0x3F808000, 0x3F818000, 0xBF808001,
                             0x7F7FFFFF, 0xFF7FFFFF, 0x00008000, 0x80018000, 0x7F800001],
                            dtype=np.uint32)
        view = data.view(np.uint32)
        view[::3] = self.rng.choice(specials, size=view[::3].shape)
        rows = range(c.acc_rows) if rows is None else rows
        dut = self.dut
        for r in rows:
            dut.acc_wr__payload.value = r | int.from_bytes(data[r].tobytes(), "little") << self.acc_abits
            dut.acc_wr__valid.value = 1
            await RisingEdge(dut.clk)
            self.model.acc[r] = data[r]
        dut.acc_wr__valid.value = 0

    async def read_rows(self, space, start, n):
        """On-chip rows through the array's read port, as uint8[n, row_bytes]."""
        c = CONFIG
        dut = self.dut
        req, valid = ((dut.vmem_rd__payload, dut.vmem_rd__valid) if space == VMEM
                      else (dut.acc_rd__payload, dut.acc_rd__valid))
        resp = dut.vmem_rd_data__payload if space == VMEM else dut.acc_rd_data__payload
        row_bytes = c.vmem_row_bytes if space == VMEM else c.acc_row_bytes
        out = np.zeros((n, row_bytes), dtype=np.uint8)
        for i in range(n + 1):
            if i < n:
                req.value = start + i
            valid.value = int(i < n)
            await ReadOnly()        # this cycle shows the row requested at the last edge
            if i:
                out[i - 1] = np.frombuffer(resp.value.to_unsigned().to_bytes(row_bytes, "little"),
                                           dtype=np.uint8)
            await RisingEdge(dut.clk)
        valid.value = 0
        return out

    async def run(self, descriptors, *, expect=None, limit=None):
        """Issue `descriptors` back to back; return their completion errors. The
        watchdog fails the test if they are not all complete within `limit` cycles."""
        dut = self.dut
        packed = [d.pack(CONFIG) for d in descriptors]
        if limit is None:
            beats = sum(-(-(e - s) // CONFIG.axi_data_bytes) + 1 for d in descriptors
                        for s, e in d.ext_ranges())
            limit = 2000 + 100 * len(descriptors) + beats * (40 + 20 * LATENCY) * (
                1 if PAUSE < 50 else 4 if PAUSE < 90 else 12)
        sent, got, cycles = 0, [], 0
        dut.done__ready.value = 1
        while len(got) < len(packed):
            if cycles >= limit:
                raise AssertionError(
                    f"watchdog: {len(packed) - len(got)} of {len(packed)} descriptors not "
                    f"complete after {limit} cycles (seed={self.seed}); first pending: "
                    f"{descriptors[len(got)]}")
            if sent < len(packed):
                dut.cmd__valid.value = 1
                dut.cmd__payload.value = packed[sent]
            else:
                dut.cmd__valid.value = 0
            await ReadOnly()
            take_cmd = sent < len(packed) and dut.cmd__ready.value == 1
            if dut.done__valid.value == 1:
                f = unpack_fields(self.done_layout, dut.done__payload.value.to_unsigned())
                got.append((DmaError(f["error"]), f["tag"]))
            await RisingEdge(dut.clk)
            sent += take_cmd
            cycles += 1
        dut.cmd__valid.value = 0
        for d, (err, tag) in zip(descriptors, got):
            assert tag == d.tag, f"completion tag {tag} for {d} (seed={self.seed})"
        errors = [e for e, _ in got]
        if expect is not None:
            assert errors == expect, (f"completions {errors} != expected {expect} for "
                                      f"{descriptors} (seed={self.seed})")
        return errors

    async def execute(self, descriptors):
        """Run on the RTL and on the model; completion codes must agree."""
        expect = [self.model.execute(d) for d in descriptors]
        return await self.run(descriptors, expect=expect)

    async def check(self, what, vmem_rows=None, acc_rows=None):
        """Compare the whole external memory and the given on-chip rows."""
        bad = np.flatnonzero(self.ext != self.model.ext)
        if bad.size:
            i = bad[:8]
            raise AssertionError(f"{what}: {bad.size} external bytes differ (seed={self.seed}) "
                                 f"at {[hex(x) for x in i]}: got {self.ext[i]} want "
                                 f"{self.model.ext[i]}")
        for space, rows, ref in ((VMEM, vmem_rows, self.model.vmem),
                                 (ACC, acc_rows, self.model.acc)):
            if rows is None:
                continue
            lo, hi = max(0, rows[0]), min(ref.shape[0], rows[1])
            got = await self.read_rows(space, lo, hi - lo)
            bad = np.argwhere(got != ref[lo:hi])
            if bad.size:
                r, b = bad[0]
                raise AssertionError(f"{what}: {len(bad)} {space.name} bytes differ (seed="
                                     f"{self.seed}); first row {lo + r} byte {b}: got "
                                     f"{got[r, b]} want {ref[lo + r, b]}")

    def rows_span(self, descriptors, space):
        rows = [(d.chip_row, d.chip_row + d.rows) for d in descriptors if d.space == space]
        if not rows:
            return None
        return (min(r[0] for r in rows) - 2, max(r[1] for r in rows) + 2)


@cocotb.test()
async def test_directed(dut):
    """Hand-picked transfers: aligned and unaligned, contiguous (long bursts, 4 KiB
    splits) and strided, tiny rows, overlapping rows, every store conversion."""
    b = Bench(dut, SEED)
    await b.start()
    b.fill_ext()
    await b.fill_acc()
    c = CONFIG
    vrb, arb, bb = c.vmem_row_bytes, c.acc_row_bytes, c.axi_data_bytes
    rows_4k = min(c.vmem_rows // 2, 2 * 4096 // vrb + 3)
    cases = [
        Descriptor(LOAD, VMEM, 0x0, 4, vrb, vrb, 0, tag=1),
        Descriptor(LOAD, VMEM, 0x1000 - 6, rows_4k, vrb, vrb, 8, tag=2),     # 4 KiB crossings
        Descriptor(LOAD, VMEM, 0x2002, 5, vrb - 2, 3 * vrb, 200, tag=3),   # strided, unaligned
        Descriptor(LOAD, VMEM, 0x3006, 9, 2, 2, 220, tag=4),              # many rows per beat
        Descriptor(LOAD, VMEM, 0x3100, 6, 6, 0, 240, tag=5),              # stride 0: broadcast
        Descriptor(LOAD, VMEM, 0x3202, 7, 10, 4, 250, tag=6),             # overlapping rows
        Descriptor(LOAD, ACC, 0x4004, 6, arb, arb, 3, tag=7),
        Descriptor(LOAD, ACC, 0x4404, 5, 12, 2 * bb + 4, 20, tag=8),
        Descriptor(STORE, VMEM, 0x5002, 9, vrb, vrb, 8, tag=9),
        Descriptor(STORE, VMEM, 0x5402, 5, 6, 6 + bb, 0, relu=True, tag=10),
        Descriptor(STORE, VMEM, 0x5806, 9, 2, 2, 220, tag=11),
        Descriptor(STORE, ACC, 0x6004, 7, arb, arb, 30, tag=12),
        Descriptor(STORE, ACC, 0x6800, 7, arb // 2, arb // 2, 30, to_bf16=True, tag=13),
        Descriptor(STORE, ACC, 0x6C02, 7, arb // 2, arb // 2 + 6, 40, to_bf16=True, relu=True,
                   tag=14),
        Descriptor(STORE, ACC, 0x7004, 6, arb - 4, arb, 50, relu=True, tag=15),
        Descriptor(STORE, VMEM, 0x7802, 6, 10, 4, 250, tag=16),           # overlapping writes
        Descriptor(LOAD, VMEM, c.ext_mem_bytes - vrb, 1, vrb, 0, 300, tag=17),  # last bytes
        Descriptor(LOAD, VMEM, 0x100, 0, vrb, vrb, 0, tag=18),             # empty: no traffic
    ]
    for d in cases:
        await b.execute([d])
        await b.check(f"directed {d}", b.rows_span([d], VMEM), b.rows_span([d], ACC))
    # The same, back to back in one batch.
    await b.execute(cases)
    await b.check("directed batch", (0, c.vmem_rows), (0, c.acc_rows))


@cocotb.test()
async def test_random(dut):
    """Random legal descriptors (odd sizes and strides, unaligned bases, all
    conversions), in random batches; every byte checked after each batch."""
    b = Bench(dut, SEED + 1)
    await b.start()
    b.fill_ext()
    await b.fill_acc()
    left = RANDOM
    while left > 0:
        batch = [random_descriptor(b.rng, CONFIG) for _ in range(min(left, int(b.rng.integers(1, 5))))]
        left -= len(batch)
        await b.execute(batch)
        await b.check(f"random batch {batch}", b.rows_span(batch, VMEM), b.rows_span(batch, ACC))


@cocotb.test()
async def test_illegal(dut):
    """Every descriptor check: the right code, no bus traffic, nothing written,
    and the engine takes the next descriptor."""
    b = Bench(dut, SEED + 2)
    await b.start()
    b.fill_ext()
    c = CONFIG
    vrb, arb = c.vmem_row_bytes, c.acc_row_bytes
    good = Descriptor(LOAD, VMEM, 0x200, 3, vrb, vrb, 5, tag=99)
    cases = [
        (Descriptor(LOAD, VMEM, 0, 1, 2, 2, relu=True), DmaError.BAD_OPTION),
        (Descriptor(LOAD, ACC, 0, 1, 4, 4, to_bf16=True), DmaError.BAD_OPTION),
        (Descriptor(STORE, VMEM, 0, 1, 2, 2, to_bf16=True), DmaError.BAD_OPTION),
        (Descriptor(LOAD, VMEM, 0, 1, vrb + 2, 0), DmaError.ROW_BYTES),
        (Descriptor(STORE, ACC, 0, 1, arb // 2 + 2, 0, to_bf16=True), DmaError.ROW_BYTES),
        (Descriptor(LOAD, ACC, 0, 1, arb + 4, 0), DmaError.ROW_BYTES),
        (Descriptor(LOAD, VMEM, 0x101, 1, 2, 2), DmaError.MISALIGNED),
        (Descriptor(LOAD, VMEM, 0x100, 2, 2, 3), DmaError.MISALIGNED),
        (Descriptor(LOAD, VMEM, 0x100, 2, 3, 4), DmaError.MISALIGNED),
        (Descriptor(LOAD, ACC, 0x102, 1, 4, 4), DmaError.MISALIGNED),
        (Descriptor(STORE, ACC, 0x100, 2, 4, 6), DmaError.MISALIGNED),
        (Descriptor(STORE, ACC, 0x102, 2, 4, 6, to_bf16=True), DmaError.OK),
        (Descriptor(LOAD, VMEM, 0, 2, 2, 2, c.vmem_rows - 1), DmaError.CHIP_RANGE),
        (Descriptor(STORE, ACC, 0, 2, 4, 4, c.acc_rows - 1), DmaError.CHIP_RANGE),
        (Descriptor(LOAD, VMEM, c.ext_mem_bytes - 2, 1, 4, 4), DmaError.EXT_RANGE),
        (Descriptor(STORE, VMEM, c.ext_mem_bytes - 64, 3, 2, 32), DmaError.EXT_RANGE),
        (Descriptor(STORE, VMEM, (1 << c.axi_addr_bits) - 2, 1, 2, 2), DmaError.EXT_RANGE),
        (Descriptor(LOAD, VMEM, 0, 2, 2, (1 << c.axi_addr_bits) - 2), DmaError.EXT_RANGE),
    ]
    for d, code in cases:
        assert check_descriptor(c, d) == code, (d, code)
        await b.execute([d])
        if code != DmaError.OK:
            before = (b.read_beats, b.write_ops)
            await b.execute([d])
            assert (b.read_beats, b.write_ops) == before, f"{d} made bus traffic"
        await b.execute([good])
        await b.check(f"illegal {d}", (0, 16), None)


@cocotb.test()
async def test_error_responses(dut):
    """SLVERR on reads and writes (injected in AxiRam) at the start, middle and
    end of transfers: the error is reported, bytes outside the descriptor's
    ranges are untouched, the engine never hangs and the next descriptor works."""
    b = Bench(dut, SEED + 3)
    await b.start()
    b.fill_ext()
    await b.fill_acc()
    c = CONFIG
    vrb, arb = c.vmem_row_bytes, c.acc_row_bytes
    good_load = Descriptor(LOAD, VMEM, 0x300, 4, vrb, vrb, 100, tag=98)
    good_store = Descriptor(STORE, ACC, 0x9000, 4, arb, arb, 10, tag=99)
    rows = 3 * 4096 // vrb
    for d in (Descriptor(LOAD, VMEM, 0x4000, rows, vrb, vrb, 0, tag=1),
              Descriptor(LOAD, VMEM, 0x4002, 40, vrb - 4, 2 * vrb, 0, tag=2),
              Descriptor(STORE, VMEM, 0x4000, rows, vrb, vrb, 0, tag=3),
              Descriptor(STORE, ACC, 0x4004, 40, arb // 2, arb, 0, to_bf16=True, tag=4)):
        ranges = d.ext_ranges()
        for where in (0.0, 0.5, 0.99):
            s, e = ranges[int(where * len(ranges))]
            lo = s + int(where * (e - s)) // 2 * 2
            b.error_ranges[:] = [(lo, lo + 1)]
            snapshot = b.ext.copy()
            errors = await b.run([d])
            assert errors == [DmaError.SLVERR], f"{d} with an error at 0x{lo:x}: {errors}"
            b.error_ranges[:] = []
            # The model marks the descriptor's external bytes as "don't care".
            if d.dir == STORE:
                outside = np.ones(b.ext.size, dtype=bool)
                for s, e in d.ext_ranges():
                    outside[s:e] = False
                assert np.array_equal(b.ext[outside], snapshot[outside]), \
                    f"{d}: bytes outside the descriptor changed (seed={b.seed})"
                b.model.ext[:] = b.ext
            else:
                assert np.array_equal(b.ext, snapshot)
                b.model.execute(d)   # the rows are garbage now; resync from the RTL below
                got = await b.read_rows(VMEM, d.chip_row, d.rows)
                b.model.vmem[d.chip_row:d.chip_row + d.rows] = got
            await b.execute([good_load, good_store])
            await b.check(f"after an error in {d}", (0, d.rows + 4), (0, 16))
