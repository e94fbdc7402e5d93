"""Quantized weights at batch 1: cycles of ``x @ W`` with a K x N weight kept
on the chip as GGUF blocks (``chip.upload_quantized``, expanded on the chip)
against the same weight in bf16 (``chip.matmul`` of the dequantized
weights), on the default 16x16 chip. Both results are checked against the
golden model.

    .venv/bin/python bench/quant.py                 # 576 x 1536, Q4_0 Q4_1 Q5_0 Q8_0
    .venv/bin/python bench/quant.py --k 576 --n 1536 --formats Q4_1
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.hdl.quant import QUANT_INFO, QuantFormat
from mxu.sim import Chip
from mxu.sim.report import Results
from mxu.verif import golden
from mxu.verif.quant import D_AT, dequantize, random_blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--formats", nargs="+", default=["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
    args = ap.parse_args()
    config = ChipConfig()
    chip = Chip(config, fast_mac=True)
    k, n = args.k, args.n
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, k)).astype(np.float32)
    rows = []
    for name in args.formats:
        fmt = QuantFormat[name]
        raw = random_blocks(fmt, n * k // QUANT_INFO[fmt].block, 2)
        at = D_AT.get(fmt, 0)
        raw[:, at:at + 2] = np.array([0.01], np.float16).view(np.uint8)   # finite scales
        W = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)               # (k, n)
        want = golden.matmul(x, W, rows=config.rows)
        Wq = chip.upload_quantized(raw, name, (n, k), name=f"{name} weight")
        golden.assert_bits_equal(chip.matmul(x, Wq), want, what=f"{name} x @ W")
        quantized = chip.last_stats.cycles
        golden.assert_bits_equal(chip.matmul(x, W), want, what="bf16 x @ W")
        bf16 = chip.last_stats.cycles
        rows.append([name, f"{k}x{n}", quantized, f"{Wq.nbytes / config.axi_data_bytes:.0f}",
                     bf16, f"{2 * k * n / config.axi_data_bytes:.0f}", f"{bf16 / quantized:.2f}"])
        Wq.free()
    results = Results("quant")
    results.table(f"1 x {k} @ {k} x {n} on the {config.rows}x{config.cols} chip, fast MAC",
                  ["format", "weight", "quantized cycles", "its bus floor", "bf16 cycles",
                   "bf16 bus floor", "bf16 / quantized"], rows)
    results.write()


if __name__ == "__main__":
    main()
