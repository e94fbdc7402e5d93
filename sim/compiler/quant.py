"""The program of ``x @ W`` with W kept as GGUF blocks on the chip
(docs/compiler.md, "Quantized weights"): one quantized LOAD per K x cols
strip (docs/memory.md, "Quantized loads"), two strips in flight in VMEM, a
LOADW and a MATMUL per K tile, strips in sets of `STRIPS`.

Activations (M x K bf16) go to VMEM once, K tile by K tile; output column
group j accumulates in accumulator rows ``j * M ..``; the stores follow the
last MATMUL.
"""

from mxu.hdl.quant import QUANT_INFO, tile_block_bytes

from .program import Program

__all__ = ["quantized_matmul_program", "quantized_fits"]


# Column strips the array works on together: consecutive MATMULs then write
# different accumulator rows, so one K tile's MATMUL need not wait for the
# previous tile's sum of the same strip to leave the array.
STRIPS = 4


def _strips(config, m, k, n):
    """Strips per set: at most `STRIPS`, as many as two sets of fit VMEM."""
    kt, groups = -(-k // config.rows), -(-n // config.cols)
    for g in range(min(STRIPS, groups), 0, -1):
        if kt * m + 2 * g * k <= config.vmem_rows:
            return g
    return 0


def quantized_fits(config, m, k, n):
    """None if the program fits the chip's memories, else why not."""
    kt, groups = -(-k // config.rows), -(-n // config.cols)
    if not _strips(config, m, k, n):
        return (f"{kt * m + 2 * k} VMEM rows needed (activations {m} x {k} and two "
                f"strips of {k}), the chip has {config.vmem_rows}")
    if groups * m > config.acc_rows:
        return f"{groups * m} accumulator rows needed, the chip has {config.acc_rows}"
    return None


def quantized_matmul_program(config, fmt, m, k, n, *, a_addr, a_stride, w_addr, out_addr,
                             out_stride):
    """C (m x n fp32) = A (m x k bf16, rows `a_stride` bytes apart) @ W, W the
    chip layout of a (n, k) GGUF tensor of `fmt` at `w_addr` (`repack` with
    ``cols = config.cols``). The strips come in sets of `_strips`, two sets
    in VMEM: one loading while the array works on the other, K tile by K
    tile, strip by strip within a tile."""
    R, N = config.rows, config.cols
    kt, groups, tile = -(-k // R), -(-n // N), tile_block_bytes(fmt, N)
    strip = (k // QUANT_INFO[fmt].block) * tile
    g = _strips(config, m, k, n)
    sets = [list(range(j, min(groups, j + g))) for j in range(0, groups, g)]
    base = kt * m                          # the strip buffers follow the activations

    def buffer(s, i):
        return base + ((s % 2) * g + i) * k

    def load_set(p, s):
        for i, j in enumerate(sets[s]):
            p.load(ext_addr=w_addr + j * strip, rows=k, row_bytes=tile, vmem_row=buffer(s, i),
                   format=fmt, pop_next=s >= 2 and i == 0, push_next=i == len(sets[s]) - 1)

    p = Program()
    for t in range(kt):
        p.load(ext_addr=a_addr + 2 * R * t, rows=m, row_bytes=2 * min(R, k - t * R),
               ext_stride=a_stride, vmem_row=t * m)
    for s in range(min(2, len(sets))):
        load_set(p, s)
    for s, js in enumerate(sets):
        for t in range(kt):
            for i, j in enumerate(js):
                p.loadw(vmem_row=buffer(s, i) + t * R, k_rows=min(R, k - t * R),
                        pop_prev=t == 0 and i == 0)
                last = t == kt - 1 and i == len(js) - 1
                p.matmul(act_row=t * m, m_rows=m, out_row=j * m,
                         seed="zero" if t == 0 else "acc", seed_row=j * m, new_weights=True,
                         push_prev=last and s + 2 < len(sets),
                         push_next=last and s == len(sets) - 1)
        if s + 2 < len(sets):
            load_set(p, s + 2)
    for j in range(groups):
        p.store(ext_addr=out_addr + 4 * N * j, rows=m, row_bytes=4 * min(N, n - j * N),
                ext_stride=out_stride, acc_row=j * m, pop_prev=j == 0)
    return p.halt()
