"""The timing guard: every block that has held the whole chip's critical path,
placed and routed alone at the ``fpga`` preset's parameters, against a floor.

    .venv/bin/python -m mxu.synth.guard [--block NAME ...] [--mac-stages L] [--seed N]

Whole-chip place-and-route takes ten minutes or more, so it stays a bench
(docs/synth.md). A block alone takes seconds to a minute: the guard runs them at
every change (``make test-timing``, pytest marker ``timing``) and fails when one
falls under its floor. A block alone is faster than the same block in the chip
(its cells sit together, with no neighbour competing for the routing), so the
floor of a block on the chip's 50 MHz target carries a margin: `MARGIN` above
the target (docs/synth.md, "Timing guard", has the measurements it comes from).

The vector unit's blocks (a lane, its fp32 units, the reduction tree) are
placed at the ``fpga-llm`` preset's parameters (`BLOCK_PRESETS`), the chip
that carries them: one-column lanes of `vpu_stages`-deep fp32 units.

Exit status 1 if a block misses its floor (the table says which and by how much).
"""

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mxu.hdl.config import ChipConfig

from .flow import Phases
from .report import format_table
from .run import Ecp5Options, design, synth_ecp5

__all__ = ["TARGET_MHZ", "MARGIN", "FLOORS", "BLOCK_PRESETS", "GuardResult", "check_block",
           "block_config", "main"]

TARGET_MHZ = 50.0
# In the chip a block loses about a tenth of its Fmax alone (the depth-4 PE:
# 50-52 MHz alone, 45-50 MHz in the 4x4 chip); the floor asks for more.
MARGIN = 0.15

# block -> (floor in MHz, why). The PE is the `--unit pe` of `mxu synth`.
FLOORS = {
    "pe": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "load_dma": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "store_dma": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "expander": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "controller": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "regs": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "fetch": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "loop": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    # The vector unit at the fpga-llm preset's depth (BLOCK_PRESETS). The
    # whole lane (22k LUT4, 20 minutes alone) is measured in the chip's run.
    "lane_fadd": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "lane_fmul": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
    "tree": (TARGET_MHZ * (1 + MARGIN), "the chip's target with the margin"),
}

# The preset each block is placed at, when not the ``fpga`` preset, and the
# fields changed: the vector unit's blocks at the chip that has one. Its one
# column has no tree (`tree_levels(1)` is 0): the tree is placed with 4
# columns, two levels of its units at that depth.
BLOCK_PRESETS = {"lane": ("fpga-llm", {}), "lane_fadd": ("fpga-llm", {}),
                 "lane_fmul": ("fpga-llm", {}), "tree": ("fpga-llm", {"cols": 4})}


def block_config(block):
    """The `ChipConfig` the guard places `block` at (`BLOCK_PRESETS`)."""
    preset, changes = BLOCK_PRESETS.get(block, ("fpga", {}))
    return ChipConfig.preset(preset).replace(**changes)


@dataclass
class GuardResult:
    block: str
    fmax_mhz: float
    floor_mhz: float
    luts: int
    critical_path: str
    seconds: float
    workdir: str

    @property
    def passed(self):
        return self.fmax_mhz >= self.floor_mhz

    @property
    def message(self):
        verdict = "ok" if self.passed else "BELOW ITS FLOOR"
        return (f"{self.block}: {self.fmax_mhz:.1f} MHz alone, floor {self.floor_mhz:.1f} MHz: "
                f"{verdict}; critical path {self.critical_path} (logs in {self.workdir})")


def check_block(block, config=None, *, seed=1, floor_mhz=None, workdir=None):
    """Place and route `block` alone (`mxu.synth.run.design` of that unit, at
    its preset in `BLOCK_PRESETS` or the ``fpga`` preset, unless `config` is
    given) and compare its Fmax with its floor (`FLOORS`, or `floor_mhz`). A
    `GuardResult`."""
    config = config or block_config(block)
    if floor_mhz is None:
        floor_mhz = FLOORS[block][0]
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"mxu-guard-{block}-"))
    start = time.monotonic()
    report = synth_ecp5(design(block, config, target="ecp5"),
                        Ecp5Options(freq_mhz=TARGET_MHZ, seed=seed), workdir=workdir,
                        phases=Phases(quiet=True))
    if not report.placed or report.fmax_mhz is None:
        raise RuntimeError(f"{block} was not placed and routed; see {workdir}")
    path = (f"{report.critical_ns:.2f} ns, {report.critical_start} -> {report.critical_end}"
            if report.critical_start else "(none reported)")
    return GuardResult(block=block, fmax_mhz=report.fmax_mhz, floor_mhz=floor_mhz,
                       luts=report.luts, critical_path=path,
                       seconds=time.monotonic() - start, workdir=str(workdir))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", action="append", choices=list(FLOORS),
                        help="a block to check (repeatable; default: all)")
    parser.add_argument("--mac-stages", type=int,
                        help="the PE's pipeline depth (default: the fpga preset's); fewer "
                             "stages make a slower PE, to see the guard fail")
    parser.add_argument("--vpu-stages", type=int,
                        help="the vector unit's fp32 pipeline depth (default: the fpga-llm "
                             "preset's), for its blocks")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr seed (default: 1)")
    args = parser.parse_args(argv)
    results = []
    for block in args.block or list(FLOORS):
        config = block_config(block)
        changes = {k: v for k, v in (("mac_stages", args.mac_stages),
                                     ("vpu_stages", args.vpu_stages)) if v is not None}
        result = check_block(block, config.replace(**changes), seed=args.seed)
        print(result.message, file=sys.stderr, flush=True)
        results.append(result)
    print(f"timing guard: each block alone on the LFE5U-85F, nextpnr seed {args.seed}, "
          f"chip target {TARGET_MHZ:g} MHz, margin {MARGIN:.0%}")
    print(format_table(["block", "Fmax MHz", "floor MHz", "", "LUT4", "critical path", "s"],
                       [[r.block, f"{r.fmax_mhz:.1f}", f"{r.floor_mhz:.1f}",
                         "ok" if r.passed else "FAIL", r.luts, r.critical_path,
                         f"{r.seconds:.0f}"] for r in results]))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
