"""cocotb testbench of the systolic array (`mxu.hdl.array.SystolicArray`).

The `TB` class owns the clock, the reset, one driver per input stream (weights,
activations, seeds — the last two driven independently, so the array's lockstep
join is exercised), the result monitor/sink with random back-pressure, the
golden model (`mxu.verif.array_model`), the bit-exact checker and a watchdog.

Parameters come from the environment variable ``MXU_TB_ARGS`` (JSON):
``rows``, ``cols``, ``stages``, ``seed``. Every failure message names the seed.
"""

import json
import os
from collections import deque

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import Event, ReadOnly, RisingEdge, with_timeout

from mxu.hdl.array import bubble_free_rows
from mxu.verif import golden, vectors
from mxu.verif.array_model import array_reference_bits

ARGS = json.loads(os.environ.get("MXU_TB_ARGS", "{}"))
ROWS = int(ARGS.get("rows", 1))
COLS = int(ARGS.get("cols", 1))
STAGES = int(ARGS.get("stages", 2))
SEED = int(ARGS.get("seed", 1))
LATENCY = ROWS * STAGES + COLS - 1


def _pack(values, width):
    """Little-endian concatenation of `width`-bit integers."""
    out = 0
    for i, v in enumerate(values):
        out |= int(v) << (width * i)
    return out


class StreamSource:
    """Drives one ``<name>__valid/__payload`` stream from a queue of payload ints.

    An offered beat stays valid, with its payload unchanged, until accepted (the
    stream rules); with ``valid_percent < 100`` a new beat is offered only with
    that probability each cycle. Records the cycle of every accepted beat."""

    def __init__(self, tb, name, valid_percent=100):
        self.tb, self.name = tb, name
        self.valid = getattr(tb.dut, f"{name}__valid")
        self.ready = getattr(tb.dut, f"{name}__ready")
        self.payload = getattr(tb.dut, f"{name}__payload")
        self.valid_percent = valid_percent
        self.queue = deque()
        self.accepted = []          # cycle numbers
        self.waits = 0              # cycles offered but not accepted
        self.valid.value = 0

    def send(self, payloads):
        self.queue.extend(payloads)

    async def run(self):
        offered = False
        fired = False
        while True:
            await RisingEdge(self.tb.dut.clk)
            if fired:
                self.queue.popleft()
                offered = False
            if not offered and self.queue:
                offered = self.tb.rng.integers(100) < self.valid_percent
            self.valid.value = int(offered)
            if offered:
                self.payload.value = self.queue[0]
            await ReadOnly()
            fired = offered and bool(self.ready.value)
            if fired:
                self.accepted.append(self.tb.cycle)
            elif offered:
                self.waits += 1


class ResultSink:
    """Drives ``result__ready`` (random with ``ready_percent < 100``), collects
    every accepted result beat and checks the stream rule that a refused beat
    stays valid with the same payload."""

    def __init__(self, tb, ready_percent=100):
        self.tb = tb
        self.ready_percent = ready_percent
        self.results = []           # (cycle, payload int)
        self.done = Event()
        self.expected = 0
        self.tb.dut.result__ready.value = 0

    async def run(self):
        dut = self.tb.dut
        held = None
        while True:
            await RisingEdge(dut.clk)
            dut.result__ready.value = int(self.tb.rng.integers(100) < self.ready_percent)
            await ReadOnly()
            valid = bool(dut.result__valid.value)
            if held is not None:
                assert valid and dut.result__payload.value.to_unsigned() == held, (
                    f"result beat changed or vanished while refused (seed={SEED}, "
                    f"cycle {self.tb.cycle})")
            held = None
            if valid:
                payload = dut.result__payload.value.to_unsigned()
                if dut.result__ready.value:
                    self.results.append((self.tb.cycle, payload))
                    if len(self.results) >= self.expected:
                        self.done.set()
                else:
                    held = payload


class TB:
    """Clock, reset, drivers, monitor, model, checker and watchdog of one test."""

    def __init__(self, dut, *, act_valid=100, seed_valid=100, weight_valid=100, ready=100):
        self.dut = dut
        self.rows, self.cols, self.stages = ROWS, COLS, STAGES
        self.rng = np.random.default_rng(SEED)
        self.cycle = 0
        self.act = StreamSource(self, "act", act_valid)
        self.seed = StreamSource(self, "seed", seed_valid)
        self.weight = StreamSource(self, "weight", weight_valid)
        self.sink = ResultSink(self, ready)
        self.tiles = []             # (act bits, weight bits, seed bits)

    async def start(self):
        cocotb.start_soon(Clock(self.dut.clk, 10, unit="ns").start())
        self.dut.rst.value = 1
        for _ in range(2):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        cocotb.start_soon(self._count())
        for part in (self.act, self.seed, self.weight, self.sink):
            cocotb.start_soon(part.run())

    async def _count(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1

    def add_tile(self, act, weight, seed):
        """Queue one tile: act uint16 (M, rows), weight uint16 (rows, cols),
        seed uint32 (M, cols). The first activation row carries ``first``."""
        act, weight, seed = np.asarray(act), np.asarray(weight), np.asarray(seed)
        assert act.shape[1] == self.rows and weight.shape == (self.rows, self.cols)
        self.tiles.append((act, weight, seed))
        self.weight.send(_pack(row, 16) for row in weight)
        self.act.send(_pack(row, 16) | (int(i == 0) << (16 * self.rows)) for i, row in enumerate(act))
        self.seed.send(_pack(row, 32) for row in seed)
        self.sink.expected += act.shape[0]

    async def finish(self, what):
        """Wait for every result (watchdog), then check them bit-exactly."""
        n = sum(t[0].shape[0] for t in self.tiles)
        limit = 40 * (n + len(self.tiles) * self.rows + LATENCY) + 2000
        try:
            await with_timeout(self.sink.done.wait(), 10 * limit, "ns")
        except Exception as e:  # SimTimeoutError
            raise AssertionError(f"watchdog: {len(self.sink.results)} of {n} results after "
                                 f"{limit} cycles (seed={SEED})") from e
        act = np.concatenate([t[0] for t in self.tiles])
        weight = np.concatenate([t[1] for t in self.tiles])
        seed = np.concatenate([t[2] for t in self.tiles])
        tile_rows = tuple(t[0].shape[0] for t in self.tiles)
        expected = array_reference_bits(act, weight, seed, tile_rows, rows=self.rows, cols=self.cols)
        got = np.array([[(p >> (32 * c)) & 0xFFFFFFFF for c in range(self.cols)]
                        for _, p in self.sink.results[:n]], np.uint32)
        golden.assert_bits_equal(got, expected, f"{what} {self.rows}x{self.cols} s{self.stages}",
                                 seed=SEED)
        assert len(self.sink.results) == n, f"{len(self.sink.results)} results for {n} rows"
        assert self.act.accepted == self.seed.accepted, (
            f"activation and seed beats accepted in different cycles (seed={SEED})")
        return self.act.accepted[0], self.sink.results[-1][0]


# ---------------------------------------------------------------------------
# Stimulus
# ---------------------------------------------------------------------------

def _tile_sizes(rows):
    """M = 1, rows-1, rows, 3*rows (rows-1 dropped when it is 0)."""
    return [m for m in (1, rows - 1, rows, 3 * rows) if m >= 1]


def _random_tile(rng, m, rows, cols, special_percent=0):
    act = vectors.random_bf16(rng, m * rows).reshape(m, rows)
    weight = vectors.random_bf16(rng, rows * cols).reshape(rows, cols)
    seed = vectors.random_fp32(rng, m * cols).reshape(m, cols)
    if special_percent:
        for x, pool in ((act, vectors.special_bf16()), (weight, vectors.special_bf16()),
                        (seed, vectors.special_fp32())):
            vectors.salt(rng, x, pool, special_percent)
    return act, weight, seed


def _cancelling_tile(rng, m, rows, cols):
    """Seeds that cancel the dot product: ``seed = -(A @ W)`` rounded, so the
    results are the tiny rounding residuals (or +0 from x + -x)."""
    act = rng.standard_normal((m, rows)).astype(golden.bf16)
    weight = rng.standard_normal((rows, cols)).astype(golden.bf16)
    exact = act.astype(np.float64) @ weight.astype(np.float64)
    seed = (-exact).astype(np.float32)
    seed[rng.integers(100, size=seed.shape) < 20] = -0.0
    return act.view(np.uint16), weight.view(np.uint16), seed.view(np.uint32)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

@cocotb.test()
async def test_tiles_with_random_stalls(dut):
    """Tiles of M = 1, rows-1, rows, 3*rows back to back, random values,
    random gaps on every input stream and random result back-pressure."""
    tb = TB(dut, act_valid=70, seed_valid=80, weight_valid=60, ready=70)
    await tb.start()
    for m in _tile_sizes(tb.rows) * 4:
        tb.add_tile(*_random_tile(tb.rng, m, tb.rows, tb.cols, special_percent=3))
    await tb.finish("random stalls")
    assert tb.sink.results, "no result"


@cocotb.test()
async def test_special_values(dut):
    """bf16/fp32 special classes (+-0, subnormals, normal extremes, +-inf, qNaN,
    sNaN) mixed into activations, weights and seeds; NaN must be canonical."""
    tb = TB(dut, ready=85)
    await tb.start()
    for m in _tile_sizes(tb.rows) * 3:
        tb.add_tile(*_random_tile(tb.rng, m, tb.rows, tb.cols, special_percent=35))
    # all-special tile: every operand special
    tb.add_tile(*_random_tile(tb.rng, 2 * tb.rows, tb.rows, tb.cols, special_percent=100))
    await tb.finish("special values")


@cocotb.test()
async def test_cancellation(dut):
    """Seeds that cancel the dot product: results are rounding residuals."""
    tb = TB(dut, weight_valid=90)
    await tb.start()
    for m in _tile_sizes(tb.rows):
        tb.add_tile(*_cancelling_tile(tb.rng, m, tb.rows, tb.cols))
    await tb.finish("cancellation")


@cocotb.test()
async def test_cycle_contract(dut):
    """T tiles of M >= rows rows at full rate: from the first accepted activation
    to the last accepted result takes exactly sum(M) + latency cycles, and after
    the first tile starts no activation beat ever waits (no bubble)."""
    tb = TB(dut)
    await tb.start()
    least = bubble_free_rows(tb.rows, tb.stages)
    sizes = [least, least + 1, 2 * least, least]
    for m in sizes:
        tb.add_tile(*_random_tile(tb.rng, m, tb.rows, tb.cols))
    first_in, last_out = await tb.finish("cycle contract")
    cycles = last_out - first_in + 1
    assert cycles == sum(sizes) + LATENCY, (
        f"{cycles} cycles for tiles {sizes}: want {sum(sizes)} + latency {LATENCY}")
    accepted = tb.act.accepted
    assert accepted == list(range(accepted[0], accepted[0] + sum(sizes))), "bubble between tiles"


@cocotb.test()
async def test_first_waits_for_weights(dut):
    """A ``first`` beat is held off until its whole tile is staged, and
    ``weights_ready``/``busy`` say so; the active weights start at zero."""
    tb = TB(dut)
    await tb.start()
    rng = tb.rng
    # A beat without `first` before any tile: multiplies by the zero weights.
    act0, _, seed0 = _random_tile(rng, 1, tb.rows, tb.cols)
    tb.act.send([_pack(act0[0], 16)])
    tb.seed.send([_pack(seed0[0], 32)])
    tb.sink.expected += 1
    await with_timeout(tb.sink.done.wait(), 10 * (LATENCY + 20), "ns")
    _, payload = tb.sink.results[0]
    got = np.array([(payload >> (32 * c)) & 0xFFFFFFFF for c in range(tb.cols)], np.uint32)
    # seed + a*(+0) for every k: exactly what the model says for zero weights
    model = array_reference_bits(act0, np.zeros((tb.rows, tb.cols), np.uint16), seed0, (1,),
                                 rows=tb.rows, cols=tb.cols)
    golden.assert_bits_equal(got, model[0], "zero initial weights", seed=SEED)
    tb.sink.results.clear()
    tb.sink.expected = 0
    tb.sink.done.clear()

    # Now a tile whose activations come first and whose weights come late.
    act, weight, seed = _random_tile(rng, tb.rows + 1, tb.rows, tb.cols)
    tb.act.send(_pack(r, 16) | (int(i == 0) << (16 * tb.rows)) for i, r in enumerate(act))
    tb.seed.send(_pack(r, 32) for r in seed)
    tb.sink.expected = act.shape[0]
    for _ in range(5):
        await RisingEdge(dut.clk)
        await ReadOnly()
        assert not dut.weights_ready.value and not dut.act__ready.value, \
            "first beat accepted without weights"
    assert not dut.busy.value
    for row in weight:
        tb.weight.send([_pack(row, 16)])
    await with_timeout(tb.sink.done.wait(), 10 * (10 * tb.rows + LATENCY + 50), "ns")
    got = np.array([[(p >> (32 * c)) & 0xFFFFFFFF for c in range(tb.cols)]
                    for _, p in tb.sink.results], np.uint32)
    model = array_reference_bits(act, weight, seed, (act.shape[0],), rows=tb.rows, cols=tb.cols)
    golden.assert_bits_equal(got, model, "late weights", seed=SEED)
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert not dut.busy.value, "busy after the last result"
