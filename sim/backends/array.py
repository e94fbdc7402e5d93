"""Running the systolic array: `simulate_array` and its three back ends.

* ``"verilator"``: the fast path. The Verilated array is compiled with
  ``sim/backends/csrc/array_harness.cpp`` into a shared library and driven through ctypes;
  the per-cycle loop runs in C++ (docs/simulation.md).
* ``"icarus"``: a generated Verilog testbench reads the streams from hex files
  (``$readmemh``), drives the array and writes the results back.
* ``"amaranth"``: Amaranth's own Python simulator with ``sim.add_testbench``.

All three run every tile back to back in **one** simulation and measure the
cycle contract of docs/array.md: ``cycles`` counts the clock cycles from the one
that accepts the first activation beat to the one that accepts the last result
beat, both included. The first tile's weights are streamed before its first
activation is accepted, so that load is outside the measured window; every later
tile's weights stream while the previous tile computes.
"""

import ctypes
import functools
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from mxu.hdl.array import SystolicArray, array_latency
from mxu.hdl.config import ChipConfig

from .cache import cached_build
from .native import build_native, generator_digest, load_native
from .toolchain import require_simulator
from .verilog import array_verilog

__all__ = ["ArrayStreams", "ArrayRun", "pack_streams", "native_array",
           "run_streams", "simulate_array", "array_latency"]


# ---------------------------------------------------------------------------
# Streams: the beats a controller would send, as bit patterns
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ArrayStreams:
    """The four streams of one run, as bit patterns.

    act : uint16 (N, rows)     activation beats (bf16)
    first : bool (N,)          ``first`` flag of each activation beat
    seed : uint32 (N, cols)    seed beats (fp32), in lockstep with `act`
    weight : uint16 (T*rows, cols)  weight rows, tile after tile, k = 0 first
    tile_rows : tuple of int   M_t, the activation rows of each tile
    """
    rows: int
    cols: int
    act: np.ndarray
    first: np.ndarray
    seed: np.ndarray
    weight: np.ndarray
    tile_rows: tuple

    @property
    def n(self):
        return self.act.shape[0]

    def split(self, result):
        """Cut an (N, cols) result into one array per tile."""
        bounds = np.cumsum((0,) + self.tile_rows)
        return [result[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    # Packed words, laid out as the Verilog ports (bit 0 = bit 0 of word 0).
    def act_words(self):
        words = -(-(16 * self.rows + 1) // 32)
        packed = np.zeros((self.n, 2 * words), np.uint16)
        packed[:, :self.rows] = self.act
        packed[:, self.rows] = self.first
        return np.ascontiguousarray(packed).view(np.uint32)

    def weight_words(self):
        words = -(-self.cols // 2)
        packed = np.zeros((self.weight.shape[0], 2 * words), np.uint16)
        packed[:, :self.cols] = self.weight
        return np.ascontiguousarray(packed).view(np.uint32)

    def seed_words(self):
        return np.ascontiguousarray(self.seed, dtype=np.uint32)


def _bf16_bits(x, what):
    """bf16 bit patterns (uint16) of an ml_dtypes.bfloat16 array, or of a float32
    array whose every value is a bf16 value."""
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return x.view(np.uint16)
    if x.dtype == np.float32:
        bits = x.view(np.uint32)
        bad = np.flatnonzero(bits & 0xFFFF)
        if bad.size:
            i = np.unravel_index(bad[0], x.shape)
            raise ValueError(f"{what} holds float32 values that are not bf16 values "
                             f"(first at index {tuple(map(int, i))}: {x[i]!r}); "
                             f"round them with ml_dtypes.bfloat16 first")
        return (bits >> 16).astype(np.uint16)
    raise TypeError(f"{what} must be an ml_dtypes.bfloat16 or float32 array, not {x.dtype}")


def _tiles(x, name):
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of arrays, one per weight tile, "
                        f"not {type(x).__name__}")
    return list(x)


def pack_streams(A, W, seeds=None, *, rows, cols):
    """Check the operands of `simulate_array` and turn them into `ArrayStreams`."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    A, W = _tiles(A, "A"), _tiles(W, "W")
    if not A:
        raise ValueError("A and W must hold at least one weight tile")
    if len(W) != len(A):
        raise ValueError(f"A has {len(A)} tiles but W has {len(W)}")
    if seeds is not None:
        seeds = _tiles(seeds, "seeds")
        if len(seeds) != len(A):
            raise ValueError(f"A has {len(A)} tiles but seeds has {len(seeds)}")
    acts, firsts, seed_bits, weights, tile_rows = [], [], [], [], []
    for t, (a, w) in enumerate(zip(A, W)):
        a, w = np.asarray(a), np.asarray(w)
        if a.ndim != 2 or a.shape[1] != rows or a.shape[0] < 1:
            raise ValueError(f"A[{t}] must have shape (M, {rows}) with M >= 1, not {a.shape}")
        if w.shape != (rows, cols):
            raise ValueError(f"W[{t}] must have shape {(rows, cols)}, not {w.shape}")
        m = a.shape[0]
        acts.append(_bf16_bits(a, f"A[{t}]"))
        weights.append(_bf16_bits(w, f"W[{t}]"))
        first = np.zeros(m, bool)
        first[0] = True
        firsts.append(first)
        if seeds is None:
            seed_bits.append(np.zeros((m, cols), np.uint32))
        else:
            s = np.asarray(seeds[t])
            if s.dtype != np.float32:
                raise TypeError(f"seeds[{t}] must be a float32 array, not {s.dtype}")
            if s.shape != (m, cols):
                raise ValueError(f"seeds[{t}] must have shape {(m, cols)}, not {s.shape}")
            seed_bits.append(s.view(np.uint32))
        tile_rows.append(m)
    return ArrayStreams(rows=rows, cols=cols, act=np.concatenate(acts), first=np.concatenate(firsts),
                        seed=np.concatenate(seed_bits), weight=np.concatenate(weights),
                        tile_rows=tuple(tile_rows))


# ---------------------------------------------------------------------------
# Verilog and the Verilator fast path
# ---------------------------------------------------------------------------

def _stages(stages):
    return ChipConfig().mac_stages if stages is None else stages


class NativeArray:
    """A Verilated array in a shared library, ready to be called many times."""

    def __init__(self, rows, cols, stages, weight_queue_depth=None, threads=1):
        self.rows, self.cols, self.stages = rows, cols, stages
        self.latency = array_latency(rows, cols, stages)
        flags = ("--threads", str(threads)) if threads > 1 else ()
        suffix = f"_t{threads}" if threads > 1 else ""
        name = f"array{rows}x{cols}s{stages}" + (f"q{weight_queue_depth}" if weight_queue_depth else "")
        self.library = build_native(
            name + suffix, "array_harness.cpp", key=[name], extra_flags=flags,
            verilog=lambda: array_verilog(rows, cols, stages, weight_queue_depth))
        self._lib = load_native(self.library)
        fn = self._lib.mxu_array_run
        u32p = ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_uint64, u32p, u32p, ctypes.c_uint64, u32p, u32p,
                       ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                       ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                       ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)]
        fn.restype = ctypes.c_int64
        self._fn = fn

    def run(self, streams, *, act_valid_percent=100, seed_valid_percent=100,
            weight_valid_percent=100, ready_percent=100, seed=0, max_cycles=None):
        if (streams.rows, streams.cols) != (self.rows, self.cols):
            raise ValueError(f"streams are for a {streams.rows}x{streams.cols} array, "
                             f"this one is {self.rows}x{self.cols}")
        act, seeds, weight = streams.act_words(), streams.seed_words(), streams.weight_words()
        out = np.zeros((streams.n, self.cols), np.uint32)
        stats = (ctypes.c_int64 * 8)()
        if max_cycles is None:
            max_cycles = _watchdog(streams, self.latency, min(act_valid_percent, seed_valid_percent,
                                                              weight_valid_percent, ready_percent))
        p = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
        start = time.perf_counter()
        cycles = self._fn(streams.n, p(act), p(seeds), weight.shape[0], p(weight), p(out),
                          act.shape[1], seeds.shape[1], weight.shape[1], self.cols,
                          act_valid_percent, seed_valid_percent, weight_valid_percent,
                          ready_percent, seed, max_cycles, stats)
        wall = time.perf_counter() - start
        if cycles == -1:
            raise RuntimeError(f"watchdog: the {self.rows}x{self.cols} array did not return "
                               f"{streams.n} results within {max_cycles} cycles")
        if cycles == -2:
            raise AssertionError("the array accepted an activation beat and a seed beat "
                                 "in different cycles (lockstep broken)")
        if cycles == -3:
            raise AssertionError("the array produced a result with no activation beat outstanding")
        return ArrayRun(result=out, cycles=int(cycles), total_cycles=int(stats[0]),
                        act_wait=int(stats[3]), weight_wait=int(stats[4]), out_stall=int(stats[5]),
                        wall_s=wall)


@dataclass(frozen=True)
class ArrayRun:
    """What one run returns: ``result`` (uint32 (N, cols) fp32 bit patterns),
    ``cycles`` (the cycle contract's measure), ``total_cycles`` (after reset,
    including the first weight load), the cycles the array made its inputs
    wait (``act_wait``, ``weight_wait``) or had its result refused (``out_stall``)
    -- Verilator only -- and ``wall_s``, the wall time of the simulation proper
    (no build, no elaboration, no file conversion)."""
    result: np.ndarray
    cycles: int
    total_cycles: int = 0
    act_wait: int = 0
    weight_wait: int = 0
    out_stall: int = 0
    wall_s: float = 0.0


def _watchdog(streams, latency, percent):
    """A generous cycle limit: a hang fails with a message instead of spinning."""
    work = streams.n + streams.weight.shape[0] + latency + 4 * streams.rows + 100
    return int(work * 100 / max(1, percent)) * 4 + 10_000


@functools.lru_cache(maxsize=None)
def native_array(rows, cols, stages, weight_queue_depth=None, threads=1):
    """The (cached) `NativeArray` for one configuration."""
    return NativeArray(rows, cols, stages, weight_queue_depth, threads)


# ---------------------------------------------------------------------------
# Icarus: a generated Verilog testbench with hex files
# ---------------------------------------------------------------------------

_ICARUS_TB = """\
`timescale 1ns/1ps
module tb;
  localparam N = {n}, NW = {nw}, AW = {aw}, SW = {sw}, WW = {ww}, OW = {ow};
  localparam MAX_CYCLES = {max_cycles};
  reg clk = 0, rst = 1;
  reg act_valid = 0, seed_valid = 0, weight_valid = 0, result_ready = 1;
  reg [AW-1:0] act_payload = 0;
  reg [SW-1:0] seed_payload = 0;
  reg [WW-1:0] weight_payload = 0;
  wire act_ready, seed_ready, weight_ready, result_valid, weights_ready, busy;
  wire [OW-1:0] result_payload;
  reg [AW-1:0] act_mem [0:N-1];
  reg [SW-1:0] seed_mem [0:N-1];
  reg [WW-1:0] weight_mem [0:NW-1];
  top dut (
    .clk(clk), .rst(rst),
    .act__valid(act_valid), .act__ready(act_ready), .act__payload(act_payload),
    .seed__valid(seed_valid), .seed__ready(seed_ready), .seed__payload(seed_payload),
    .weight__valid(weight_valid), .weight__ready(weight_ready), .weight__payload(weight_payload),
    .result__valid(result_valid), .result__ready(result_ready), .result__payload(result_payload),
    .weights_ready(weights_ready), .busy(busy));
  always #5 clk = ~clk;
  integer ai = 0, wi = 0, ro = 0, cycle = 0, first_in = -1, last_out = -1, fd;
  reg a_fire, w_fire, o_fire;
  initial begin
    $readmemh("act.hex", act_mem);
    $readmemh("seed.hex", seed_mem);
    $readmemh("weight.hex", weight_mem);
    fd = $fopen("result.hex", "w");
    @(posedge clk); @(posedge clk); #1 rst = 0;
    while (ro < N) begin
      act_valid = ai < N; seed_valid = ai < N; weight_valid = wi < NW;
      if (ai < N) begin act_payload = act_mem[ai]; seed_payload = seed_mem[ai]; end
      if (wi < NW) weight_payload = weight_mem[wi];
      #1;
      a_fire = act_valid & act_ready;
      w_fire = weight_valid & weight_ready;
      o_fire = result_valid & result_ready;
      if (a_fire && first_in < 0) first_in = cycle;
      if (o_fire) begin $fdisplay(fd, "%h", result_payload); ro = ro + 1; last_out = cycle; end
      @(posedge clk); #1;
      if (a_fire) ai = ai + 1;
      if (w_fire) wi = wi + 1;
      cycle = cycle + 1;
      if (cycle > MAX_CYCLES) begin $display("WATCHDOG"); $fclose(fd); $finish; end
    end
    $fclose(fd);
    $display("CYCLES %0d %0d", last_out - first_in + 1, cycle);
    $finish;
  end
endmodule
"""


def _hex_lines(words, bits):
    """One hex line per row of a (n, w) uint32 array, `bits` wide."""
    digits = -(-bits // 4)
    lines = []
    for row in words:
        value = int.from_bytes(np.ascontiguousarray(row).tobytes(), "little")
        lines.append(f"{value:0{digits}x}")
    return "\n".join(lines) + "\n"


def run_icarus(streams, stages):
    """Run `streams` on Icarus; returns an `ArrayRun` (no wait statistics)."""
    rows, cols = streams.rows, streams.cols
    latency = array_latency(rows, cols, stages)
    aw, sw, ww, ow = 16 * rows + 1, 32 * cols, 16 * cols, 32 * cols
    tb = _ICARUS_TB.format(n=streams.n, nw=streams.weight.shape[0], aw=aw, sw=sw, ww=ww, ow=ow,
                           max_cycles=_watchdog(streams, latency, 100))
    name = f"array{rows}x{cols}s{stages}"

    def build(directory, status):
        status("generating Verilog")
        (directory / "top.v").write_text(array_verilog(rows, cols, stages))
        (directory / "tb.v").write_text(tb)
        status("iverilog")
        result = subprocess.run(["iverilog", "-g2012", "-o", str(directory / "tb.vvp"), "-s", "tb",
                                 str(directory / "tb.v"), str(directory / "top.v")],
                                capture_output=True, text=True)
        (directory / "build.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"iverilog failed:\n{result.stdout}{result.stderr}"[-3000:])

    binary = cached_build("icarus", name, [generator_digest(), name, tb], build,
                          artifacts=["tb.vvp"], what=f"{name} (Icarus)") / "tb.vvp"
    with tempfile.TemporaryDirectory(prefix="mxu-icarus-") as work:
        work = Path(work)
        (work / "act.hex").write_text(_hex_lines(streams.act_words(), aw))
        (work / "seed.hex").write_text(_hex_lines(streams.seed_words(), sw))
        (work / "weight.hex").write_text(_hex_lines(streams.weight_words(), ww))
        start = time.perf_counter()
        result = subprocess.run(["vvp", "-n", str(binary)], cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - start
        log = result.stdout + result.stderr
        if "WATCHDOG" in log:
            raise RuntimeError(f"watchdog: the {rows}x{cols} array did not finish on Icarus")
        lines = [l for l in log.splitlines() if l.startswith("CYCLES ")]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"vvp failed:\n{log[-3000:]}")
        cycles, total = (int(x) for x in lines[-1].split()[1:3])
        values = [int(l, 16) for l in (work / "result.hex").read_text().split()]
    out = np.array([[(v >> (32 * c)) & 0xFFFFFFFF for c in range(cols)] for v in values], np.uint32)
    return ArrayRun(result=out.reshape(streams.n, cols), cycles=cycles, total_cycles=total,
                    wall_s=wall)


# ---------------------------------------------------------------------------
# Amaranth's simulator
# ---------------------------------------------------------------------------

def run_amaranth(streams, stages, *, weight_queue_depth=None):
    """Run `streams` on Amaranth's Python simulator; returns an `ArrayRun`."""
    from amaranth.sim import Simulator

    rows, cols = streams.rows, streams.cols
    dut = SystolicArray(rows, cols, stages, weight_queue_depth=weight_queue_depth)
    latency = dut.latency
    pack = lambda words: [int.from_bytes(np.ascontiguousarray(r).tobytes(), "little") for r in words]
    acts, seeds, weights = pack(streams.act_words()), pack(streams.seed_words()), pack(streams.weight_words())
    n, nw = streams.n, len(weights)
    out, marks = [], {}
    limit = _watchdog(streams, latency, 100)

    async def testbench(ctx):
        ai = wi = cycle = 0
        ctx.set(dut.result.ready, 1)
        while len(out) < n:
            ctx.set(dut.act.valid, ai < n)
            ctx.set(dut.seed.valid, ai < n)
            ctx.set(dut.weight.valid, wi < nw)
            if ai < n:
                ctx.set(dut.act.payload.as_value(), acts[ai])
                ctx.set(dut.seed.payload.as_value(), seeds[ai])
            if wi < nw:
                ctx.set(dut.weight.payload.as_value(), weights[wi])
            a_fire = ctx.get(dut.act.valid) and ctx.get(dut.act.ready)
            w_fire = ctx.get(dut.weight.valid) and ctx.get(dut.weight.ready)
            if a_fire and "first" not in marks:
                marks["first"] = cycle
            if ctx.get(dut.result.valid):
                out.append(ctx.get(dut.result.payload.as_value()))
                marks["last"] = cycle
            await ctx.tick()
            ai += a_fire
            wi += w_fire
            cycle += 1
            marks["total"] = cycle
            if cycle > limit:
                raise RuntimeError(f"watchdog: the {rows}x{cols} array did not finish "
                                   f"in Amaranth's simulator")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    start = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - start
    result = np.array([[(v >> (32 * c)) & 0xFFFFFFFF for c in range(cols)] for v in out], np.uint32)
    return ArrayRun(result=result.reshape(n, cols), cycles=marks["last"] - marks["first"] + 1,
                    total_cycles=marks["total"], wall_s=wall)


# ---------------------------------------------------------------------------
# The public API
# ---------------------------------------------------------------------------

def run_streams(streams, *, stages=None, simulator="verilator", **options):
    """Run prepared `ArrayStreams` on `simulator`; `options` (random valid/ready
    percentages, seed) are for the Verilator path only."""
    stages = _stages(stages)
    require_simulator(simulator)
    if simulator == "verilator":
        return native_array(streams.rows, streams.cols, stages).run(streams, **options)
    if options:
        raise ValueError(f"options {sorted(options)} are only supported on Verilator")
    if simulator == "icarus":
        return run_icarus(streams, stages)
    return run_amaranth(streams, stages)


def simulate_array(A, W, seeds=None, *, rows, cols, stages=None, simulator="verilator"):
    """Run T weight tiles back to back through a ``rows x cols`` systolic array.

    Parameters
    ----------
    A : list of T arrays (M_t, rows)
        Activations of each tile (M_t >= 1), ``ml_dtypes.bfloat16`` or float32
        holding bf16 values.
    W : list of T arrays (rows, cols)
        Weight tiles, same dtypes as `A`.
    seeds : None or list of T float32 arrays (M_t, cols)
        Partial-sum seeds; None seeds every output with +0.0.
    rows, cols : int
        Array size.
    stages : int or None
        MAC pipeline depth (1, 2 or 3); None takes ``ChipConfig().mac_stages``.
    simulator : "verilator", "icarus" or "amaranth"

    Returns
    -------
    (C, cycles)
        C: list of T float32 arrays (M_t, cols), ``C[t] = seeds[t] + A[t] @ W[t]``
        computed as docs/numerics.md says. cycles: from the cycle that accepts the
        first activation beat to the cycle that accepts the last result beat, both
        included; ``sum(M_t) + array_latency(rows, cols, stages)`` when every tile
        has M_t >= rows (docs/array.md).
    """
    streams = pack_streams(A, W, seeds, rows=rows, cols=cols)
    run = run_streams(streams, stages=stages, simulator=simulator)
    return [r.view(np.float32) for r in streams.split(run.result)], run.cycles
