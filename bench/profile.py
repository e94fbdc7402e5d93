"""The profiler on the 16x16 chip (fast MAC): what tracing costs, and where the
cycles of 128x384x384 and of one all-MiniLM-L6-v2 layer (128 tokens) go.

    .venv/bin/python bench/profile.py [--out DIR]

Writes DIR/matmul.json, DIR/matmul.png, DIR/layer.json, DIR/layer.png (default
DIR: the current directory) and prints the tables.
"""

import argparse
import time
from pathlib import Path

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.cli import print_profile
from mxu.sim.models import SentenceEncoder
from mxu.sim.report import Results


def _matmul(chip, rng, M=128, K=384, N=384):
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    chip.matmul(A, B)               # compile once: measure the run alone
    start = time.perf_counter()
    chip.matmul(A, B)
    return time.perf_counter() - start, chip.last_stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for the JSON and PNG files")
    args = parser.parse_args()
    out = Path(args.out)
    rng = np.random.default_rng(1)
    plain = Chip(ChipConfig(), fast_mac=True)
    traced = Chip(ChipConfig(), fast_mac=True, trace=True)
    rows = []
    for name, chip in (("tracing off (plain build)", plain), ("tracing on", traced)):
        walls = []
        for _ in range(3):
            wall, stats = _matmul(chip, rng)
            walls.append(wall)
        wall = sorted(walls)[1]
        rows.append([name, f"{stats.cycles:,}", f"{wall:.3f}", f"{stats.cycles / wall:,.0f}"])
    results = Results("profile")
    results.table("128x384x384, median of 3 runs", ["model", "cycles", "wall s", "cycles/s"], rows)
    results.write()
    print()
    A = rng.standard_normal((128, 384)).astype(np.float32)
    B = rng.standard_normal((384, 384)).astype(np.float32)
    traced.matmul(A, B)                 # compile outside the profile
    with traced.profile() as prof:
        traced.matmul(A, B)
    print("128x384x384:")
    print_profile(prof.trace, json_path=out / "matmul.json", png_path=out / "matmul.png")
    print()
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=traced)
    ids = encoder.tokenize(["The quick brown fox jumps over the lazy dog. " * 14])[0]
    ids = ids[:127] + [ids[-1]]
    batch, = encoder.batches([ids])
    x = encoder.encoder.embeddings(batch.ids, batch.positions)
    with traced.profile() as prof:
        encoder.encoder.run_layer(0, x, batch.mask)
    print("one all-MiniLM-L6-v2 layer, 128 tokens:")
    print_profile(prof.trace, json_path=out / "layer.json", png_path=out / "layer.png")


if __name__ == "__main__":
    main()
