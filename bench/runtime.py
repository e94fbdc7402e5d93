"""The runtime on the default 16x16 chip: many small matmuls as one recorded
program against one program each, and large matmuls with their program size.

    .venv/bin/python bench/runtime.py [--rtl] [--huge] [--no-check]

Every result is checked bit-exact against the golden model (unless
--no-check). The heads write bf16 scores (as the next step, softmax, reads
them); with fp32 scores the 128-bit bus needs 4096 cycles per head to store
64 KiB against 2048 cycles of compute, so that row is store-bound (~50 %). Utilization is the chip's own: ideal cycles (MACs / 256) over the
cycle counter, data starting and ending in external memory. --huge adds
2048x4096x2048 (17 GMAC: several minutes with the fast MAC model).
"""

import argparse
import time

import ml_dtypes
import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.report import Results
from mxu.verif import golden


def _check(C, A, B, rows, enabled):
    if enabled:
        golden.assert_bits_equal(C, golden.matmul(A, B, rows=rows), "bench result")


def heads(chip, rng, check, recorded, out_dtype):
    """Q_h @ K_h^T of 12 heads (128x32 @ 32x128 each), from resident tensors."""
    Q = [rng.standard_normal((128, 32)).astype(np.float32) for _ in range(12)]
    K = [rng.standard_normal((32, 128)).astype(np.float32) for _ in range(12)]
    Qd = [chip.upload(q, dtype=ml_dtypes.bfloat16) for q in Q]
    Kd = [chip.upload(k, dtype=ml_dtypes.bfloat16) for k in K]
    start = time.perf_counter()
    if recorded:
        with chip.record() as rec:
            outs = [chip.matmul(q, k, out_dtype=out_dtype) for q, k in zip(Qd, Kd)]
        stats = rec.stats
        results = [o.numpy() for o in outs]
    else:
        results, stats = [], None
        for q, k in zip(Qd, Kd):
            results.append(chip.matmul(q, k, out_dtype=out_dtype))
            if stats is None:
                stats = chip.last_stats
            else:
                stats += chip.last_stats
    wall = time.perf_counter() - start
    for C, q, k in zip(results, Q, K):
        if np.dtype(out_dtype) == np.float32:
            _check(C, q, k, chip.config.rows, check)
        elif check:
            want = golden.matmul(q, k, rows=chip.config.rows)
            want = golden.fp32_to_bf16(golden.f32_bits(want))
            golden.assert_bits_equal(np.asarray(C).view(np.uint16).astype(np.uint32),
                                     want.astype(np.uint32), "bench head (bf16)")
    return stats, wall


def single(chip, rng, M, K, N, check):
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    start = time.perf_counter()
    C = chip.matmul(A, B)
    wall = time.perf_counter() - start
    _check(C, A, B, chip.config.rows, check)
    return chip.last_stats, wall, 2 * M * K + 2 * K * N + 4 * M * N


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtl", action="store_true", help="all-RTL PEs (slower, same cycles)")
    parser.add_argument("--huge", action="store_true", help="also 2048x4096x2048")
    parser.add_argument("--no-check", action="store_true", help="skip the golden-model checks")
    args = parser.parse_args()
    chip = Chip(ChipConfig(), fast_mac=not args.rtl)
    check = not args.no_check
    rng = np.random.default_rng(1)
    rows = []
    bf16 = ml_dtypes.bfloat16
    for name, recorded, dtype in (
            ("12 heads 128x32 @ 32x128 -> bf16, one recorded program", True, bf16),
            ("12 heads 128x32 @ 32x128 -> bf16, 12 calls", False, bf16),
            ("12 heads 128x32 @ 32x128 -> fp32, one recorded program", True, np.float32)):
        stats, wall = heads(chip, rng, check, recorded, dtype)
        rows.append([name, stats.programs, f"{stats.cycles:,}", f"{stats.ideal_cycles:,.0f}",
                     f"{100 * stats.utilization:.1f} %", f"{stats.program_bytes:,}", "-",
                     f"{wall:.2f}"])
    shapes = [(128, 384, 384), (1024, 1024, 1024)] + ([(2048, 4096, 2048)] if args.huge else [])
    for M, K, N in shapes:
        stats, wall, operand_bytes = single(chip, rng, M, K, N, check)
        rows.append([f"{M}x{K}x{N}", stats.programs, f"{stats.cycles:,}",
                     f"{stats.ideal_cycles:,.0f}", f"{100 * stats.utilization:.1f} %",
                     f"{stats.program_bytes:,}",
                     f"{100 * stats.program_bytes / operand_bytes:.2f} % of {operand_bytes:,}",
                     f"{wall:.2f}"])
    results = Results("runtime")
    results.table(f"mxu runtime on the 16x16 chip ({'RTL' if args.rtl else 'fast MAC'} PEs); "
                  f"every result {'checked bit-exact' if check else 'unchecked'}",
                  ["case", "programs", "cycles", "ideal", "utilization", "program bytes",
                   "program / operands", "wall s"], rows)
    results.write()


if __name__ == "__main__":
    main()
