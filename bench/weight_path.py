"""The weight path on its own (docs/array.md, section 4): M = 1 matmuls whose
weight tiles are in VMEM already, so that every tile's cycles are its LOADW's.

    python bench/weight_path.py [--tiles 512] [--rtl]

One LOAD brings `--tiles` distinct weight tiles and one activation row into
VMEM; then the compute engine runs `--tiles` LOADW + MATMUL pairs (M = 1,
`mxu.verif.programs.loadw_bound_program`). The results are checked
bit-exact against the golden model. Printed for the default chip with one
and with two weight rows a cycle: chip cycles, and the cycles each further
tile costs (the difference to a run of the first 64 pairs only, with the
same LOAD and STORE, over the tiles added); then `Chip.matmul`'s cycles and
utilization on 128x384x384 (prefill-like: the array must stay busy) and on
1x576x1536 (decode-like: bound by the 128-bit bus), checked bit-exact too.
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.report import Results
from mxu.verif import golden
from mxu.verif.programs import loadw_bound_program

BASE_TILES = 64


def run(chip, tiles, used):
    """Chip cycles of the program, its results checked."""
    c = chip.config
    program, image, out, expected = loadw_bound_program(c, np.random.default_rng(0), tiles, used)
    result = chip.run(program, image)
    assert result.ok, result.error
    got = result.memory[out:out + used * c.acc_row_bytes].view(np.float32).reshape(used, c.cols)
    golden.assert_bits_equal(got, expected, "weight-path bench")
    return result.counters["cycles"]


def matmul(chip, M, K, N):
    """`Chip.matmul` of random bf16 operands: (cycles, utilization), checked."""
    rng = np.random.default_rng(M + K + N)
    A = rng.standard_normal((M, K)).astype(golden.bf16).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(golden.bf16).astype(np.float32)
    C = chip.matmul(A, B)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=chip.config.rows), f"{M}x{K}x{N}")
    return chip.last_stats.cycles, chip.last_stats.utilization


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=int, default=512)
    parser.add_argument("--rtl", action="store_true", help="the all-RTL chip, not the fast MAC")
    args = parser.parse_args()
    rows, shapes = [], []
    for width in (1, 2):
        config = ChipConfig().replace(weight_rows_per_cycle=width)
        chip = Chip(config, fast_mac=not args.rtl)
        cycles = run(chip, args.tiles, args.tiles)
        per_tile = (cycles - run(chip, args.tiles, BASE_TILES)) / (args.tiles - BASE_TILES)
        rows.append([f"{width}", f"{config.weight_load_cycles}", f"{args.tiles}", f"{cycles:,}",
                     f"{per_tile:.2f}"])
        for M, K, N in [(128, 384, 384), (1, 576, 1536)]:
            cycles, utilization = matmul(chip, M, K, N)
            shapes.append([f"{M}x{K}x{N}", f"{width}", f"{cycles:,}", f"{100 * utilization:.2f} %"])
    results = Results("weight_path")
    results.table("LOADW-bound programs", ["weight rows a cycle", "weight_load_cycles",
                  "LOADW-bound tiles", "chip cycles", "cycles per further tile"], rows)
    results.table("Matmuls", ["matmul", "weight rows a cycle", "chip cycles", "utilization"],
                  shapes)
    results.write()


if __name__ == "__main__":
    main()
