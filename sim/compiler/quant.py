"""The program of ``x @ W`` with W kept as GGUF blocks on the chip
(docs/compiler.md, "Quantized weights"): one quantized LOAD per K x cols
strip (docs/memory.md, "Quantized loads"), two strips in flight in VMEM, a
LOADW and a MATMUL per K tile.

Activations (M x K bf16) go to VMEM once, K tile by K tile; output column
group j accumulates in accumulator rows ``j * M ..``; the stores follow the
last MATMUL.
"""

from mxu.hdl.quant import QUANT_INFO, tile_block_bytes

from .program import Program

__all__ = ["quantized_matmul_program", "quantized_fits"]


def quantized_fits(config, m, k, n):
    """None if the program fits the chip's memories, else why not."""
    R, N = config.rows, config.cols
    kt, groups = -(-k // R), -(-n // N)
    if kt * m + 2 * k > config.vmem_rows:
        return (f"{kt * m + 2 * k} VMEM rows needed (activations {m} x {k} and two "
                f"strips of {k}), the chip has {config.vmem_rows}")
    if groups * m > config.acc_rows:
        return f"{groups * m} accumulator rows needed, the chip has {config.acc_rows}"
    return None


def quantized_matmul_program(config, fmt, m, k, n, *, a_addr, a_stride, w_addr, out_addr,
                             out_stride):
    """C (m x n fp32) = A (m x k bf16, rows `a_stride` bytes apart) @ W, W the
    chip layout of a (n, k) GGUF tensor of `fmt` at `w_addr` (`repack` with
    ``cols = config.cols``)."""
    R, N = config.rows, config.cols
    kt, groups, tile = -(-k // R), -(-n // N), tile_block_bytes(fmt, N)
    strip = (k // QUANT_INFO[fmt].block) * tile
    base = kt * m                          # the two strip buffers follow the activations
    p = Program()
    for t in range(kt):
        p.load(ext_addr=a_addr + 2 * R * t, rows=m, row_bytes=2 * min(R, k - t * R),
               ext_stride=a_stride, vmem_row=t * m)
    loads = [dict(ext_addr=w_addr + j * strip, rows=k, row_bytes=tile,
                  vmem_row=base + (j % 2) * k, format=fmt) for j in range(groups)]
    for j in range(min(2, groups)):
        p.load(**loads[j], push_next=True)
    for j in range(groups):
        for t in range(kt):
            p.loadw(vmem_row=base + (j % 2) * k + t * R, k_rows=min(R, k - t * R),
                    pop_prev=t == 0)
            last = t == kt - 1
            p.matmul(act_row=t * m, m_rows=m, out_row=j * m, seed="zero" if t == 0 else "acc",
                     seed_row=j * m, new_weights=True,
                     push_prev=last and j + 2 < groups, push_next=last and j == groups - 1)
        if j + 2 < groups:
            p.load(**loads[j + 2], pop_next=True, push_next=True)
    for j in range(groups):
        p.store(ext_addr=out_addr + 4 * N * j, rows=m, row_bytes=4 * min(N, n - j * N),
                ext_stride=out_stride, acc_row=j * m, pop_prev=j == 0)
    return p.halt()
