"""Utilization and simulation speed of whole matmuls on the simulated chip.

    .venv/bin/python bench/chip.py [--shapes 128x384x384 ...] [--rows 16 --cols 16]

For each shape C[MxN] = A[MxK] @ B[KxN] the table gives the chip's own cycle count
(start to done, operands and results in external memory), the ideal
M*K*N/(rows*cols), the utilization (Gemmini's definition), the wall time of the
simulation and its speed. Every result is checked bit-exact against the golden
model. SCALE-Sim 3.0 (weight-stationary, 16x16) reports 73.6 % on these shapes.

``--pe rtl`` simulates every PE's gate-level fp32 datapath; ``--pe fast`` replaces
the PE grid with one C++ model of the same IEEE float32 arithmetic and cycles
(`mxu.sim.backends.fast_array`; identical results and cycles); ``--pe both``
(default) runs both.

``--plot FILE.png`` instead measures utilization against matrix size (square
n x n x n and M = 128 shapes) on the 8x8 and 16x16 chips with the fast MAC, and
plots it beside SCALE-Sim 3.0's weight-stationary figure for the same shapes
(`scale_sim_ws`); it prints the table too.
"""

import argparse
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.report import Results
from mxu.verif import golden

DEFAULT_SHAPES = ["128x384x384", "128x384x1536", "128x1536x384", "128x512x256", "512x512x512"]


SQUARE = [32, 64, 128, 256, 512]
M128 = [(128, 128, 128), (128, 384, 384), (128, 512, 256), (128, 384, 1536), (128, 1536, 384)]


def scale_sim_ws(M, K, N, rows, cols):
    """SCALE-Sim 3.0's weight-stationary utilization: each of the
    ceil(K/rows) * ceil(N/cols) folds loads its weights (rows cycles), then
    streams M rows through the array and drains it (M + rows + cols - 2), with
    no overlap between folds. This reproduces its 73.6 % on 128x384x384 (16x16)."""
    folds = -(-K // rows) * -(-N // cols)
    return M * K * N / (rows * cols) / (folds * (M + 2 * rows + cols - 2))


def plot(path, seed):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    table = []
    for size, colour in ((8, "tab:blue"), (16, "tab:orange")):
        config = ChipConfig(rows=size, cols=size)
        chip = Chip(config, fast_mac=True)
        for ax, shapes, label in ((axes[0], [(n, n, n) for n in SQUARE], "n"),
                                  (axes[1], M128, "K x N (M = 128)")):
            ours, theirs = [], []
            for M, K, N in shapes:
                A = rng.standard_normal((M, K)).astype(np.float32)
                B = rng.standard_normal((K, N)).astype(np.float32)
                golden.assert_bits_equal(chip.matmul(A, B), golden.matmul(A, B, rows=size),
                                         f"{M}x{K}x{N}")
                ours.append(100 * chip.last_stats.utilization)
                theirs.append(100 * scale_sim_ws(M, K, N, size, size))
                table.append([f"{size}x{size}", f"{M}x{K}x{N}", f"{ours[-1]:.1f} %",
                              f"{theirs[-1]:.1f} %"])
            x = range(len(shapes))
            ax.plot(x, ours, "o-", color=colour, label=f"mxu {size}x{size}")
            ax.plot(x, theirs, "s--", color=colour, alpha=0.6, label=f"SCALE-Sim WS {size}x{size}")
            ax.set_xticks(list(x), [f"{K}x{N}" if label != "n" else str(M) for M, K, N in shapes],
                          rotation=20)
            ax.set_xlabel(label)
    for ax, title in zip(axes, ("square n x n x n", "M = 128 (transformer shapes)")):
        ax.set_title(title)
        ax.set_ylabel("utilization %")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("mxu (chip cycle counters, bit-exact) against SCALE-Sim 3.0 weight-stationary")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    results = Results("chip_plot")
    results.table("utilization against size, mxu and SCALE-Sim 3.0 weight-stationary",
                  ["array", "M x K x N", "mxu", "SCALE-Sim WS"], table)
    results.write()
    print(f"plot written to {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, metavar="MxKxN")
    parser.add_argument("--rows", type=int, default=ChipConfig().rows)
    parser.add_argument("--cols", type=int, default=ChipConfig().cols)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pe", choices=["rtl", "fast", "both"], default="both")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="utilization against size on 8x8 and 16x16, beside SCALE-Sim")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.seed)
        return
    config = ChipConfig(rows=args.rows, cols=args.cols)
    results = Results("chip")
    for pe in (["rtl", "fast"] if args.pe == "both" else [args.pe]):
        run(config, args.shapes, args.seed, pe, results)
    results.write()


def run(config, shapes, seed, pe, results):
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
    results.table(f"{config.rows}x{config.cols} chip, {pe} PE",
                  ["M x K x N", "cycles", "ideal", "utilization", "wall s", "cycles/s", "M MAC/s"],
                  rows)
    print(f"{pe} PE: all bit-exact; whole chip simulated at {total_cycles / total_wall:,.0f} cycles/s, "
          f"{total_macs / total_wall / 1e6:.1f} M MAC/s (SCALE-Sim 3.0 WS 16x16: 73.6 % "
          f"utilization on the transformer shapes)")


if __name__ == "__main__":
    main()
