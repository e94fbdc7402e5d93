"""mxu.sim: how the chip is run. Verilog generation, simulator builds, drivers."""

from .units import simulate_bf16_mul, simulate_fp32_add, simulate_fp32_to_bf16, simulate_mac

__all__ = ["simulate_mac", "simulate_bf16_mul", "simulate_fp32_add", "simulate_fp32_to_bf16"]

from .array import simulate_array

__all__ += ["simulate_array"]
