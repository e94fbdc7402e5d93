"""mxu.hdl: what the chip is. Amaranth components and the `ChipConfig`."""

from .config import ChipConfig
from .numerics import BF16, BF16_QNAN, FP32, FP32_QNAN, Bf16Multiplier, Fp32Adder, Fp32ToBf16
from .mac import MacOperands, MacPipeline, MacUnit
from .pe import ProcessingElement
from .array import SystolicArray
from .axi import AXI4LiteSignature, AXI4Signature, AxiBurst, AxiResp
from .vmem import BankedRowMemory, ReadPortSignature, RowWrite, Vmem, WritePortSignature
from .accmem import AccMem
from .dma import (Dma, DmaDir, DmaError, DmaSpace, DmaSystem, dma_completion_layout,
                  dma_descriptor_layout)
from .isa import ErrorCode, Opcode
from .top import MxuChip

__all__ = [
    "ChipConfig", "BF16", "FP32", "BF16_QNAN", "FP32_QNAN",
    "Bf16Multiplier", "Fp32Adder", "Fp32ToBf16", "MacOperands", "MacPipeline", "MacUnit",
    "ProcessingElement", "SystolicArray",
    "AXI4Signature", "AXI4LiteSignature", "AxiBurst", "AxiResp",
    "BankedRowMemory", "ReadPortSignature", "WritePortSignature", "RowWrite", "Vmem", "AccMem",
    "Dma", "DmaSystem", "DmaDir", "DmaSpace", "DmaError", "dma_descriptor_layout",
    "dma_completion_layout", "ErrorCode", "Opcode", "MxuChip",
]
