"""Chip configurations the tests share (each distinct one is a Verilator build)."""

from mxu.hdl import ChipConfig

_SMALL_MEMORIES = dict(vmem_bytes=16 << 10, acc_bytes=16 << 10, ext_mem_bytes=1 << 20)

TINY = ChipConfig(rows=4, cols=4, **_SMALL_MEMORIES)
SHAPES = {
    "1x1": ChipConfig(rows=1, cols=1, **_SMALL_MEMORIES),
    "4x4": TINY,
    "8x8": ChipConfig(rows=8, cols=8, **_SMALL_MEMORIES),
    "3x5": ChipConfig(rows=3, cols=5, **_SMALL_MEMORIES),
    "16x16": ChipConfig(),
}

# With the vector unit (docs/vpu.md): a square and a non-square shape.
VPU_SHAPES = {
    "4x4": TINY.replace(vpu=True),
    "3x5": SHAPES["3x5"].replace(vpu=True),
}
