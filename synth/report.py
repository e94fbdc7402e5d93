"""Reading what Yosys and nextpnr say: cell counts, device utilisation, Fmax and
the critical path, and the plain-text tables the reports are printed as."""

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

# The one table printer and commit stamp (sim and synth).
from mxu.sim.report import format_table, source_commit

__all__ = ["CriticalPath", "NextpnrResult", "parse_nextpnr_log", "readable_cell", "yosys_cells",
           "lut4_equivalent", "format_table", "write_json", "source_commit"]


@dataclass(frozen=True)
class CriticalPath:
    """The worst register-to-register path nextpnr reports for a clock."""
    clock: str
    start: str          # the source cell pin (e.g. ``..._TRELLIS_FF_Q.Q``)
    end: str            # the sink cell pin
    delay_ns: float     # total delay, clock-to-q to setup


@dataclass(frozen=True)
class NextpnrResult:
    """What a nextpnr-ecp5 run reported (from its log)."""
    utilisation: dict                      # resource -> (used, available), after packing
    logic: dict                            # "Total LUT4s", "carry LUTs", ... -> (used, available)
    fmax_mhz: float | None                 # after routing, for the clock `clock`
    target_mhz: float | None
    clock: str | None
    critical_path: CriticalPath | None
    warnings: int = 0

    @property
    def passed(self):
        return self.fmax_mhz is not None and self.target_mhz is not None and \
            self.fmax_mhz >= self.target_mhz

    def used(self, resource):
        return self.utilisation.get(resource, (0, 0))[0]

    @property
    def lut4(self):
        """The design's LUT4s as nextpnr counts them before packing (logic, carry
        and distributed-RAM LUTs); falls back to the TRELLIS_COMB slots."""
        if "Total LUT4s" in self.logic:
            return self.logic["Total LUT4s"][0]
        return self.used("TRELLIS_COMB")

    def available(self, resource):
        return self.utilisation.get(resource, (0, 0))[1]


_LOGIC = re.compile(r"^Info:\s+(Total LUT4s|logic LUTs|carry LUTs|RAM LUTs|RAMW LUTs|Total DFFs):"
                    r"\s+(\d+)/\s*(\d+)")
_UTIL = re.compile(r"^Info:\s+([A-Za-z0-9_]+):\s+(\d+)/\s*(\d+)\s+\d+%\s*$")
_FMAX = re.compile(r"^(?:Info|Warning): Max frequency for clock\s+'([^']+)':\s+([0-9.]+) MHz\s+"
                   r"\((PASS|FAIL) at\s+([0-9.]+) MHz\)")
_CRIT = re.compile(r"^Info: Critical path report for clock '([^']+)' \((\w+) -> (\w+)\):")
# One timed step of a path: "Info: <curr> <total> <kind> <name>" (nextpnr 0.5, 0.6)
# or "Info: <type> <curr> <total> <kind> <name>" (0.7 and later: the last step is
# of type "setup").
_STEP = re.compile(r"^Info:\s+(?:([a-z][a-z-]*)\s+)?([0-9.]+)\s+([0-9.]+)\s+"
                   r"(Source|Net|Sink|Setup)\s+(\S+)")
_PATH_END = re.compile(r"^Info: [0-9.]+ ns logic, [0-9.]+ ns routing")


def parse_nextpnr_log(text):
    """A `NextpnrResult` from the text of a nextpnr-ecp5 log.

    The utilisation is the last "Device utilisation" block; Fmax and the critical
    path are the last ones printed for a clock (nextpnr prints estimates after
    placement and the real figures after routing; a missed target is a
    "Warning:" line). Raises ValueError if the text has no utilisation block
    (not a nextpnr log, or one that stopped before packing).
    """
    lines = text.splitlines()
    utilisation = {}
    block = None
    for line in lines:
        if line.startswith("Info: Device utilisation:"):
            block = {}
            utilisation = block
            continue
        if block is not None:
            match = _UTIL.match(line)
            if match:
                block[match.group(1)] = (int(match.group(2)), int(match.group(3)))
            elif block:
                block = None
    if not utilisation:
        raise ValueError("no 'Device utilisation' block: not a complete nextpnr log")
    # "Logic utilisation before packing": the design's own LUT4s (logic, carry
    # and RAM); the TRELLIS_COMB count after packing adds feed-through LUTs.
    logic = {}
    for line in lines:
        match = _LOGIC.match(line)
        if match:
            logic[match.group(1)] = (int(match.group(2)), int(match.group(3)))

    fmax = target = clock = None
    for line in lines:
        match = _FMAX.match(line)
        if match:
            clock, fmax, target = match.group(1), float(match.group(2)), float(match.group(4))

    path = None
    steps = None
    for line in lines:
        match = _CRIT.match(line)
        if match:
            steps, path_clock = [], match.group(1)
        elif line.startswith("Info: Critical path report"):
            steps = None             # a cross-domain (IO) path: not the clock's
        elif steps is not None:
            step = _STEP.match(line)
            if step:
                steps.append((step.group(4), step.group(5), float(step.group(3))))
            elif _PATH_END.match(line) or not line.startswith("Info:"):
                if steps:
                    path = CriticalPath(clock=path_clock, start=steps[0][1], end=steps[-1][1],
                                        delay_ns=steps[-1][2])
                steps = None
    warnings = sum(1 for line in lines if line.startswith("Warning:"))
    return NextpnrResult(utilisation=utilisation, logic=logic, fmax_mhz=fmax, target_mhz=target,
                         clock=clock, critical_path=path, warnings=warnings)


def readable_cell(name):
    """The design name inside a nextpnr cell pin name: ``unit.mac.acc_d.exp`` from
    ``unit.mac.acc_d.exp_TRELLIS_FF_Q_3.Q`` (Yosys appends the mapped cell's
    type and pins to the register or net it came from)."""
    cut = re.split(r"_(?:TRELLIS_|LUT4|CCU2C|MULT18X18D|DP16KD|PFUMX|L6MUX)|\$", name, maxsplit=1)
    return cut[0]


def yosys_cells(netlist_path):
    """Cell type -> count over every module of a Yosys JSON netlist (a flattened
    one counts every cell once)."""
    design = json.loads(Path(netlist_path).read_text())
    count = {}
    for module in design["modules"].values():
        for cell in module.get("cells", {}).values():
            count[cell["type"]] = count.get(cell["type"], 0) + 1
    return count


def lut4_equivalent(cells):
    """LUT4 slots a `synth_ecp5` cell count fills, counted as nextpnr does: a
    CCU2C carry cell takes two, a TRELLIS_DPR16X4 distributed RAM four (two for
    the RAM, two for its write logic -- an upper bound)."""
    return (cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
            + 4 * cells.get("TRELLIS_DPR16X4", 0))


def write_json(path, report):
    """Write a report (a dataclass or a dict of them) as indented JSON."""
    def plain(value):
        if hasattr(value, "__dataclass_fields__"):
            return {k: plain(v) for k, v in asdict(value).items()}
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value
    Path(path).write_text(json.dumps(plain(report), indent=2) + "\n")
