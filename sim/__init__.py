"""mxu.sim: how the chip is run, in layers (docs/runtime.md):

* `backends`: toolchains, Verilog generation, cached builds, C++ harnesses, and
  the unit runners (`simulate_mac`, `simulate_array`);
* `driver`: one simulated chip: registers, external memory, ``run``;
* `compiler`: pure planning of programs from operand descriptors;
* `runtime`: the `Chip` users drive: tensors, matmuls, statistics.
"""

from .backends.array import simulate_array
from .backends.units import simulate_bf16_mul, simulate_fp32_add, simulate_fp32_to_bf16, simulate_mac
from .compiler.program import Program
from .driver.chip import ChipError, RunResult
from .runtime.chip import Chip, Recording
from .runtime.pod import Pod, PodError
from .runtime.stats import RunStats
from .runtime.tensor import DeviceTensor

__all__ = ["simulate_mac", "simulate_bf16_mul", "simulate_fp32_add", "simulate_fp32_to_bf16",
           "simulate_array", "Chip", "ChipError", "RunResult", "Program", "DeviceTensor",
           "RunStats", "Recording", "Pod", "PodError"]
