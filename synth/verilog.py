"""Verilog for the synthesis flows: the module of `mxu.synth` that imports the
Verilog generator from `mxu.sim.backends.verilog`, so that moving the generator
means changing only this file (the table printer comes from `mxu.sim.report`).

Two forms of the design:

* flat: every PE is elaborated as an Amaranth submodule of the array (what the
  FPGA flow flattens and optimises across anyway);
* shared PE: the PE is generated once as module ``mxu_pe_s<mac_stages>`` and the
  array instantiates it by name (`BuildHooks(pe_module=...)`), so that a
  hierarchical Yosys run synthesises one PE instead of ``rows * cols`` copies and
  reports it as one block.
"""

from mxu.hdl.numerics import Fp32Adder, Fp32Multiplier
from mxu.hdl.pe import ProcessingElement
from mxu.hdl.vpu import VectorLane
from mxu.sim.backends.verilog import lean_verilog

__all__ = ["component_verilog", "pe_module_name", "pe_module_verilog", "vpu_modules_verilog"]


def component_verilog(component, name="top"):
    """Verilog of an Amaranth component (ports from its signature). All-zero
    memory initialisers are left out: block RAM starts at zero, and writing 12
    Mbit of zeros bit by bit only slows both the generator and Yosys down."""
    return lean_verilog(component, name)


def pe_module_name(mac_stages):
    """The Verilog module name of the shared PE."""
    return f"mxu_pe_s{mac_stages}"


def pe_module_verilog(mac_stages):
    """Verilog of ``ProcessingElement(mac_stages)`` as module `pe_module_name`."""
    return component_verilog(ProcessingElement(mac_stages), pe_module_name(mac_stages))


def vpu_modules_verilog(stages=1):
    """(Verilog, `BuildHooks.vpu_modules`) of the vector unit's fp32 adder,
    multipliers and lane, of `stages` pipeline stages each
    (`ChipConfig.vpu_stages`), each generated once and instantiated by name
    (like the PE): Yosys synthesises one of each, and Amaranth elaborates one
    lane instead of one per column."""
    units = {"fadd": "mxu_fp32_add", "fmul": "mxu_fp32_mul", "fscale": "mxu_fp32_scale"}
    if stages > 1:
        units["staged"] = ("fadd", "fmul", "fscale")
    lane = "mxu_vpu_lane"
    prelude = (component_verilog(Fp32Adder(stages), units["fadd"])
               + component_verilog(Fp32Multiplier(stages=stages), units["fmul"])
               + component_verilog(Fp32Multiplier(power_of_two=True, stages=stages),
                                   units["fscale"])
               + component_verilog(VectorLane(units, stages), lane))
    return prelude, {**units, "lane": lane}
