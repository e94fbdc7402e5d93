"""mxu.sim: how the chip is run. Verilog generation, simulator builds, drivers."""

from .array import simulate_array
from .chip import Chip, ChipError, RunResult
from .program import Program
from .units import simulate_bf16_mul, simulate_fp32_add, simulate_fp32_to_bf16, simulate_mac

__all__ = ["simulate_mac", "simulate_bf16_mul", "simulate_fp32_add", "simulate_fp32_to_bf16",
           "simulate_array", "Chip", "ChipError", "RunResult", "Program"]
