"""Running the systolic array: `simulate_array` and its three back ends.

* ``"verilator"``: the fast path. The Verilated array is compiled with
  ``sim/backends/csrc/array_harness.cpp`` into a shared library and driven through ctypes;
  the per-cycle loop runs in C++ (docs/simulation.md).
* ``"icarus"`` and ``"amaranth"``: the generic stream runner (`runner.py`): a
  generated Verilog testbench with hex files, or Amaranth's own simulator.

All three run every tile back to back in **one** simulation and measure the
cycle contract of docs/array.md: ``cycles`` counts the clock cycles from the one
that accepts the first activation beat to the one that accepts the last result
beat, both included. The first tile's weights are streamed before its first
activation is accepted, so that load is outside the measured window; every later
tile's weights stream while the previous tile computes.
"""

import ctypes
import functools
import time
from dataclasses import dataclass

import numpy as np

from mxu.hdl.array import SystolicArray, array_latency
from mxu.hdl.config import ChipConfig

from .array_streams import ArrayStreams, pack_streams
from .native import native_library
from .runner import InStream, OutStream
from .runner import run_amaranth as amaranth
from .runner import run_icarus as icarus
from .toolchain import require_simulator
from .verilog import array_verilog

__all__ = ["ArrayStreams", "ArrayRun", "pack_streams", "native_array",
           "run_streams", "simulate_array", "array_latency"]


# ---------------------------------------------------------------------------
# Verilog and the Verilator fast path
# ---------------------------------------------------------------------------

def _stages(stages):
    return ChipConfig().mac_stages if stages is None else stages


class NativeArray:
    """A Verilated array in a shared library, ready to be called many times.
    With `fast`, its PE grid is the C++ model of `mxu.sim.backends.fast_array`."""

    def __init__(self, rows, cols, stages, weight_queue_depth=None, threads=1, fast=False,
                 weight_rows=1):
        self.rows, self.cols, self.stages, self.weight_rows = rows, cols, stages, weight_rows
        self.latency = array_latency(rows, cols, stages)
        flags = ("--threads", str(threads)) if threads > 1 else ()
        suffix = f"_t{threads}" if threads > 1 else ""
        name = (f"array{rows}x{cols}s{stages}" + (f"q{weight_queue_depth}" if weight_queue_depth else "")
                + (f"w{weight_rows}" if weight_rows > 1 else "") + ("_fast" if fast else ""))
        self._lib = native_library(
            name + suffix, "array_harness.cpp", key=[name], extra_flags=flags,
            verilog=lambda: array_verilog(rows, cols, stages, weight_queue_depth, fast, weight_rows))
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
        act, seeds = streams.act_words(), streams.seed_words()
        weight = streams.weight_words(self.weight_rows)
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
def native_array(rows, cols, stages, weight_queue_depth=None, threads=1, fast=False, weight_rows=1):
    """The (cached) `NativeArray` for one configuration."""
    return NativeArray(rows, cols, stages, weight_queue_depth, threads, fast, weight_rows)


# ---------------------------------------------------------------------------
# Icarus and Amaranth: the generic stream runner
# ---------------------------------------------------------------------------

def _stream_ports(streams, weight_rows=1):
    """The array's ports as the generic runner sees them."""
    pack = lambda words: tuple(int.from_bytes(np.ascontiguousarray(r).tobytes(), "little")
                               for r in words)
    rows, cols = streams.rows, streams.cols
    inputs = (InStream("act", 16 * rows + 1, pack(streams.act_words())),
              InStream("seed", 32 * cols, pack(streams.seed_words())),
              InStream("weight", 16 * cols * weight_rows, pack(streams.weight_words(weight_rows))))
    return inputs, (OutStream("result", 32 * cols, streams.n),)


def _array_run(streams, run):
    cols = streams.cols
    out = np.array([[(v >> (32 * c)) & 0xFFFFFFFF for c in range(cols)]
                    for v in run.outputs["result"]], np.uint32).reshape(streams.n, cols)
    return ArrayRun(result=out, cycles=run.last["result"] - run.first["act"] + 1,
                    total_cycles=run.cycles, wall_s=run.wall_s)


def run_icarus(streams, stages):
    """Run `streams` on Icarus; returns an `ArrayRun` (no wait statistics)."""
    rows, cols = streams.rows, streams.cols
    inputs, outputs = _stream_ports(streams)
    name = f"array{rows}x{cols}s{stages}"
    run = icarus(name, [name], lambda: array_verilog(rows, cols, stages), inputs, outputs,
                 max_cycles=_watchdog(streams, array_latency(rows, cols, stages), 100))
    return _array_run(streams, run)


def run_amaranth(streams, stages, *, weight_queue_depth=None, weight_rows=1):
    """Run `streams` on Amaranth's Python simulator (an array whose weight port
    takes `weight_rows` rows a beat); returns an `ArrayRun`."""
    dut = SystolicArray(streams.rows, streams.cols, stages, weight_rows=weight_rows,
                        weight_queue_depth=weight_queue_depth)
    inputs, outputs = _stream_ports(streams, weight_rows)
    run = amaranth(dut, inputs, outputs, name=f"the {streams.rows}x{streams.cols} array",
                   max_cycles=_watchdog(streams, dut.latency, 100))
    return _array_run(streams, run)


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
        MAC pipeline depth (1 to 4); None takes ``ChipConfig().mac_stages``.
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
