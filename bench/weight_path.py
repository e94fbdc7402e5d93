"""The weight path on its own (docs/array.md, section 4): M = 1 matmuls whose
weight tiles are in VMEM already, so that every tile's cycles are its LOADW's.

    python bench/weight_path.py [--tiles 512] [--rtl]

One LOAD brings `--tiles` distinct weight tiles and one activation row into
VMEM; then the compute engine runs `--tiles` LOADW + MATMUL pairs (M = 1,
`mxu.verif.programs.loadw_bound_program`). The results are checked
bit-exact against the golden model. Printed for the default chip with one
and with two weight rows a cycle: chip cycles, and the cycles each further
tile costs (the difference to a run of the first 64 pairs only, with the
same LOAD and STORE, over the tiles added).
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.report import format_table
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=int, default=512)
    parser.add_argument("--rtl", action="store_true", help="the all-RTL chip, not the fast MAC")
    args = parser.parse_args()
    rows = []
    for width in (1, 2):
        config = ChipConfig().replace(weight_rows_per_cycle=width)
        chip = Chip(config, fast_mac=not args.rtl)
        cycles = run(chip, args.tiles, args.tiles)
        per_tile = (cycles - run(chip, args.tiles, BASE_TILES)) / (args.tiles - BASE_TILES)
        rows.append([f"{width}", f"{config.weight_load_cycles}", f"{args.tiles}", f"{cycles:,}",
                     f"{per_tile:.2f}"])
    print(format_table(["weight rows a cycle", "weight_load_cycles", "tiles", "chip cycles",
                        "cycles per further tile"], rows))


if __name__ == "__main__":
    main()
