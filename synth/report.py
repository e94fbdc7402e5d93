"""Reading what Yosys and nextpnr say: cell counts, device utilisation, Fmax and
the critical path, and the plain-text tables the reports are printed as."""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["CriticalPath", "NextpnrResult", "parse_nextpnr_log", "yosys_cells",
           "lut4_equivalent", "format_table", "write_json"]


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
    utilisation: dict                      # resource -> (used, available)
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

    def available(self, resource):
        return self.utilisation.get(resource, (0, 0))[1]


_UTIL = re.compile(r"^Info:\s+([A-Za-z0-9_]+):\s+(\d+)/\s*(\d+)\s+\d+%\s*$")
_FMAX = re.compile(r"^Info: Max frequency for clock\s+'([^']+)':\s+([0-9.]+) MHz\s+\((PASS|FAIL) at\s+"
                   r"([0-9.]+) MHz\)")
_CRIT = re.compile(r"^Info: Critical path report for clock '([^']+)' \((\w+) -> (\w+)\):")
# One step of a path: "Info: <curr> <total> <kind> <name...>" (nextpnr 0.5-0.6), or
# "Info: <type> <curr> <total> <kind> <name...>" (0.7 and later).
_STEP = re.compile(r"^Info:\s+(?:[a-z-]+\s+)?([0-9.]+)\s+([0-9.]+)\s+(Source|Net|Sink|Setup)\s+(\S+)")


def parse_nextpnr_log(text):
    """A `NextpnrResult` from the text of a nextpnr-ecp5 log.

    The utilisation is the last "Device utilisation" block; Fmax and the critical
    path are the last ones printed (nextpnr prints estimates after placement and
    the real figures after routing). Raises ValueError if the text has no
    utilisation block (not a nextpnr log, or one that stopped before packing).
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
                continue
            if block:
                block = None
    if not utilisation:
        raise ValueError("no 'Device utilisation' block: not a complete nextpnr log")

    fmax = target = clock = None
    for line in lines:
        match = _FMAX.match(line)
        if match:
            clock, fmax, target = match.group(1), float(match.group(2)), float(match.group(4))

    path = None
    current = None
    for line in lines:
        match = _CRIT.match(line)
        if match:
            current = {"clock": match.group(1), "steps": []}
            continue
        if current is None:
            continue
        step = _STEP.match(line)
        if step:
            current["steps"].append((step.group(3), step.group(4), float(step.group(2))))
            continue
        if current["steps"] and not line.startswith("Info:     ") and "Info: " in line \
                and not _STEP.match(line):
            # The path ended; keep the last complete one (a register-to-register
            # path has a Source and a Setup/Sink step).
            kinds = [k for k, _, _ in current["steps"]]
            if "Source" in kinds and ("Setup" in kinds or "Sink" in kinds):
                path = _path(current)
            current = None
    if current is not None and current["steps"]:
        kinds = [k for k, _, _ in current["steps"]]
        if "Source" in kinds and ("Setup" in kinds or "Sink" in kinds):
            path = _path(current)
    warnings = sum(1 for line in lines if line.startswith("Warning:"))
    return NextpnrResult(utilisation=utilisation, fmax_mhz=fmax, target_mhz=target,
                         clock=clock, critical_path=path, warnings=warnings)


def _path(current):
    steps = current["steps"]
    start = next(name for kind, name, _ in steps if kind == "Source")
    sinks = [name for kind, name, _ in steps if kind in ("Sink", "Setup")]
    return CriticalPath(clock=current["clock"], start=start, end=sinks[-1],
                        delay_ns=steps[-1][2])


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


def format_table(header, rows):
    """A plain-text table, columns padded to their widest cell."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
