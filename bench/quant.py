"""Quantized weights: cycles of ``x @ W`` with a K x N weight kept on the
chip as GGUF blocks (``chip.upload_quantized``, expanded on the chip) against
the same weight in bf16 (``chip.matmul`` of the dequantized weights), on the
default 16x16 chip, at batch 1 and a larger M. Both results are checked
against the golden model.

    .venv/bin/python bench/quant.py                 # 576 x 1536 (K-quants 1536 x 576), M 1 and 16
    .venv/bin/python bench/quant.py --k 576 --n 1536 --formats Q4_1 --m 1

A K-quant's K must be a multiple of 256: when ``--k`` is not, K and N swap
(SmolLM2's down projection, the same bytes). The roofline of a run is
``max(weight bytes / bus bytes per cycle, M*K*N / (rows * cols))``. A
second table times one quantized LOAD of a strip alone: the weight path's
rate (its beats, plus a fixed start), and each further LOAD of `BACK_TO_BACK`
in a row (into other VMEM rows): what a LOAD costs in a stream of them.
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.hdl.quant import QUANT_FORMATS, QUANT_INFO, QuantFormat, repack, tile_block_bytes
from mxu.sim import Chip
from mxu.sim.compiler.program import Program
from mxu.sim.report import Results
from mxu.verif import golden
from mxu.verif.quant import D_AT, dequantize, random_blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--formats", nargs="+", default=[f.name for f in QUANT_FORMATS])
    args = ap.parse_args()
    config = ChipConfig()
    chip = Chip(config, fast_mac=True)
    bus, pes = config.axi_data_bytes, config.rows * config.cols
    rng = np.random.default_rng(1)
    rows = []
    for name in args.formats:
        fmt = QuantFormat[name]
        block = QUANT_INFO[fmt].block
        k, n = (args.k, args.n) if args.k % block == 0 else (args.n, args.k)
        raw = random_blocks(fmt, n * k // block, 2)
        at = D_AT.get(fmt, 0)
        raw[:, at:at + 2] = np.array([0.01], np.float16).view(np.uint8)   # finite scales
        W = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)               # (k, n)
        Wq = chip.upload_quantized(raw, name, (n, k), name=f"{name} weight")
        for m in args.m:
            x = rng.standard_normal((m, k)).astype(np.float32)
            want = golden.matmul(x, W, rows=config.rows)
            golden.assert_bits_equal(chip.matmul(x, Wq), want, what=f"{name} x @ W, M {m}")
            quantized = chip.last_stats.cycles
            golden.assert_bits_equal(chip.matmul(x, W), want, what=f"bf16 x @ W, M {m}")
            bf16 = chip.last_stats.cycles
            compute = m * k * n / pes
            roof_q = max(Wq.nbytes / bus, compute)
            roof_b = max(2 * k * n / bus, compute)
            rows.append([name, m, f"{k}x{n}", f"{quantized:,}", f"{roof_q:,.0f}",
                         f"{100 * roof_q / quantized:.1f} %", f"{bf16:,}", f"{roof_b:,.0f}",
                         f"{bf16 / quantized:.2f}"])
        Wq.free()
    results = Results("quant")
    results.table(f"M x K @ K x N on the {config.rows}x{config.cols} chip, fast MAC",
                  ["format", "M", "weight", "quantized cycles", "its roofline", "of roofline",
                   "bf16 cycles", "bf16 roofline", "bf16 / quantized"], rows)
    results.table(f"One LOAD of a K x {config.cols} strip, then HALT, on the "
                  f"{config.rows}x{config.cols} chip", ["format", "K", "beats", "cycles",
                                                        f"each further one of {BACK_TO_BACK}"],
                  _single_loads(chip, config, args.formats))
    results.write()


BACK_TO_BACK = 8


def _single_loads(chip, config, formats):
    """Cycles of a program of one quantized LOAD (and of a bf16 LOAD of the
    same rows), to HALT: the weight path's own rate, without a schedule; and
    the cycles each further LOAD adds when `BACK_TO_BACK` of them follow
    each other."""
    at, rows = 0x40000, []
    for name in formats:
        fmt = QuantFormat[name]
        info = QUANT_INFO[fmt]
        k = 1536 if info.block == 256 else 576
        strip = repack(random_blocks(fmt, config.cols * k // info.block, 3), fmt,
                       (config.cols, k), config.cols)
        image = {at: strip.tobytes()}
        rows.append([name, k, f"{strip.size // config.axi_data_bytes:,}",
                     *_load_cycles(chip, config, image, ext_addr=at, rows=k,
                                   row_bytes=tile_block_bytes(fmt, config.cols), format=fmt)])
    rows.append(["bf16", 576, f"{576 * 2 * config.cols // config.axi_data_bytes:,}",
                 *_load_cycles(chip, config, None, ext_addr=at, rows=576,
                               row_bytes=2 * config.cols)])
    return rows


def _load_cycles(chip, config, image, **load):
    """The cycles of one LOAD to HALT, and what each further one adds in a
    program of `BACK_TO_BACK` (each into its own VMEM rows)."""
    def program(n):
        p = Program()
        for i in range(n):
            p.load(vmem_row=i * load["rows"], **load)
        return p.halt()
    one = _cycles(chip, program(1), image)
    more = (_cycles(chip, program(BACK_TO_BACK), image) - one) / (BACK_TO_BACK - 1)
    return [f"{one:,}", f"{more:,.1f}"]


def _cycles(chip, program, image):
    result = chip.run(program, image)
    if result.error != ErrorCode.NONE:
        raise RuntimeError(f"the LOAD failed: {result}")
    return result.counters["cycles"]


if __name__ == "__main__":
    main()
