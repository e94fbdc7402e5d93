"""Verilog generation: components to Verilog text, for simulators and other flows."""

import contextlib
import functools
import re

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from mxu.hdl.array import SystolicArray
from mxu.hdl.compute import pending_entry_layout, pending_rows_depth
from mxu.hdl.hooks import BuildHooks
from mxu.hdl.pe import ProcessingElement
from mxu.hdl.vmem import _addr_shape

from .axi_memory import axi_memory_verilog
from .link_model import link_model_verilog
from .fast_array import fast_datapath_verilog
from .fast_pending import fast_pending_verilog
from .fast_vpu import fast_vpu_adder_verilog, fast_vpu_lanes_verilog, fast_vpu_max_verilog

__all__ = ["to_verilog", "lean_verilog", "pe_verilog", "vpu_lane_verilog", "array_verilog",
           "chip_verilog", "dma_system_verilog"]


class RegisteredReset(wiring.Component):
    """Simulation top: `component` with the same ports, whose ``sync`` reset is
    the ``rst`` input taken through a flip-flop (the chip leaves reset one
    cycle after ``rst`` falls).

    Amaranth writes every register's next state as combinational logic that
    ends in ``if (rst)``. With ``rst`` a top-level input, Verilator evaluates
    all of that logic in its input-combinational region, at every ``eval()``
    (twice a cycle in the harnesses that evaluate clk low) besides after the
    clock edge; from a flip-flop it is evaluated once a cycle. Measured on the 16x16 chip with the
    vector unit: docs/simulation.md.

    With `axi_memory` (a module name from `mxu.sim.backends.axi_memory`), the
    component's ``axi`` port is not a port: it connects to an instance of
    that memory model (``memory``), for the native harness. With
    `link_model` (from `mxu.sim.backends.link_model`), likewise the ``links``
    port connects to that link model (``link_model``)."""

    def __init__(self, component, axi_memory=None, link_model=None):
        self._inner = component
        self._axi_memory = axi_memory
        self._link_model = link_model
        members = dict(component.signature.members.items())
        if {"clk", "rst"} & set(members):
            raise ValueError("the component already has a port named clk or rst")
        if axi_memory is not None:
            del members["axi"]
        if link_model is not None:
            del members["links"]
        super().__init__({**members, "clk": In(1), "rst": In(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.chip = inner = self._inner
        m.domains.sync = ClockDomain()
        rst_q = Signal(init=1, reset_less=True)
        m.d.sync += rst_q.eq(self.rst)
        m.d.comb += [ClockSignal("sync").eq(self.clk), ResetSignal("sync").eq(rst_q)]
        if self._axi_memory is not None:
            m.submodules.memory = self._memory(inner.axi)
        if self._link_model is not None:
            m.submodules.link_model = self._links(inner.links)
        for name, member in inner.signature.members.items():
            if name not in self.signature.members:
                continue
            ours, theirs = getattr(self, name), getattr(inner, name)
            if not member.is_port:
                wiring.connect(m, wiring.flipped(ours), theirs)
            elif member.flow == In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        return m

    def _memory(self, axi):
        from .axi_memory import MASTER_FIELDS, SLAVE_FIELDS
        master = ["wdata", "wstrb", "awaddr", "araddr", *(n for n, _ in MASTER_FIELDS)]
        slave = ["rdata", *(n for n, _ in SLAVE_FIELDS)]
        return Instance(self._axi_memory, i_clk=ClockSignal("sync"),
                        **{f"i_{n}": getattr(axi, n) for n in master},
                        **{f"o_{n}": getattr(axi, n) for n in slave})


    def _links(self, links):
        from .link_model import CHIP_OUTPUTS, link_model_ports

        def signal(i, member):
            value = links[i]
            for part in member.split("__"):
                value = getattr(value, part)
            return value
        return Instance(self._link_model, i_clk=ClockSignal("sync"),
                        **{("i_" if member in CHIP_OUTPUTS else "o_") + port: signal(i, member)
                           for port, (i, member) in link_model_ports(len(links)).items()})


def to_verilog(component, name="top"):
    """Verilog text of an Amaranth `wiring.Component`, with ports from its signature."""
    return verilog.convert(component, name=name, emit_src=False)


@contextlib.contextmanager
def _no_zero_meminit():
    """Amaranth writes a memory's initial contents bit by bit, even when they are
    all zero: 12 Mbit of VMEM and accumulator make conversion take ~15 s and give
    Verilator a huge initial block. Simulators start memories at zero anyway, so
    skip the all-zero ``$meminit`` cells while converting."""
    from amaranth.back import rtlil
    emitter = rtlil.ModuleEmitter
    original = emitter.emit_memory

    def emit_memory(self, cell_idx, cell):
        if any(cell.init):
            original(self, cell_idx, cell)

    emitter.emit_memory = emit_memory
    try:
        yield
    finally:
        emitter.emit_memory = original


def lean_verilog(component, name="top"):
    """`to_verilog` without all-zero memory initialisers (for
    simulation: Verilator starts memories at zero)."""
    with _no_zero_meminit():
        return to_verilog(component, name)


@functools.lru_cache(maxsize=None)
def array_verilog(rows, cols, stages, weight_queue_depth=None, fast=False, weight_rows=1):
    """Verilog (module ``top``) of ``SystolicArray(rows, cols, stages, weight_rows=...)``.

    The PE is generated once as module ``mxu_pe_s<stages>`` and instantiated
    ``rows*cols`` times, so this costs seconds at any size (elaborating every PE
    in Amaranth takes 38 s at 16x16). With `fast`, the PE grid is the C++ model
    of `mxu.sim.backends.fast_array` instead."""
    if fast:
        name, datapath = fast_datapath_verilog(rows, cols, stages, weight_rows)
        top = SystolicArray(rows, cols, stages, weight_rows=weight_rows,
                            weight_queue_depth=weight_queue_depth,
                            hooks=BuildHooks(datapath_module=name))
        return datapath + to_verilog(top)
    pe_name, pe = pe_verilog(stages)
    top = SystolicArray(rows, cols, stages, weight_rows=weight_rows,
                        weight_queue_depth=weight_queue_depth, hooks=BuildHooks(pe_module=pe_name))
    return pe + to_verilog(top)


@functools.lru_cache(maxsize=None)
def pe_verilog(stages):
    """(module name, Verilog) of ``ProcessingElement(stages)``, for designs that
    instantiate the PE by name (``BuildHooks(pe_module=name)``)."""
    pe_name = f"mxu_pe_s{stages}"
    # Keep the PE a module of its own in Verilator: one C++ class instantiated
    # rows*cols times instead of rows*cols inlined copies. Measured on 16x16:
    # build 124 s instead of 327 s, and the model runs slightly faster.
    return pe_name, _not_inlined(to_verilog(ProcessingElement(stages), name=pe_name), pe_name)


@functools.lru_cache(maxsize=None)
def vpu_lane_verilog(stages=1):
    """(module name, Verilog) of `VectorLane` with fp32 units of `stages`
    stages, for designs that instantiate the lane by name
    (``BuildHooks(vpu_modules={"lane": name})``): one C++ class in Verilator
    however many lanes, as for the PE."""
    from mxu.hdl.vpu import VectorLane
    name = "mxu_vpu_lane" + (f"_s{stages}" if stages > 1 else "")
    return name, _not_inlined(to_verilog(VectorLane(stages=stages), name=name), name)


def _not_inlined(text, module):
    head = text.index(");", text.index(f"module {module}(")) + 2
    return text[:head] + "\n  /*verilator no_inline_module*/" + text[head:]


@functools.lru_cache(maxsize=8)
def dma_system_verilog(config):
    """Verilog of ``DmaSystem(config)`` (module ``top``), cached per process."""
    from mxu.hdl.dma import DmaSystem
    return lean_verilog(DmaSystem(config))


@functools.lru_cache(maxsize=4)
def chip_verilog(config, fast_mac=False, trace=False, fast_lanes=None, units=False,
                 memory=False, idle_gating=True, one_eval=False):
    """Verilog (module ``top``) of ``MxuChip(config)`` for simulation: the PE is a
    separate module instantiated rows*cols times (the RTL `ProcessingElement`,
    `pe_verilog`), or with `fast_mac` the whole PE grid is one C++ model
    (`mxu.sim.backends.fast_array`), and so is the compute engine's record
    of pending rows (`mxu.sim.backends.fast_pending`). `trace` adds the profiler's trace port.
    `units` keeps every unit of the core (``top.chip.core.<unit>``) a C++ class
    of its own in Verilator, so that a sampling profiler names the unit that
    spends the time (`units_not_inlined`). `memory` puts the external-memory
    model inside (`mxu.sim.backends.axi_memory`; the top then has no ``axi``
    port), and the links' model (`mxu.sim.backends.link_model`): the native
    harness's build. With `fast_mac` and `idle_gating`, the clocks of the
    vector unit and of the store engine with its DMA are gated in the cycles
    where they hold still (`clock_gate_verilog`, docs/simulation.md).

    With `one_eval` too, the model takes one ``eval()`` per cycle: every
    clocked block runs at both edges of its clock (`both_edges`), so the
    harness toggles ``clk`` once a cycle, and the gates are outside the chip
    (``BuildHooks(gate_ports=True)``): the harness toggles ``gate_<e>_clk``
    with ``clk`` in the cycles whose ``gate_<e>_awake`` was high before the
    edge. The harness must be built with ``MXU_ONE_EVAL``."""
    from mxu.hdl.top import MxuChip
    if fast_mac:
        pe_name, (datapath_name, pe) = None, fast_datapath_verilog(
            config.rows, config.cols, config.mac_stages, config.weight_rows_per_cycle)
    else:
        datapath_name, (pe_name, pe) = None, pe_verilog(config.mac_stages)
    # With the vector unit, its lane is a module of its own too (with
    # `fast_lanes`, default `fast_mac`, one stand-in for the whole row of lanes
    # whose element op is a C call, `mxu.sim.backends.fast_vpu`).
    # The fast lanes come with fast fp32 adders and max units for the
    # reduction tree.
    fast_lanes = fast_mac if fast_lanes is None else fast_lanes
    vpu_modules, vpu = None, ""
    if config.vpu:
        if fast_lanes:
            lanes_name, vpu = fast_vpu_lanes_verilog(config.cols, config.vpu_stages)
            vpu_modules = {"lanes": lanes_name}
            vpu_modules["fadd"], adder = fast_vpu_adder_verilog()
            vpu_modules["fmax"], larger = fast_vpu_max_verilog()
            vpu_modules["used"] = ("fadd", "fmax")
            vpu += adder + larger
            # The transpose block as a memory: same bits and cycles, and
            # Verilator writes one row when one arrives instead of evaluating
            # every element's register each cycle (docs/simulation.md).
            vpu_modules["transpose"] = "memory"
        else:
            lane_name, vpu = vpu_lane_verilog(config.vpu_stages)
            vpu_modules = {"lane": lane_name}
    gated = fast_mac and idle_gating
    one_eval = one_eval and gated
    gate_name, gate = clock_gate_verilog() if gated and not one_eval else (None, "")
    pending_name, pending = fast_pending_module(config) if fast_mac else (None, "")
    hooks = BuildHooks(pe_module=pe_name, datapath_module=datapath_name,
                       pending_module=pending_name, vpu_modules=vpu_modules,
                       clock_gate=gate_name, gate_ports=one_eval)
    chip = MxuChip(config, trace=trace, hooks=hooks)
    memory_name, memory_text = (axi_memory_verilog(config.axi_data_bits, config.axi_addr_bits)
                                if memory else (None, ""))
    links_name, links_text = (link_model_verilog(config.links, 8 * config.link_flit_bytes)
                              if memory and config.links else (None, ""))
    text = lean_verilog(RegisteredReset(chip, axi_memory=memory_name, link_model=links_name))
    if gated:
        text = fold_resets(text)
    text = pe + vpu + gate + pending + memory_text + links_text + \
        (units_not_inlined(text) if units else text)
    return both_edges(text) if one_eval else text


def both_edges(text):
    """`text` with every ``always @(posedge c)`` block run at both edges of
    ``c`` (``posedge c or negedge c``), for a harness that toggles each clock
    once a cycle: Verilator then evaluates the model once a cycle instead of
    twice (docs/simulation.md). Refuses Verilog that already uses a falling
    edge."""
    if re.search(r"\bnegedge\b", text):
        raise ValueError("both_edges: the Verilog already uses negedge")
    def both(match):
        # An escaped name ends at a space.
        clock = match[1] + (" " if match[1].startswith("\\") else "")
        return f"@(posedge {clock} or negedge {clock})"
    text, count = re.subn(r"@\(posedge (\\?\S+?)\s*\)", both, text)
    if count != len(re.findall(r"\bposedge\b", text)):
        # A block on a rising edge among other events would run at half speed.
        raise ValueError("both_edges: a posedge outside a lone @(posedge clock)")
    return text


def fast_pending_module(config):
    """(module name, Verilog) of the C++ stand-in for `config`'s compute engine's
    record of pending rows (`mxu.sim.backends.fast_pending`)."""
    addr = _addr_shape(config.acc_rows)
    return fast_pending_verilog(pending_rows_depth(config), addr.width,
                                pending_entry_layout(addr).size)


def clock_gate_verilog():
    """(module name, Verilog) of a clock gate for simulation: ``gclk`` is
    ``clk`` in the cycles whose ``en`` was high at the falling edge before
    (sampled there, so that ``en`` changing after a rising edge cannot make a
    second edge). Verilator evaluates the logic that depends only on
    registers clocked by ``gclk`` at ``gclk``'s edges alone."""
    name = "mxu_clock_gate"
    return name, f"""module {name}(clk, en, gclk);
  input clk;
  input en;
  output gclk;
  reg en_low = 1'b1;
  always @(negedge clk) en_low <= en;
  assign gclk = clk & en_low;
endmodule
"""


_COMB_BLOCK = re.compile(r"  always @\* begin\n(.*?)\n  end\n", re.S)
# A block's last statement when it sets the block's wire to a constant under
# a one-signal condition: a (synchronous) reset.
_CONSTANT_AT_END = re.compile(
    r"\n    if \((\\\S+ |\w+)\) begin\n      \\(\$\d+)  = (\d+'[bdh][0-9a-fA-F_]+);\n    end$")
_FLOP = re.compile(r"  always @\(posedge (\\\S+ |\w+)\)\n    (\\\S+ |\w+) <= \\(\$\d+) ;\n")


def fold_resets(text):
    """`text` with the synchronous resets of its registers moved from their
    next-state logic into their clocked blocks. Amaranth writes a register
    as ``next = ...; if (rst) next = init;`` (one ``if`` per reset: the
    domain's, a soft reset, a start) in combinational logic and ``reg <=
    next`` at the edge, so every register's next state reads the resets,
    and a unit on a gated clock (`clock_gate_verilog`) reads signals that
    change with the ungated one. As ``if (rst) reg <= init; else reg <=
    next;`` the next state reads the unit's own signals only, and Verilator
    tests each reset once per clocked block. The same registers: a register
    is folded only when its next-state wire is read by its own block and its
    flip-flop alone (docs/simulation.md, "Idle gating")."""
    modules = text.split("\nmodule ")
    return "\nmodule ".join([modules[0]] + [_fold_module(m) for m in modules[1:]])


def _fold_module(text):
    flops = {m.group(3): m for m in _FLOP.finditer(text)}
    edits = []                                  # (start, end, replacement)
    for block in _COMB_BLOCK.finditer(text):
        body, resets = block.group(1), []
        while (last := _CONSTANT_AT_END.search(body)) is not None:
            resets.append(last.groups())
            body = body[:last.start()]
        wires = {wire for _, wire, _ in resets}
        if len(wires) != 1:
            continue
        wire = wires.pop()
        flop = flops.get(wire)
        # Its declaration, its block and its flip-flop; if read elsewhere too, left as it is.
        if flop is None or text.count(f"\\{wire} ") != block.group(0).count(f"\\{wire} ") + 2:
            continue
        edits.append((block.start(), block.end(), f"  always @* begin\n{body}\n  end\n"))
        clock, reg = flop.groups()[:2]
        # The last ``if`` of the block won: test it first.
        chain = "".join(f"if ({cond}) {reg} <= {value}; else " for cond, _, value in resets)
        edits.append((flop.start(), flop.end(),
                      f"  always @(posedge {clock})\n    {chain}{reg} <= \\{wire} ;\n"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def units_not_inlined(text, scope="top.chip.core"):
    """`text` with every module directly under `scope` (Amaranth names it
    ``\\<scope>.<unit>``) marked ``no_inline_module``: Verilator then keeps
    its logic in functions of its own class (``Vtop_<scope>_<unit>...``)
    instead of the top's. For profiling: the model runs slower so."""
    pattern = re.compile(r"^module \\" + re.escape(scope) + r"\.(\w+) \(.*?\);", re.M | re.S)
    return pattern.sub(lambda match: match.group(0) + "\n  /*verilator no_inline_module*/", text)
