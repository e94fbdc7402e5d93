"""The ``mxu synth`` and ``mxu export`` commands.

    mxu synth [--preset NAME | --rows R --cols C --mac-stages L --vmem-bytes B ...]
              [--unit mac|pe|array|chip|vpu] [--target generic|ecp5] [--device D]
              [--freq MHZ] [--json FILE]
    mxu export [--preset NAME | config flags] [--unit chip|array|pe|mac] -o chip.v

The ``mxu`` console script (`mxu.sim.cli`) finds these through the entry point
group ``mxu.commands`` (``synth = "mxu.synth.cli:register"``); `main` runs them
without it: ``python -m mxu.synth.cli synth ...``.
"""

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from amaranth.hdl import Value
from amaranth.lib.wiring import In

from mxu.hdl.config import ChipConfig
from mxu.sim.cli import add_command, check_outputs, output_path, preset_help

from .flow import Phases, ToolError, stop_tools_on_sigterm
from .report import write_json
from .run import DEVICES, PLACERS, TARGETS, UNITS, Ecp5Options, design, synth_ecp5, synth_generic

__all__ = ["register", "main", "config_from_args", "port_list"]

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmM]?)(i?[bB])?\s*$")


def _bytes(text):
    """``65536``, ``64K``, ``64KiB``, ``1M``: a size in bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"a size in bytes looks like 65536, 64K or 1MiB, "
                                         f"not {text!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20}[match.group(2).lower()]
    return int(match.group(1)) * scale


def _add_config_flags(parser):
    group = parser.add_argument_group("chip configuration (ChipConfig)")
    group.add_argument("--preset", default="default",
                       help="the starting configuration, " + preset_help("default") +
                            "; the flags below change it")
    group.add_argument("--rows", type=int, help="systolic array rows (reduction depth K of a tile)")
    group.add_argument("--cols", type=int, help="systolic array columns (output width N of a tile)")
    group.add_argument("--mac-stages", type=int,
                       help="pipeline depth of each PE's multiply-add: 1 to 7 (docs/array.md)")
    group.add_argument("--vmem-bytes", type=_bytes, help="VMEM capacity, e.g. 64K or 1M")
    group.add_argument("--vmem-banks", type=int, help="VMEM banks (a power of two)")
    group.add_argument("--acc-bytes", type=_bytes, help="accumulator capacity, e.g. 32K")
    group.add_argument("--acc-banks", type=int, help="accumulator banks (a power of two)")
    group.add_argument("--axi-data-bits", type=int, help="AXI4 master data width (64..512)")
    group.add_argument("--loop-body-instrs", type=int,
                       help="longest LOOP body each loop expander stores (1..4096)")
    group.add_argument("--vpu", action="store_true", default=None,
                       help="with the vector unit (ChipConfig.vpu)")
    group.add_argument("--vpu-stages", type=int,
                       help="pipeline stages of each vector-unit fp32 unit (1..5)")


_CONFIG_FLAGS = ("rows", "cols", "mac_stages", "vmem_bytes", "vmem_banks", "acc_bytes",
                 "acc_banks", "axi_data_bits", "loop_body_instrs", "vpu", "vpu_stages")


def config_from_args(args):
    """The `ChipConfig` the preset and flags of `args` describe (ValueError if invalid)."""
    config = ChipConfig.preset(args.preset)
    changes = {k: getattr(args, k) for k in _CONFIG_FLAGS if getattr(args, k) is not None}
    return config.replace(**changes) if changes else config


def _describe(config):
    return (f"{config.rows}x{config.cols}, mac_stages {config.mac_stages}, "
            f"VMEM {config.vmem_bytes // 1024} KiB in {config.vmem_banks} banks, "
            f"accumulator {config.acc_bytes // 1024} KiB in {config.acc_banks} banks, "
            f"AXI {config.axi_data_bits} bits"
            + (f", vector unit ({config.vpu_stages}-stage fp32 units)" if config.vpu else ""))


def register(subparsers):
    """Add the ``synth`` and ``export`` subcommands to an argparse `subparsers`."""
    synth = add_command(
        subparsers, "synth", "synthesise the chip or one of its units with Yosys (and nextpnr)",
        "mxu synth --preset fpga --unit pe --target ecp5 --json pe.json",
        description="Synthesise a unit of a ChipConfig: generic Yosys cells and a transistor "
                    "estimate per block, or ECP5 utilisation and Fmax after place-and-route.")
    _add_config_flags(synth)
    synth.add_argument("--unit", choices=UNITS, default="chip",
                       help="what to synthesise (default: %(default)s)")
    synth.add_argument("--target", choices=TARGETS, default="generic",
                       help="'generic': Yosys synth, cells and transistors per block; 'ecp5': "
                            "Yosys synth_ecp5 and nextpnr-ecp5 (default: %(default)s)")
    ecp5 = synth.add_argument_group("ECP5 target")
    defaults = Ecp5Options()
    ecp5.add_argument("--device", default=defaults.device, choices=list(DEVICES),
                      help="ECP5 device, package CABGA381 (default: %(default)s)")
    ecp5.add_argument("--freq", type=float, default=defaults.freq_mhz,
                      help="nextpnr timing target in MHz (default: %(default)g)")
    ecp5.add_argument("--seed", type=int, default=defaults.seed,
                      help="nextpnr placement seed (default: %(default)s)")
    ecp5.add_argument("--placer", choices=PLACERS, default=defaults.placer,
                      help="nextpnr placer (default: %(default)s)")
    ecp5.add_argument("--router", choices=("router1", "router2"), default=defaults.router,
                      help="nextpnr router (default: %(default)s)")
    ecp5.add_argument("--no-tmdriv", action="store_true",
                      help="place and route without timing-driven optimisation (faster, "
                           "usually a lower Fmax)")
    ecp5.add_argument("--widelut", action="store_true",
                      help="let Yosys use PFUMX/L6MUX wide-LUT cells (more LUT4s, see "
                           "docs/synth.md)")
    ecp5.add_argument("--global-controls", type=int, default=defaults.global_controls,
                      metavar="PINS",
                      help="put each flip-flop enable or reset net with at least PINS CE/LSR "
                           "pins on the global network, through a DCCA (0: none; default: "
                           "%(default)s; docs/synth.md)")
    synth.add_argument("--json", metavar="FILE", type=output_path("--json"), help="also write the report as JSON to FILE")
    synth.add_argument("--workdir", metavar="DIR", type=output_path("--workdir", "dir"),
                       help="directory for the Verilog, netlists and tool logs (default: a new "
                            "directory under the system's temporary directory, kept)")
    synth.add_argument("--quiet", action="store_true", help="no progress display")
    synth.set_defaults(func=run_synth)

    export = add_command(
        subparsers, "export", "write the chip's (or a unit's) Verilog for other tools",
        "mxu export --preset vpu -o chip.v",
        description="Write synthesisable Verilog of a ChipConfig's chip, with its port list "
                    "documented in a header comment.")
    _add_config_flags(export)
    export.add_argument("--unit", choices=("chip", "array", "pe", "mac"), default="chip",
                        help="what to export (default: %(default)s)")
    export.add_argument("-o", "--output", required=True, metavar="FILE", type=output_path("-o"),
                        help="Verilog file to write")
    export.add_argument("--quiet", action="store_true", help="no progress display")
    export.set_defaults(func=run_export)
    return synth, export


def run_synth(args):
    config = config_from_args(args)
    stop_tools_on_sigterm()
    phases = Phases(quiet=args.quiet)
    workdir = Path(args.workdir) if args.workdir else Path(
        tempfile.mkdtemp(prefix=f"mxu-synth-{args.unit}-{args.target}-"))
    out = sys.stdout
    print(f"mxu synth: {args.unit} of ChipConfig({_describe(config)}), target {args.target}, "
          f"in {workdir}", file=sys.stderr, flush=True)
    start = time.monotonic()
    the_design = phases.run("generate Verilog", design, args.unit, config, target=args.target,
                            key=f"synth {args.unit} {args.target} {config!r}")
    try:
        if args.target == "generic":
            report = synth_generic(the_design, workdir=workdir, phases=phases)
            print(f"{the_design.name}: Yosys generic synthesis, cells per block (each block's "
                  f"own cells times its instances); commit {report.commit}", file=out)
            print(report.table(), file=out)
            if report.per_pe is not None and args.unit not in ("pe", "mac"):
                pe = report.per_pe
                print(f"one PE: {pe.cells} cells, {pe.flip_flops} FF, ~{pe.transistors} "
                      f"transistors", file=out)
            print("transistors: Yosys `stat -tech cmos` estimate of the logic gates; flip-flops "
                  "and memory arrays are not in it (memory bits are listed).", file=out)
        else:
            options = Ecp5Options(device=args.device, freq_mhz=args.freq, seed=args.seed,
                                  placer=args.placer, router=args.router,
                                  timing_driven=not args.no_tmdriv, widelut=args.widelut,
                                  global_controls=args.global_controls)
            report = synth_ecp5(the_design, options, workdir=workdir, phases=phases)
            print(f"{the_design.name} on {options.device} ({'placed and routed' if report.placed else 'Yosys only'})",
                  file=out)
            print(report.table(), file=out)
    except ToolError as error:
        raise RuntimeError(str(error)) from None
    total = time.monotonic() - start
    times = "; ".join(f"{k} {v:.0f} s" for k, v in phases.times.items())
    print(f"wall time {total:.0f} s ({times}); logs in {workdir}", file=out)
    if args.json:
        write_json(args.json, {"report": report, "wall_s": total})
        print(f"report written to {args.json}", file=out)
    return 0


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------

_PORT_GROUPS = {
    "chip": {
        "axi": "AXI4 master to external memory: program, operands, results "
               "(docs/architecture.md)",
        "host": "AXI4-Lite slave: the register file, 12-bit byte addresses (docs/isa.md)",
        "irq": "high once a run has finished (STATUS.done) until the next start",
    },
    "array": {
        "act": "activation rows (stream); the first-of-tile flag is the top bit (docs/array.md)",
        "seed": "partial-sum seed rows (stream), in lockstep with act",
        "weight": "weight rows (stream), k = 0 first",
        "result": "result rows (stream)",
        "weights_ready": "the next weight tile is staged",
        "busy": "some accepted row has not left yet",
    },
    "pe": {
        "en": "clock enable of the whole PE",
        "west": "activation in from the west, with the tile-switch marker",
        "east": "activation out to the east, one cycle later",
        "north": "partial sum in from the north, with its valid bit",
        "south": "north + west * weight, mac_stages cycles later",
        "weight": "shadow-weight write port",
    },
    "mac": {
        "i": "operand stream: a (bf16), w (bf16), acc (fp32)",
        "o": "result stream: acc + a*w (fp32), mac_stages cycles later",
    },
}


def port_list(component, unit):
    """Comment lines describing every Verilog port of `component` (as Amaranth
    names them: path elements joined by ``__``), grouped by interface."""
    lines = ["clk                       input         rising-edge clock",
             "rst                       input         synchronous reset, active high"]
    group = None
    for path, member, value in component.signature.flatten(component):
        if path[0] != group:
            group = path[0]
            lines.append(f"{group}: {_PORT_GROUPS[unit].get(str(group), '')}".rstrip(": "))
        name = "__".join(map(str, path))
        width = len(Value.cast(value))
        direction = "input " if member.flow == In else "output"
        lines.append(f"  {name:<24}{direction} [{width - 1}:0]")
    return lines


def run_export(args):
    from mxu.hdl.array import SystolicArray
    from mxu.hdl.hooks import BuildHooks
    from mxu.hdl.mac import MacUnit
    from mxu.hdl.pe import ProcessingElement
    from mxu.hdl.top import MxuChip
    from .verilog import (component_verilog, pe_module_name, pe_module_verilog,
                          vpu_modules_verilog)

    config = config_from_args(args)
    stages = config.mac_stages
    pe_name = pe_module_name(stages)
    hooks = BuildHooks(pe_module=pe_name)
    # Phases: elaborating the chip takes a minute or more (docs/synth.md,
    # "mxu export"): a live phase line (or plain lines in a log) says what
    # runs and for how long.
    phases = Phases(quiet=args.quiet, command="export")
    vpu = args.unit == "chip" and config.vpu
    prelude = ""
    if vpu:
        # The vector unit's fp32 units and lane once, instantiated by name,
        # as `mxu synth` builds it: one lane elaborated instead of `cols`.
        prelude, modules = phases.run("elaborate the vector lane", vpu_modules_verilog,
                                      config.vpu_stages, key="export vpu modules")
        hooks = BuildHooks(pe_module=pe_name, vpu_modules=modules)
    if args.unit == "chip":
        top, shared_pe = MxuChip(config, hooks=hooks), True
    elif args.unit == "array":
        top, shared_pe = SystolicArray(config.rows, config.cols, stages,
                                       weight_rows=config.weight_rows_per_cycle,
                                       hooks=hooks), True
    elif args.unit == "pe":
        top, shared_pe = ProcessingElement(stages), False
    else:
        top, shared_pe = MacUnit(stages), False
    ports = port_list(top, args.unit)
    text = (pe_module_verilog(stages) if shared_pe else "") + prelude + \
        phases.run("elaborate and write Verilog", component_verilog, top,
                   key=f"export {args.unit} {config!r}")
    header = [f"mxu {args.unit}, module `top`: ChipConfig({_describe(config)})",
              "Generated by `mxu export`. Ports (Amaranth names: interface path joined by '__'):"]
    header += ["  " + line for line in ports]
    if shared_pe:
        header.append(f"The PE is module `{pe_name}`, instantiated {config.rows * config.cols} "
                      f"times.")
    if vpu:
        header.append(f"The vector lane is module `{modules['lane']}`, instantiated "
                      f"{config.cols} times; its fp32 units are modules "
                      f"`{modules['fadd']}`, `{modules['fmul']}` and `{modules['fscale']}`.")
    header.append("Memories have no initial contents (they start at zero on an FPGA).")
    Path(args.output).write_text("".join(f"// {line}\n" for line in header) + text)
    count = sum(1 for line in ports if line.startswith("  "))
    print(f"wrote {args.output}: {args.unit} with {count} ports + clk, rst "
          f"({len(text) // 1024} KiB of Verilog)")
    return 0


def main(argv=None):
    """Standalone entry: ``python -m mxu.synth.cli synth|export ...``."""
    parser = argparse.ArgumentParser(prog="mxu", description="mxu synthesis commands")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(argv)
    try:
        check_outputs(args)
        return args.func(args)
    except (ValueError, RuntimeError) as error:
        print(f"mxu {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
