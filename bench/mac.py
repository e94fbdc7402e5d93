"""Vectors per second of `simulate_mac` on each simulator, in one run.

    .venv/bin/python bench/mac.py [--vectors 1000000] [--small 20000]

Verilator streams `--vectors` MACs; Icarus and Amaranth's simulator, which are
far slower, stream `--small`. Builds are cached and not timed (a warm-up run
builds them). Every result is checked bit-exact against the golden model.
"""

import argparse
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import simulate_mac
from mxu.sim.backends.toolchain import icarus_available
from mxu.sim.report import Results
from mxu.verif import golden, vectors


def measure(simulator, n, stages, seed=1):
    a, w, acc = vectors.mac_vectors(np.random.default_rng(seed), n)
    simulate_mac(a[:16], w[:16], acc[:16], stages=stages, simulator=simulator)  # build
    start = time.perf_counter()
    out = simulate_mac(a, w, acc, stages=stages, simulator=simulator)
    elapsed = time.perf_counter() - start
    golden.assert_bits_equal(out, golden.mac(a, w, acc), f"bench {simulator}", seed=seed)
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--stages", type=int, default=ChipConfig().mac_stages)
    args = parser.parse_args()

    runs = [("verilator", args.vectors), ("amaranth", args.small)]
    if icarus_available():
        runs.insert(1, ("icarus", args.small))
    else:
        print("icarus: skipped, iverilog is not installed")
    rows = []
    base = None
    for simulator, n in runs:
        elapsed = measure(simulator, n, args.stages)
        rate = n / elapsed
        base = base or rate
        rows.append([simulator, f"{n:,}", f"{elapsed:.2f}", f"{rate:,.0f}", f"{rate / base:.4f}"])
    results = Results("mac")
    results.table(f"simulate_mac, MacUnit(stages={args.stages}), bit-exact vs golden model",
                  ["simulator", "vectors", "seconds", "vectors/s", "vs verilator"], rows)
    results.write()


if __name__ == "__main__":
    main()
