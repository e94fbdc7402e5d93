"""mxu.hdl: what the chip is. Amaranth components and the `ChipConfig`."""

from .config import ChipConfig
from .numerics import (BF16, FP32, BF16_QNAN, FP32_QNAN, Bf16Multiplier, Fp32Adder,
                       Fp32ToBf16)
from .mac import MacOperands, MacPipeline, MacUnit

__all__ = [
    "ChipConfig", "BF16", "FP32", "BF16_QNAN", "FP32_QNAN",
    "Bf16Multiplier", "Fp32Adder", "Fp32ToBf16", "MacOperands", "MacPipeline", "MacUnit",
]
