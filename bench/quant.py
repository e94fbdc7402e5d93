"""Quantized weights at batch 1: cycles of ``x @ W`` for a K x N weight kept
as GGUF blocks and expanded on the chip (one quantized LOAD per K x cols
strip, two strips in flight) against the same weight in bf16 through the
compiler (``chip.matmul``), on the default 16x16 chip. Both results are
checked against the golden model.

    .venv/bin/python bench/quant.py                 # 576 x 1536, Q4_0 Q4_1 Q5_0 Q8_0
    .venv/bin/python bench/quant.py --k 576 --n 1536 --formats Q4_1
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.hdl.quant import QUANT_INFO, QuantFormat, repack, tile_block_bytes
from mxu.sim import Chip
from mxu.sim.compiler.program import Program
from mxu.sim.report import format_table
from mxu.verif import golden
from mxu.verif.quant import dequantize, random_blocks


def quantized_program(config, fmt, k, n, x_at, w_at, out_at):
    """x (1 x k) as k / rows VMEM rows; strip j (k rows) into one of two VMEM
    buffers with one quantized LOAD; per K tile a LOADW and a MATMUL into
    accumulator row j; the compute engine frees a buffer after a strip."""
    R, N = config.rows, config.cols
    kt, groups, tile = k // R, -(-n // N), tile_block_bytes(fmt, N)
    strip = (k // QUANT_INFO[fmt].block) * tile
    base = kt                              # VMEM rows of the two strip buffers
    p = Program().load(ext_addr=x_at, rows=kt, row_bytes=2 * R, vmem_row=0)
    loads = [dict(ext_addr=w_at + j * strip, rows=k, row_bytes=tile,
                  vmem_row=base + (j % 2) * k, format=fmt) for j in range(groups)]
    p.load(**loads[0], push_next=True)
    if groups > 1:
        p.load(**loads[1], push_next=True)
    for j in range(groups):
        for t in range(kt):
            p.loadw(vmem_row=base + (j % 2) * k + t * R, k_rows=R, pop_prev=t == 0)
            last = t == kt - 1
            p.matmul(act_row=t, m_rows=1, out_row=j, seed="zero" if t == 0 else "acc",
                     new_weights=True, push_prev=last and j + 2 < groups,
                     push_next=last and j == groups - 1)
        if j + 2 < groups:
            p.load(**loads[j + 2], pop_next=True, push_next=True)
    p.store(ext_addr=out_at, rows=groups, row_bytes=4 * N, acc_row=0, pop_prev=True)
    return p.halt()


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
    x = golden.as_bf16(rng.standard_normal((1, k)).astype(np.float32))
    rows = []
    for name in args.formats:
        fmt = QuantFormat[name]
        info = QUANT_INFO[fmt]
        raw = random_blocks(fmt, n * k // info.block, 2)
        raw[:, 0:2] = np.array([0.01], np.float16).view(np.uint8) if fmt is not QuantFormat.Q6_K \
            else raw[:, 0:2]                       # finite scales: a readable result
        W = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)     # (k, n)
        want = golden.matmul(x, W, rows=config.rows)
        chip_bytes = repack(raw, fmt, (n, k), config.cols)
        x_at, w_at, out_at = 0x10000, 0x100000, 0x20000
        prog = quantized_program(config, fmt, k, n, x_at, w_at, out_at)
        result = chip.run(prog, {x_at: x.view(np.uint16).tobytes(), w_at: chip_bytes.tobytes()})
        assert result.error == ErrorCode.NONE, result
        got = np.frombuffer(chip.read_memory(out_at, 4 * n), np.float32).reshape(1, n)
        golden.assert_bits_equal(got, want, what=f"{name} x @ W")
        bf16 = chip.matmul(x, W)
        golden.assert_bits_equal(bf16, want, what=f"bf16 x @ W")
        ideal_q = chip_bytes.size / config.axi_data_bytes
        rows.append([name, f"{k}x{n}", result.counters["cycles"], f"{ideal_q:.0f}", chip.last_stats.cycles,
                     f"{2 * k * n / config.axi_data_bytes:.0f}",
                     f"{chip.last_stats.cycles / result.counters['cycles']:.2f}"])
    print(format_table(["format", "weight", "quantized cycles", "bus floor", "bf16 cycles",
                        "bf16 bus floor", "speed-up"], rows))


if __name__ == "__main__":
    main()
