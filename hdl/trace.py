"""The chip's trace port: what each engine starts and finishes, cycle by cycle,
for the profiler (docs/profiler.md). It exists only when `MxuChip` is built
with ``trace=True`` (simulation builds); synthesis never sees it.
"""

from amaranth.lib import data

from .isa import Opcode

__all__ = ["EngineTrace", "ChipTrace"]

EngineTrace = data.StructLayout({
    "take": 1,          # the engine takes its queue's head this cycle
    "complete": 1,      # the engine completes an instruction (in order) this cycle
    "pc": 32,           # the head's pc (with `take`)
    "opcode": Opcode,   # the head's opcode (with `take`)
    "waited": 32,       # cycles the head waited for a token before `take`
})
"""One engine's events."""

ChipTrace = data.StructLayout({
    "load": EngineTrace,
    "compute": EngineTrace,
    "store": EngineTrace,
    "vector": EngineTrace,   # zero on a chip without the vector unit
    "loadw_done": 1,    # the compute engine has fed a LOADW's last weight row
    "array_accept": 1,  # an activation row entered the array
    "running": 1,       # a program runs (the cycles counter counts)
})
"""The whole trace port."""
