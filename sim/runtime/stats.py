"""`RunStats`: what a runtime call cost, as one type (docs/performance.md).

The chip's own counters give cycles, array-busy cycles, DMA bytes and stalls;
the runtime adds what it knows: the work (MACs) and how much of it was the
model's, the programs run and whether they came from the compile cache, and
where the wall time went (simulation vs host).
"""

from dataclasses import dataclass, field, fields

__all__ = ["RunStats"]


@dataclass
class RunStats:
    """Statistics of one runtime call (one matmul, one recorded sequence, one
    model forward). Sums over every program the call ran."""

    rows: int                    # the array the work ran on
    cols: int
    cycles: int = 0              # chip cycles, start to done, every program
    macs: int = 0                # multiply-adds the array was asked for (padding excluded)
    model_macs: int = 0          # the model's own MACs (for MFU); defaults to `macs`
    array_active_cycles: int = 0
    vector_active_cycles: int = 0  # rows the vector unit took (one per cycle at most)
    dma_read_bytes: int = 0
    dma_write_bytes: int = 0
    stall_cycles: dict = field(default_factory=lambda: {"load": 0, "compute": 0, "store": 0})
    instructions: int = 0        # executed (a loop counts every iteration)
    program_bytes: int = 0
    programs: int = 0
    cache_hits: int = 0          # programs replayed from the compile cache
    sim_seconds: float = 0.0     # wall time inside the simulator
    host_seconds: float = 0.0    # wall time in Python: compiling, copying, host ops

    @property
    def ideal_cycles(self):
        """``MACs / (rows * cols)``: the cycles of a perfectly busy array."""
        return self.macs / (self.rows * self.cols)

    @property
    def utilization(self):
        """Gemmini's definition: ideal cycles over measured cycles."""
        return self.ideal_cycles / self.cycles if self.cycles else 0.0

    @property
    def mfu(self):
        """Model FLOPs utilization: model MACs / (cycles * rows * cols)."""
        work = self.model_macs or self.macs
        return work / (self.cycles * self.rows * self.cols) if self.cycles else 0.0

    @property
    def vector_busy(self):
        """The vector unit's busy share: rows it took over cycles."""
        return self.vector_active_cycles / self.cycles if self.cycles else 0.0

    @property
    def wall_seconds(self):
        return self.sim_seconds + self.host_seconds

    @property
    def dma_bytes(self):
        return {"read": self.dma_read_bytes, "written": self.dma_write_bytes}

    def add_counters(self, counters, wall):
        """Add one program run's chip counters and its simulation wall time."""
        self.cycles += counters["cycles"]
        self.array_active_cycles += counters["array_active"]
        self.vector_active_cycles += counters["vector_active"]
        self.dma_read_bytes += counters["dma_read_bytes"]
        self.dma_write_bytes += counters["dma_write_bytes"]
        for engine in self.stall_cycles:
            self.stall_cycles[engine] += counters[f"{engine}_stall"]
        self.instructions += counters["instructions"]
        self.programs += 1
        self.sim_seconds += wall

    def __iadd__(self, other):
        for f in fields(self):
            if f.name in ("rows", "cols"):
                continue
            mine = getattr(self, f.name)
            if isinstance(mine, dict):
                for k, v in getattr(other, f.name).items():
                    mine[k] = mine.get(k, 0) + v
            else:
                setattr(self, f.name, mine + getattr(other, f.name))
        return self

    # The dict that `last_stats` used to be: ``stats["utilization"]`` still works.
    def __getitem__(self, key):
        if key in {f.name for f in fields(self)} or key in (
                "ideal_cycles", "utilization", "mfu", "wall_seconds", "dma_bytes"):
            return getattr(self, key)
        raise KeyError(key)
