"""`Chip`: the simulated mxu as users see it (docs/runtime.md).

It owns one driver-level `SimulatedChip` (registers, external memory, ``run``)
and adds what a user of a matrix unit wants: ``matmul`` on NumPy arrays and
statistics. ``chip.run(program)`` passes straight through to the driver.
"""

import numpy as np

from ..driver.chip import SimulatedChip
from .matmul import run_matmul

__all__ = ["Chip"]


class Chip:
    """One simulated mxu chip and the runtime around it.

    Parameters are those of `mxu.sim.driver.SimulatedChip`: ``config`` (a
    `ChipConfig`, default 16x16), ``simulator``, ``mem_latency``, ``mem_pause``,
    ``seed``, ``waves``, ``fast_mac``.
    """

    def __init__(self, config=None, simulator="verilator", **options):
        self.device = SimulatedChip(config, simulator, **options)
        self.config = self.device.config
        self.last_stats = None

    # ---- the driver, passed through ---------------------------------------------
    @property
    def memory(self):
        return self.device.memory

    def run(self, program, memory_image=None, **options):
        """Run a `Program` (or program bytes); see `SimulatedChip.run`."""
        return self.device.run(program, memory_image, **options)

    def soft_reset(self):
        self.device.soft_reset()

    def inject_error(self, lo, hi, resp="slverr"):
        self.device.inject_error(lo, hi, resp)

    def clear_errors(self):
        self.device.clear_errors()

    def set_memory_timing(self, latency=(0, 0), pause=None, seed=1):
        self.device.set_memory_timing(latency, pause, seed)

    def write_memory(self, addr, data):
        self.device.write_memory(addr, data)

    def read_memory(self, addr, nbytes):
        return self.device.read_memory(addr, nbytes)

    def read_reg(self, name, offset=0):
        return self.device.read_reg(name, offset)

    def write_reg(self, name, value):
        return self.device.write_reg(name, value)

    def counters(self):
        return self.device.counters()

    # ---- the runtime ----------------------------------------------------------------
    def matmul(self, A, B, bias=None, out_dtype=np.float32, relu=False):
        """``relu?(A @ B + bias)`` on the chip (docs/runtime.md)."""
        return run_matmul(self, A, B, bias=bias, out_dtype=out_dtype, relu=relu)
