"""How fast the whole chip simulates (docs/simulation.md): simulated cycles
and MACs per second of wall time on three workloads, for the default and the
vpu presets, and the share of the wall time spent on the host.

    .venv/bin/python bench/simspeed.py [--presets default,vpu] [--no-rtl] [--repeat 2]

Workloads:

* ``matmul``: one large matmul (256x768 @ 768x1536), operands in external memory;
* ``MiniLM``: all-MiniLM-L6-v2's forward of one 128-token text (the layer ops on
  the host for the default preset, on the vector unit for vpu);
* ``decode-like``: a batch-1 projection (1x576 @ 576x1536, bf16 weights resident
  in external memory): long DMA bursts of weights and one-row tiles, as a
  decoder's decode step.

Each workload runs `--repeat` times on one chip and the last run is reported
(warm: Verilator builds cached, programs compiled, weights uploaded). With
RTL (not `--no-rtl`) the default preset's matmul also runs with every PE's
RTL, on a smaller shape, once on one thread and once on two
(``Chip(threads=2)``). "cycles/s" and "M MAC/s" count the simulator's wall
time only; "host share" is the wall time outside it (compiling, copying,
host layer ops) over the whole.
"""

import argparse

import ml_dtypes
import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import SentenceEncoder
from mxu.sim.report import Results

LONG = ("A tensor processing unit multiplies matrices with a systolic array: a grid of "
        "processing elements, each of which multiplies an activation by a stationary weight "
        "and adds the product to a partial sum flowing down its column. ") * 3


def _matmul(chip, shape, repeat):
    M, K, N = shape
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    for _ in range(repeat):
        chip.matmul(A, B)
    return chip.last_stats


def _decode_like(chip, repeat):
    rng = np.random.default_rng(2)
    W = chip.upload(rng.standard_normal((576, 1536)).astype(np.float32), dtype=ml_dtypes.bfloat16)
    x = chip.upload(rng.standard_normal((1, 576)).astype(np.float32), dtype=ml_dtypes.bfloat16)
    try:
        for _ in range(repeat):
            chip.matmul(x, W, keep=True).free()
        return chip.last_stats
    finally:
        W.free()
        x.free()


def _minilm(chip, vector_ops, repeat):
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=chip, vector_ops=vector_ops)
    ids = encoder.tokenize([LONG])[0]
    sep = encoder.tokenizer.token_to_id("[SEP]")
    ids = [ids[:127] + [sep]]
    for _ in range(repeat):
        encoder.encode_tokens(ids, show_progress_bar=False)
    return encoder.last_stats


def _row(preset, workload, pes, s):
    wall = s.sim_seconds + s.host_seconds
    return [preset, workload, pes, f"{s.cycles:,}", f"{s.macs / 1e6:,.1f}", f"{wall:.2f}",
            f"{s.cycles / s.sim_seconds / 1e3:,.1f}k", f"{s.macs / s.sim_seconds / 1e6:,.1f}",
            f"{100 * s.host_seconds / wall:.1f} %"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="default,vpu", help="comma-separated presets")
    parser.add_argument("--no-rtl", action="store_true", help="skip the all-RTL matmul")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each workload on one chip; the last is reported")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    rows = []
    for preset in args.presets.split(","):
        chip = Chip(ChipConfig.preset(preset), fast_mac=True)
        rows.append(_row(preset, "matmul 256x768x1536", "fast MAC",
                         _matmul(chip, (256, 768, 1536), args.repeat)))
        vector_ops = "chip" if chip.config.vpu else "host"
        rows.append(_row(preset, f"MiniLM 128 tokens ({vector_ops} layer ops)", "fast MAC",
                         _minilm(chip, vector_ops, args.repeat)))
        rows.append(_row(preset, "decode-like 1x576x1536", "fast MAC",
                         _decode_like(chip, args.repeat)))
        if preset == "default" and not args.no_rtl:
            for threads in (1, 2):
                rtl = Chip(ChipConfig.preset(preset), fast_mac=False, threads=threads)
                rows.append(_row(preset, "matmul 128x384x384",
                                 "RTL" + (f", {threads} threads" if threads > 1 else ""),
                                 _matmul(rtl, (128, 384, 384), args.repeat)))
                del rtl
    results = Results("simspeed")
    results.table("whole-chip simulation speed (warm: the last of --repeat runs; cycles/s and "
                  "M MAC/s over the simulator's wall time)",
                  ["preset", "workload", "PEs", "chip cycles", "M MAC", "wall s", "cycles/s",
                   "M MAC/s", "host share"], rows)
    results.write()


if __name__ == "__main__":
    main()
