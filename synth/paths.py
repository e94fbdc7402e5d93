"""The worst timing path into every block of a placed and routed design.

nextpnr reports one critical path per clock. To see which blocks are close to
the target, not only the worst one, `worst_paths` runs a static timing
analysis over the SDF nextpnr writes after routing (``--sdf``): the cells'
delays (``IOPATH``: clock-to-output and combinational arcs), every routed
connection (``INTERCONNECT``) and the registers' setup times
(``SETUPHOLD``). Every path starts at a clocked output and ends at a clocked
input, as nextpnr's own analysis does for a single clock; the clock network's
skew is not modelled (nextpnr-ecp5 routes the clock on a global network).
The worst path it finds is nextpnr's critical path (tests/test_synth_report.py
holds the two to each other on a stored run).
"""

import re
from collections import defaultdict
from dataclasses import dataclass

__all__ = ["TimingPath", "parse_sdf", "worst_paths", "block_of", "design_name"]


@dataclass(frozen=True)
class TimingPath:
    """One register-to-register path: the worst one into `block`."""
    block: str            # the block of its end register (`block_of`)
    delay_ns: float       # clock-to-output, logic and routing, setup
    slack_ns: float       # the clock period minus `delay_ns`
    start: str            # design name of the start register (`design_name`)
    end: str              # ... and of the end register
    cells: int            # cells on the path, the start and end registers included

    def row(self):
        return [self.block, f"{self.slack_ns:+.2f}", f"{self.delay_ns:.2f}",
                f"{self.start} -> {self.end}", self.cells]


_NAME = r"((?:\\.|[^\s()\\])+)"
_TRIPLE = r"\(([-0-9.e]*):([-0-9.e]*):([-0-9.e]*)\)"
_CELLTYPE = re.compile(r'^\s*\(CELLTYPE\s+"([^"]*)"\)')
_INSTANCE = re.compile(r"^\s*\(INSTANCE\s*" + _NAME + r"?\s*\)")
_INTERCONNECT = re.compile(r"^\s*\(INTERCONNECT\s+" + _NAME + r"\s+" + _NAME + r"\s+" + _TRIPLE
                           + r"\s*" + _TRIPLE)
_IOPATH = re.compile(r"^\s*\(IOPATH\s+" + _NAME + r"\s+" + _NAME + r"\s+" + _TRIPLE + r"\s*"
                     + _TRIPLE)
_SETUPHOLD = re.compile(r"^\s*\(SETUPHOLD\s+\((?:posedge|negedge)\s+" + _NAME + r"\)\s+"
                        r"\((?:posedge|negedge)\s+" + _NAME + r"\)\s+" + _TRIPLE)


def _unescape(name):
    return re.sub(r"\\(.)", r"\1", name)


def _ps(*values):
    return max(float(v) for v in values if v not in ("", None))


class TimingGraph:
    """Pins (``(cell, port)``) and the delays between them, in picoseconds."""

    def __init__(self):
        self.edges = defaultdict(list)     # pin -> [(next pin, delay)]
        self.launch = {}                   # clocked output pin -> clock-to-output
        self.setup = {}                    # clocked input pin -> setup time
        self.cell_type = {}


def parse_sdf(text):
    """A `TimingGraph` from the text of an SDF file written by nextpnr."""
    graph = TimingGraph()
    cell = None
    arcs = []
    clocks = set()

    def finish():
        # A cell's arcs from a clock port are clock-to-output delays; the rest
        # are combinational.
        for src, dst, delay in arcs:
            if src in clocks:
                graph.launch[(cell, dst)] = max(delay, graph.launch.get((cell, dst), 0.0))
            else:
                graph.edges[(cell, src)].append(((cell, dst), delay))

    for line in text.splitlines():
        match = _INTERCONNECT.match(line)
        if match:
            src, dst = _unescape(match.group(1)), _unescape(match.group(2))
            a_cell, _, a_port = src.rpartition("/")
            b_cell, _, b_port = dst.rpartition("/")
            delay = _ps(*match.group(3, 4, 5, 6, 7, 8))
            graph.edges[(a_cell, a_port)].append(((b_cell, b_port), delay))
            continue
        match = _IOPATH.match(line)
        if match:
            arcs.append((_unescape(match.group(1)), _unescape(match.group(2)),
                         _ps(*match.group(3, 4, 5, 6, 7, 8))))
            continue
        match = _SETUPHOLD.match(line)
        if match:
            pin, clock = _unescape(match.group(1)), _unescape(match.group(2))
            clocks.add(clock)
            graph.setup[(cell, pin)] = _ps(*match.group(3, 4, 5))
            continue
        match = _CELLTYPE.match(line)
        if match:
            if cell is not None:
                finish()
            cell, arcs, clocks = None, [], set()
            celltype = match.group(1)
            continue
        match = _INSTANCE.match(line)
        if match:
            cell = _unescape(match.group(1) or "")
            graph.cell_type[cell] = celltype
    if cell is not None:
        finish()
    # Ports named as clocks by a cell's checks launch its registered outputs;
    # a cell with no check (a DSP with unregistered inputs) keeps CLK-named
    # arcs as launches too.
    for (c, port), nexts in list(graph.edges.items()):
        if port.upper().startswith("CLK") and c and graph.cell_type.get(c) != "top":
            for pin, delay in nexts:
                if pin[0] == c:
                    graph.launch[pin] = max(delay, graph.launch.get(pin, 0.0))
            graph.edges[(c, port)] = [(pin, d) for pin, d in nexts if pin[0] != c]
    return graph


def design_name(cell):
    """The design's name inside a nextpnr cell name: ``unit.core.load_dma.ld_k``
    from ``unit.core.load_dma.ld_k_TRELLIS_FF_Q_1`` (Yosys and nextpnr append
    the mapped cell's type and pin to the register or net it came from)."""
    cut = re.split(r"_(?:TRELLIS_|LUT4|CCU2C|MULT18X18D|DP16KD|PFUMX|L6MUX|DPR16X4)|\$", cell,
                   maxsplit=1)
    return cut[0]


_PE = re.compile(r"pe_\d+_\d+")


def block_of(name):
    """The block a design name belongs to: the first two levels of its module
    path below the wrapper (``unit.``) and the chip's core (``core.``), all PEs
    as one (``compute.array.PE``); ``unit.core.load_dma.ld_k`` is in
    ``load_dma``, ``unit.mac.round.x`` (a PE alone) in ``mac.round``."""
    parts = name.split(".")[:-1]            # the module path, without the register
    for prefix in ("unit", "core"):
        if parts and parts[0] == prefix:
            parts = parts[1:]
    for i, part in enumerate(parts):
        if _PE.fullmatch(part):
            return ".".join(parts[:i] + ["PE"])
    return ".".join(parts[:2]) or "(top)"


def _path_block(names, block):
    """The block a path belongs to: its end register's, else (a wrapper's
    register) its start register's, else the block most of its cells are in."""
    outside = "(top)"
    for name in (names[0], names[-1]):
        if block(name) != outside:
            return block(name)
    inner = [block(n) for n in names if block(n) != outside]
    return max(set(inner), key=inner.count) if inner else outside


def worst_paths(graph, period_ns, *, count=5, block=block_of):
    """The worst path of each block (`_path_block`: the block of its end
    register, or of its start register or most of its cells when that is a
    wrapper's), worst first, the first `count` blocks: a list of `TimingPath`."""
    # Longest arrival time at every pin, from the clocked outputs, in
    # topological order (the graph between registers is acyclic).
    indegree = defaultdict(int)
    for pin, nexts in graph.edges.items():
        for nxt, _ in nexts:
            indegree[nxt] += 1
    arrival = dict(graph.launch)
    previous = {}
    ready = [pin for pin in graph.edges if indegree[pin] == 0]
    ready += [pin for pin in graph.launch if indegree[pin] == 0 and pin not in graph.edges]
    seen = set()
    while ready:
        pin = ready.pop()
        if pin in seen:
            continue
        seen.add(pin)
        here = arrival.get(pin)
        for nxt, delay in graph.edges.get(pin, ()):
            # A clocked output starts a new path: arrivals do not pass through it.
            if here is not None and nxt not in graph.launch:
                total = here + delay
                if total > arrival.get(nxt, -1.0):
                    arrival[nxt] = total
                    previous[nxt] = pin
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    best = {}
    for pin, setup in graph.setup.items():
        if pin not in arrival or pin in graph.launch:
            continue
        total = arrival[pin] + setup
        cells = [pin[0]]
        cursor = pin
        while cursor in previous:
            cursor = previous[cursor]
            if cursor[0] != cells[-1]:
                cells.append(cursor[0])
        key = _path_block([design_name(c) for c in cells], block)
        if key not in best or total > best[key][0]:
            best[key] = (total, cells)
    paths = []
    for key, (total, cells) in best.items():
        paths.append(TimingPath(block=key, delay_ns=round(total / 1000, 3),
                                slack_ns=round(period_ns - total / 1000, 3),
                                start=design_name(cells[-1]), end=design_name(cells[0]),
                                cells=len(cells)))
    paths.sort(key=lambda p: -p.delay_ns)
    return paths[:count]
