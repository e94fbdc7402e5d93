"""Simulation speed of the systolic array: simulated cycles/s and MAC/s, in one
run, for Verilator (single-threaded and ``--threads 2``), Icarus and Amaranth's
own simulator on the same RTL and the same kind of workload (docs/performance.md).

    .venv/bin/python bench/systolic_array.py            # the full table
    .venv/bin/python bench/systolic_array.py --quick    # smaller workloads

Builds are done (and cached) before timing; the time is that of the simulation
proper: the C++ loop for Verilator (ctypes harness, no VPI), ``Simulator.run()``
for Amaranth, and for Icarus the difference between a long and a short ``vvp``
run (so the seconds of netlist elaboration and hex-file reading that every
``vvp`` start costs are not charged to the cycles). Every run
is checked bit-exactly against the golden model, so a fast wrong answer cannot
make the table. MAC/s counts the useful rows*cols MACs of every activation row.
"""

import os
import sys

# This file is named like the standard library's `array` module, which numpy
# imports: keep the script's own directory off the module path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from mxu.sim.backends.array import native_array, pack_streams, run_amaranth, run_icarus  # noqa: E402
from mxu.sim.backends.toolchain import icarus_available  # noqa: E402
from mxu.sim.report import Results  # noqa: E402
from mxu.verif.array_model import array_reference_bits  # noqa: E402

STAGES = 2


def workload(rows, cols, activation_rows, seed=0):
    """Tiles of 4*rows activation rows, back to back, ~`activation_rows` in all."""
    rng = np.random.default_rng(seed)
    m = 4 * rows
    tiles = max(1, activation_rows // m)
    A = [rng.standard_normal((m, rows)).astype(ml_dtypes.bfloat16) for _ in range(tiles)]
    W = [rng.standard_normal((rows, cols)).astype(ml_dtypes.bfloat16) for _ in range(tiles)]
    S = [rng.standard_normal((m, cols)).astype(np.float32) for _ in range(tiles)]
    return pack_streams(A, W, S, rows=rows, cols=cols)


def check(streams, run, what):
    expected = array_reference_bits(streams.act, streams.weight, streams.seed, streams.tile_rows,
                                     rows=streams.rows, cols=streams.cols)
    if not np.array_equal(run.result, expected):
        raise SystemExit(f"{what}: results differ from the golden model")


def measure(simulator, rows, cols, activation_rows, threads=1):
    streams = workload(rows, cols, activation_rows)
    if simulator == "verilator":
        model = native_array(rows, cols, STAGES, threads=threads)
        model.run(workload(rows, cols, 2 * rows))       # warm up (loads the library)
        run = model.run(streams)
    elif simulator == "icarus":
        short = workload(rows, cols, max(4 * rows, activation_rows // 4))
        run_icarus(short, STAGES)                        # builds the testbenches
        run_icarus(streams, STAGES)
        first, run = run_icarus(short, STAGES), run_icarus(streams, STAGES)
        check(streams, run, f"icarus {rows}x{cols}")
        cycles = run.total_cycles - first.total_cycles
        seconds = run.wall_s - first.wall_s
        macs = (streams.n - short.n) * rows * cols
        return cycles, seconds, cycles / seconds, macs / seconds
    else:
        run = run_amaranth(streams, STAGES)
    check(streams, run, f"{simulator} {rows}x{cols}")
    macs = streams.n * rows * cols
    return run.total_cycles, run.wall_s, run.total_cycles / run.wall_s, macs / run.wall_s


def main(argv=None):
    parser = argparse.ArgumentParser(description="systolic-array simulation speed")
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    args = parser.parse_args(argv)
    scale = 0.1 if args.quick else 1.0

    # (simulator, rows, cols, activation rows, Verilator threads)
    plan = [
        ("verilator", 4, 4, 400_000, 1), ("verilator", 8, 8, 200_000, 1),
        ("verilator", 16, 16, 60_000, 1),
        ("verilator", 4, 4, 20_000, 2), ("verilator", 8, 8, 20_000, 2),
        ("verilator", 16, 16, 10_000, 2),
        ("icarus", 4, 4, 3_000, 1), ("icarus", 8, 8, 800, 1), ("icarus", 16, 16, 256, 1),
        ("amaranth", 4, 4, 300, 1),
    ]
    header = ["simulator", "array", "cycles", "seconds", "cycles/s", "MAC/s", "vs Verilator"]
    rows_out, base = [], {}
    for simulator, rows, cols, n, threads in plan:
        if simulator == "icarus" and not icarus_available():
            print("skipping Icarus: iverilog not installed", file=sys.stderr)
            continue
        name = simulator + (f" --threads {threads}" if threads > 1 else "")
        print(f"running {name} {rows}x{cols} ...", file=sys.stderr, flush=True)
        cycles, seconds, cps, macs = measure(simulator, rows, cols, max(4 * rows, int(n * scale)),
                                             threads)
        if simulator == "verilator" and threads == 1:
            base[(rows, cols)] = cps
        ratio = f"{cps / base[(rows, cols)]:.3g}x" if (rows, cols) in base else "-"
        rows_out.append([name, f"{rows}x{cols}", cycles, f"{seconds:.2f}", f"{cps:,.0f}",
                         f"{macs / 1e6:,.2f} M", ratio])
    results = Results("systolic_array", argv=None if argv is None else [sys.argv[0], *argv])
    results.table("systolic-array simulation speed", header, rows_out)
    results.write()


if __name__ == "__main__":
    main()
