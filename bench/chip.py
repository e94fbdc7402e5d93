"""Utilization and simulation speed of whole matmuls on the simulated chip.

    .venv/bin/python bench/chip.py [--shapes 128x384x384 ...] [--rows 16 --cols 16]

For each shape C[MxN] = A[MxK] @ B[KxN] the table gives the chip's own cycle count
(start to done, operands and results in external memory), the ideal
M*K*N/(rows*cols), the utilization (Gemmini's definition), the wall time of the
simulation and its speed. Every result is checked bit-exact against the golden
model. SCALE-Sim 3.0 (weight-stationary, 16x16) reports 73.6 % on these shapes.

``--pe rtl`` simulates every PE's gate-level fp32 datapath; ``--pe fast`` replaces
only the PE's multiply-add with the same IEEE float32 arithmetic in C
(`mxu.sim.fast_pe`; identical results and cycles); ``--pe both`` (default) runs both.
"""

import argparse
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.report import format_table
from mxu.verif import golden

DEFAULT_SHAPES = ["128x384x384", "128x384x1536", "128x1536x384", "128x512x256", "512x512x512"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, metavar="MxKxN")
    parser.add_argument("--rows", type=int, default=ChipConfig().rows)
    parser.add_argument("--cols", type=int, default=ChipConfig().cols)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pe", choices=["rtl", "fast", "both"], default="both")
    args = parser.parse_args()
    config = ChipConfig(rows=args.rows, cols=args.cols)
    for pe in (["rtl", "fast"] if args.pe == "both" else [args.pe]):
        run(config, args.shapes, args.seed, pe)


def run(config, shapes, seed, pe):
    start = time.perf_counter()
    chip = Chip(config, fast_mac=(pe == "fast"))
    print(f"\n{config.rows}x{config.cols} chip, {pe} PE: model ready in "
          f"{time.perf_counter() - start:.1f} s (build cached after the first run)")
    rng = np.random.default_rng(seed)
    rows, total_cycles, total_wall, total_macs = [], 0, 0.0, 0
    for shape in shapes:
        M, K, N = map(int, shape.split("x"))
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        start = time.perf_counter()
        C = chip.matmul(A, B)
        wall = time.perf_counter() - start
        golden.assert_bits_equal(C, golden.matmul(A, B, rows=config.rows), f"bench {shape}",
                                 seed=seed)
        s = chip.last_stats
        total_cycles += s.cycles
        total_wall += wall
        total_macs += M * K * N
        rows.append([shape, f"{s.cycles:,}", f"{s.ideal_cycles:,.0f}",
                     f"{100 * s.utilization:.1f} %", f"{wall:.2f}",
                     f"{s.cycles / wall:,.0f}", f"{M * K * N / wall / 1e6:.1f}"])
    print(format_table(["M x K x N", "cycles", "ideal", "utilization", "wall s", "cycles/s",
                        "M MAC/s"], rows))
    print(f"{pe} PE: all bit-exact; whole chip simulated at {total_cycles / total_wall:,.0f} cycles/s, "
          f"{total_macs / total_wall / 1e6:.1f} M MAC/s (SCALE-Sim 3.0 WS 16x16: 73.6 % "
          f"utilization on the transformer shapes)")


if __name__ == "__main__":
    main()
