"""Yosys ``synth_ecp5`` + ``nextpnr-ecp5`` (LFE5U-85F) on an Amaranth component:
the small API the per-unit scripts (`mxu.synth.mac`, `mxu.synth.array`) use. It
runs the same flow as ``mxu synth --target ecp5`` (`mxu.synth.run.synth_ecp5`).
"""

from dataclasses import dataclass

from mxu.hdl.config import ChipConfig

from .report import format_table
from .run import Design, Ecp5Options, synth_ecp5
from .verilog import component_verilog

__all__ = ["SynthReport", "run_ecp5", "format_table", "DEVICE"]

DEVICE = "LFE5U-85F"


@dataclass(frozen=True)
class SynthReport:
    name: str
    luts: int          # LUT4 (logic, carry, RAM) as nextpnr counts them before packing
    ffs: int           # TRELLIS_FF
    dsps: int          # MULT18X18D
    brams: int         # DP16KD
    fmax_mhz: float    # nextpnr's estimate for clk after routing

    def row(self):
        return [self.name, self.luts, self.ffs, self.dsps, self.brams, f"{self.fmax_mhz:.1f}"]


def run_ecp5(component, name, *, freq_mhz=100, workdir=None, seed=1):
    """Synthesise and place-and-route `component` (top module ``top``, clock ``clk``).
    Raises RuntimeError (naming the log) when a tool fails or the design does not
    fit the device."""
    the_design = Design("component", ChipConfig(), component_verilog(component), "caller's")
    report = synth_ecp5(the_design, Ecp5Options(device=DEVICE, freq_mhz=freq_mhz, seed=seed),
                        workdir=workdir)
    if not report.placed:
        raise RuntimeError(f"{name} does not fit the {DEVICE} ({report.luts} LUT4 by Yosys's "
                           f"count); see {report.workdir}")
    return SynthReport(name=name, luts=report.luts, ffs=report.ffs, dsps=report.dsps,
                       brams=report.brams, fmax_mhz=report.fmax_mhz or float("nan"))
