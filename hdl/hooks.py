"""`BuildHooks`: how a build elaborates the chip, without changing what it does."""

from dataclasses import dataclass
from types import MappingProxyType

from .blackbox import check_module_name

__all__ = ["BuildHooks"]


@dataclass(frozen=True)
class BuildHooks:
    """The ways a build may elaborate parts of the chip differently with the
    same bits and cycles: units replaced by named Verilog modules that the
    build supplies, and idle clock gating. One value, passed as ``hooks`` to
    `MxuChip`, `ComputeEngine`, `SystolicArray`, `VectorUnit` and `VectorAlu`;
    each reads its fields. The default changes nothing: every unit is
    elaborated in Amaranth, on the ungated clock.

    `mxu.sim.backends.verilog` sets them all for the simulation builds;
    `mxu.synth` sets `pe_module` and `vpu_modules` (the fp32 units and the
    lane), so that a hierarchical synthesis handles one copy of each.

    Fields
    ------
    pe_module : str or None
        A Verilog module for every PE of the `SystolicArray`: the caller
        supplies it as the Verilog of ``ProcessingElement(mac_stages)``, so that
        generating Verilog costs one PE, not ``rows * cols``.
    datapath_module : str or None
        A Verilog module for the `SystolicArray`'s whole PE grid, with its skew
        registers and weight bus (ports and behaviour of `datapath_signature`):
        a simulation model, `mxu.sim.backends.fast_array`.
    pending_module : str or None
        A Verilog module for the `ComputeEngine`'s record of pending rows
        (`pending_rows_signature`): a simulation model,
        `mxu.sim.backends.fast_pending`.
    vpu_modules : mapping or None
        The vector unit's units as named Verilog modules (`VectorAlu`,
        `PipelineOps`): "lane" or "lanes" (one lane, or the whole row of
        lanes), "fadd", "fmul", "fscale", "fmax", "fmin" (fp32 units), "used"
        (the kinds whose units are told when their result is used) and
        "transpose" (the `RowTranspose`'s storage). Kept read-only.
    clock_gate : str or None
        A simulation clock gate's Verilog module (ports ``clk``, ``en``,
        ``gclk``): the vector unit, and the store engine with its DMA, then
        each run on a gated clock, enabled in the cycles where the engine is
        busy, is offered a command or is reset. In the others its next state
        is its state, so the gated chip is cycle for cycle the same, and
        Verilator skips their logic (docs/simulation.md, "Idle gating").
    gate_ports : bool
        The same gated clocks, with the gates outside the chip: for each
        gated engine ``e`` (`gate_port_members`) an input ``gate_e_clk``,
        its clock, and an output ``gate_e_awake``, the enable that the
        simulation harness samples to drive it (docs/simulation.md).
        Excludes `clock_gate`.
    """

    pe_module: str | None = None
    datapath_module: str | None = None
    pending_module: str | None = None
    vpu_modules: object = None
    clock_gate: str | None = None
    gate_ports: bool = False

    def __post_init__(self):
        for name in ("pe_module", "datapath_module", "pending_module", "clock_gate"):
            check_module_name(getattr(self, name), name)
        if self.gate_ports and self.clock_gate is not None:
            raise ValueError("gate_ports and clock_gate exclude each other")
        if self.vpu_modules is not None:
            object.__setattr__(self, "vpu_modules", MappingProxyType(dict(self.vpu_modules)))

    @property
    def gated(self):
        """Whether the idle engines run on gated clocks (either way)."""
        return self.clock_gate is not None or self.gate_ports
