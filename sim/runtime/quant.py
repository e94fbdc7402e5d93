"""Quantized weights on the chip: `QuantizedTensor`, what
`Chip.upload_quantized` returns (docs/runtime.md, "Quantized weights")."""

import numpy as np

from mxu.hdl.quant import QUANT_INFO, quant_format, repack, tile_block_bytes

from ..compiler.operands import QuantOperand

__all__ = ["QuantizedTensor", "upload_quantized"]


class QuantizedTensor:
    """A weight W (K = in, N = out) kept on the chip as its GGUF blocks, in the
    chip's tile-block layout (docs/memory.md, "Quantized loads"): the weights
    operand of `Chip.matmul`. ``shape`` is (K, N), the way the matmul uses it;
    ``format`` a `QuantFormat`; ``nbytes`` the bytes it holds (the file's,
    plus the zero blocks that pad N to a multiple of ``cols``)."""

    def __init__(self, chip, block, fmt, shape, name):
        self.chip, self._block, self.format, self.shape, self.name = chip, block, fmt, shape, name

    @property
    def addr(self):
        self._alive()
        return self._block.addr

    @property
    def nbytes(self):
        return self._block.nbytes

    def _alive(self, rerun=False):
        if self._block is None:
            raise ValueError(f"{self!r} was freed")

    @property
    def freed(self):
        return self._block is None

    def operand(self):
        """The compiler's `QuantOperand` of these weights."""
        self._alive()
        k, n = self.shape
        cols = self.chip.config.cols
        strip = k // QUANT_INFO[self.format].block * tile_block_bytes(self.format, cols)
        return QuantOperand(self.addr, k, n, self.format, strip, cols)

    def free(self):
        if self._block is not None:
            self._block.free()
            self._block = None

    def __repr__(self):
        state = "" if self._block is not None else ", freed"
        return f"QuantizedTensor({self.name!r}, {self.format.name}, {self.shape}{state})"


def upload_quantized(chip, raw, qtype, shape, name="a quantized tensor"):
    """Check, repack and write one GGUF tensor; every error names the tensor
    and is raised before anything is allocated or written."""
    try:
        fmt = quant_format(qtype)
        if fmt.name not in chip.config.quant_formats:
            raise ValueError(f"{fmt.name} is not one of this chip's formats "
                             f"{chip.config.quant_formats} (ChipConfig.quant_formats)")
        if len(shape) != 2 or min(int(s) for s in shape) < 1:
            raise ValueError(f"shape must be (rows N, row length K) as the file stores it, "
                             f"not {shape}")
        data = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) \
            else np.asarray(raw).view(np.uint8).reshape(-1)
        chip_bytes = repack(data, fmt, shape, chip.config.cols)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    n, k = (int(s) for s in shape)
    block = chip._allocator.alloc(chip_bytes.size, f"{name} ({fmt.name}, {chip_bytes.size} bytes)")
    try:
        chip.device.write_memory(block.addr, chip_bytes, name)
    except BaseException:
        block.free()
        raise
    return QuantizedTensor(chip, block, fmt, (k, n), name)
