"""Python reference of what a DMA descriptor does to memory (``docs/memory.md``).

`DmaModel` holds the external memory, VMEM and the accumulator memory as byte
arrays and applies descriptors to them exactly as ``mxu.hdl.dma.Dma`` must:
the same checks in the same order, the same zero fill, ReLU and fp32->bf16
(round to nearest-even, via `mxu.verif.golden.fp32_to_bf16`). Testbenches run
the same descriptors on the RTL and compare every byte.

`Descriptor` is the Python form of ``dma_descriptor_layout``; ``pack`` turns it
into the integer the RTL's ``cmd.payload`` takes.
"""

from dataclasses import dataclass, replace

import numpy as np

from mxu.hdl.dma import DmaDir, DmaError, DmaSpace, dma_descriptor_layout, pack_fields
from mxu.hdl.quant import QUANT_INFO, QuantFormat, tile_block_bytes
from mxu.verif import golden
from mxu.verif.quant import expand_tiles

__all__ = ["Descriptor", "DmaModel", "check_descriptor", "relu_f32_bits", "relu_bf16_bits",
           "bursts", "random_descriptor"]


@dataclass(frozen=True)
class Descriptor:
    """One DMA descriptor (``docs/memory.md``, "Descriptor")."""
    dir: DmaDir
    space: DmaSpace
    ext_base: int
    rows: int
    row_bytes: int
    ext_stride: int
    chip_row: int = 0
    to_bf16: bool = False
    relu: bool = False
    tag: int = 0
    format: QuantFormat = QuantFormat.NONE   # a quantized load (docs/memory.md)

    def pack(self, config):
        extra = {"format": self.format} if config.quant_formats else {}
        return pack_fields(dma_descriptor_layout(config), dir=self.dir, space=self.space,
                           to_bf16=int(self.to_bf16), relu=int(self.relu), tag=self.tag,
                           rows=self.rows, row_bytes=self.row_bytes, chip_row=self.chip_row,
                           ext_base=self.ext_base, ext_stride=self.ext_stride, **extra)

    @property
    def quantized(self):
        return self.dir == DmaDir.LOAD and self.format != QuantFormat.NONE

    @property
    def units(self):
        """External rows, or a quantized load's tile-blocks."""
        return self.rows // QUANT_INFO[self.format].block if self.quantized else self.rows

    def replace(self, **changes):
        return replace(self, **changes)

    @property
    def contiguous(self):
        return self.ext_stride == self.row_bytes or self.rows == 1

    def ext_ranges(self):
        """The external byte ranges [start, end) the descriptor touches, in order."""
        if self.rows == 0 or self.row_bytes == 0:
            return []
        if self.ext_stride == self.row_bytes or self.units == 1:
            return [(self.ext_base, self.ext_base + self.units * self.row_bytes)]
        return [(self.ext_base + i * self.ext_stride,
                 self.ext_base + i * self.ext_stride + self.row_bytes) for i in range(self.units)]


def relu_f32_bits(x):
    """ReLU on fp32 bit patterns: negative numbers (incl. -0, -inf) -> +0; NaN kept."""
    x = np.asarray(x, dtype=np.uint32)
    nan = (x & 0x7F800000 == 0x7F800000) & (x & 0x007FFFFF != 0)
    return np.where((x >> 31).astype(bool) & ~nan, np.uint32(0), x).astype(np.uint32)


def relu_bf16_bits(x):
    """ReLU on bf16 bit patterns, as `relu_f32_bits`."""
    x = np.asarray(x, dtype=np.uint16)
    nan = (x & 0x7F80 == 0x7F80) & (x & 0x007F != 0)
    return np.where((x >> 15).astype(bool) & ~nan, np.uint16(0), x).astype(np.uint16)


def check_descriptor(config, d):
    """The `DmaError` a descriptor completes with before any bus traffic
    (``DmaError.OK`` if it is legal)."""
    vmem = d.space == DmaSpace.VMEM
    load = d.dir == DmaDir.LOAD
    if (load and (d.to_bf16 or d.relu)) or (vmem and d.to_bf16):
        return DmaError.BAD_OPTION
    if d.format != QuantFormat.NONE:
        return _check_quantized(config, d)
    if vmem:
        limit = config.vmem_row_bytes
    elif load or not d.to_bf16:
        limit = config.acc_row_bytes
    else:
        limit = config.acc_row_bytes // 2
    if d.row_bytes > limit:
        return DmaError.ROW_BYTES
    elem = 4 if (not vmem and not d.to_bf16) else 2
    if (d.ext_base | d.ext_stride | d.row_bytes) % elem:
        return DmaError.MISALIGNED
    chip_rows = config.vmem_rows if vmem else config.acc_rows
    if d.chip_row + d.rows > chip_rows:
        return DmaError.CHIP_RANGE
    if d.rows == 0 or d.row_bytes == 0:
        return DmaError.OK
    if d.ext_base + (d.rows - 1) * d.ext_stride + d.row_bytes > config.ext_mem_bytes:
        return DmaError.EXT_RANGE
    return DmaError.OK


def _check_quantized(config, d):
    """The checks of a descriptor with a format (docs/memory.md, "Quantized loads")."""
    if d.dir != DmaDir.LOAD or d.space != DmaSpace.VMEM or d.format.name not in config.quant_formats:
        return DmaError.BAD_OPTION
    if d.row_bytes != tile_block_bytes(d.format, config.cols):
        return DmaError.ROW_BYTES
    bb = config.axi_data_bytes
    if (d.ext_base | d.ext_stride) % bb or d.rows % QUANT_INFO[d.format].block:
        return DmaError.MISALIGNED
    if d.chip_row + d.rows > config.vmem_rows:
        return DmaError.CHIP_RANGE
    if d.rows == 0:
        return DmaError.OK
    if d.ext_base + (d.units - 1) * d.ext_stride + d.row_bytes > config.ext_mem_bytes:
        return DmaError.EXT_RANGE
    return DmaError.OK


def bursts(config, d):
    """The AXI bursts (aligned address, beats) a legal descriptor issues, in order."""
    bb = config.axi_data_bytes
    out = []
    for start, end in d.ext_ranges():
        x = start // bb * bb
        while x < end:
            n = min(-(-(end - x) // bb), (4096 - x % 4096) // bb, config.dma_max_burst_beats)
            out.append((x, n))
            x += n * bb
    return out


class DmaModel:
    """External memory + VMEM + accumulator memory as byte arrays.

    ``ext``: uint8[ext_bytes]; ``vmem``: uint8[vmem_rows, vmem_row_bytes];
    ``acc``: uint8[acc_rows, acc_row_bytes]. `ext_bytes` defaults to
    ``config.ext_mem_bytes`` (a smaller array suffices when descriptors stay low).
    """

    def __init__(self, config, ext_bytes=None):
        self.config = config
        self.ext = np.zeros(ext_bytes or config.ext_mem_bytes, dtype=np.uint8)
        self.vmem = np.zeros((config.vmem_rows, config.vmem_row_bytes), dtype=np.uint8)
        self.acc = np.zeros((config.acc_rows, config.acc_row_bytes), dtype=np.uint8)

    def onchip(self, space):
        return self.vmem if space == DmaSpace.VMEM else self.acc

    def store_row(self, d, row):
        """The external bytes a store writes for on-chip row `row` (uint8 array)."""
        if d.space == DmaSpace.VMEM:
            x = row.view(np.uint16)
            if d.relu:
                x = relu_bf16_bits(x)
            out = x.view(np.uint8)
        else:
            x = row.view(np.uint32)
            if d.relu:
                x = relu_f32_bits(x)
            if d.to_bf16:
                x = golden.fp32_to_bf16(x)
            out = x.view(np.uint8)
        return out[:d.row_bytes]

    def execute(self, d):
        """Apply descriptor `d`; returns its `DmaError` (errors change nothing)."""
        error = check_descriptor(self.config, d)
        if error != DmaError.OK or d.rows == 0 or d.row_bytes == 0:
            return error
        chip = self.onchip(d.space)
        if d.quantized:
            tiles = np.concatenate([self.ext[a:b] for a, b in
                                    ((d.ext_base + i * d.ext_stride,
                                      d.ext_base + i * d.ext_stride + d.row_bytes)
                                     for i in range(d.units))])
            rows = expand_tiles(tiles, d.format, self.config.cols)
            chip[d.chip_row:d.chip_row + d.rows, :] = 0
            chip[d.chip_row:d.chip_row + d.rows, :2 * self.config.cols] = rows.view(np.uint8).reshape(d.rows, -1)
            return DmaError.OK
        for i in range(d.rows):
            a = d.ext_base + i * d.ext_stride
            if d.dir == DmaDir.LOAD:
                chip[d.chip_row + i, :] = 0
                chip[d.chip_row + i, :d.row_bytes] = self.ext[a:a + d.row_bytes]
            else:
                self.ext[a:a + d.row_bytes] = self.store_row(d, chip[d.chip_row + i])
        return DmaError.OK


def random_descriptor(rng, config, *, max_rows=24, max_stride_elems=300, max_base=None):
    """A random legal descriptor: either direction and space, every store option,
    odd row sizes, contiguous, overlapping or gapped strides, and a base near a
    4 KiB boundary one time in three."""
    d_dir = DmaDir.LOAD if rng.integers(2) == 0 else DmaDir.STORE
    space = DmaSpace.VMEM if rng.integers(2) == 0 else DmaSpace.ACC
    to_bf16 = bool(d_dir == DmaDir.STORE and space == DmaSpace.ACC and rng.integers(2))
    relu = bool(d_dir == DmaDir.STORE and rng.integers(2))
    elem = 4 if space == DmaSpace.ACC and not to_bf16 else 2
    limit = (config.vmem_row_bytes if space == DmaSpace.VMEM else
             config.acc_row_bytes // 2 if to_bf16 else config.acc_row_bytes)
    row_bytes = int(rng.integers(1, limit // elem + 1)) * elem
    rows = int(rng.integers(1, max_rows))
    kind = rng.integers(4)
    stride = (row_bytes if kind < 2 else int(rng.integers(0, 3)) * elem if kind == 2
              else int(rng.integers(row_bytes // elem, max_stride_elems)) * elem)
    span = (rows - 1) * stride + row_bytes
    top = min(max_base or config.ext_mem_bytes, config.ext_mem_bytes - span)
    base = int(rng.integers(0, top // elem)) * elem
    if rng.integers(3) == 0:
        base = max(0, min(config.ext_mem_bytes - span,
                          (base // 4096 + 1) * 4096 - int(rng.integers(0, 48)) * elem))
    chip_rows = config.vmem_rows if space == DmaSpace.VMEM else config.acc_rows
    chip = int(rng.integers(0, chip_rows - rows + 1))
    d = Descriptor(d_dir, space, base, rows, row_bytes, stride, chip, to_bf16, relu,
                   tag=int(rng.integers(256)))
    assert check_descriptor(config, d) == DmaError.OK, d
    return d
