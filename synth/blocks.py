"""The chip's blocks one at a time, for synthesis: each as the chip builds it,
with the ports the chip leaves unused tied off the same way, so that a block
placed and routed alone has the logic it has in the chip.

These are the blocks that have held the whole chip's critical path on the
LFE5U-85F (docs/synth.md, "Timing"): the timing guard (`mxu.synth.guard`)
places and routes each of them alone, and ``mxu synth --unit NAME`` runs any
one of them.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring

from mxu.hdl.controller import Controller
from mxu.hdl.dma import Dma
from mxu.hdl.expander import Expander
from mxu.hdl.fetch import InstructionFetch
from mxu.hdl.loop import LoopExpander
from mxu.hdl.numerics import Fp32Adder, Fp32Multiplier
from mxu.hdl.regs import RegisterFile
from mxu.hdl.vpu import ReductionTree, VectorLane

__all__ = ["BLOCK_UNITS", "Block", "PortSubset", "block_unit"]


class PortSubset(wiring.Component):
    """`unit` with only the ports `keep` accepts; the other inputs are tied to
    zero, as the chip ties them, and the other outputs are left open.

    Parameters
    ----------
    unit : wiring.Component
    keep : callable
        ``keep(path)`` for a port's path in ``unit.signature.flatten`` (a tuple
        of member names, e.g. ``("axi", "araddr")``): True to bring it out.

    Interface
    ---------
    The members of ``unit.signature`` that hold a kept port, with only their
    kept ports (nested signatures are filtered member by member).
    """

    def __init__(self, unit, keep):
        self._unit = unit
        self._keep = keep
        members = _kept_members(unit.signature, keep, ())
        if not members:
            raise ValueError(f"PortSubset keeps no port of {type(unit).__name__}")
        super().__init__(wiring.Signature(members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self._unit
        for path, member, inner in unit.signature.flatten(unit):
            if not self._keep(path):
                if member.flow == wiring.In:
                    m.d.comb += inner.eq(0)
                continue
            outer = self
            for part in path:
                outer = outer[part] if isinstance(part, int) else getattr(outer, part)
            if member.flow == wiring.In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        return m


def _kept_members(signature, keep, prefix):
    members = {}
    for name, member in signature.members.items():
        path = prefix + (name,)
        if member.is_signature:
            # `member.signature` is seen from the unit (flipped for an In
            # member), and so are the filtered members: an Out holds them as they are.
            inner = _kept_members(member.signature, keep, path)
            if inner:
                members[name] = wiring.Out(wiring.Signature(inner))
        elif keep(path):
            members[name] = member
    return members


def _axi_read(path):
    """The AR and R channels of the AXI port (the load DMA's)."""
    return path[0] != "axi" or path[1].startswith(("ar", "r"))


def _axi_write(path):
    """The AW, W and B channels of the AXI port (the store DMA's)."""
    return path[0] != "axi" or path[1].startswith(("aw", "w", "b"))


class Block:
    """One block of the chip for `mxu.synth.run.design`.

    Parameters
    ----------
    name : str
        The ``--unit`` name.
    title : str
        What it is, for reports.
    build : callable
        ``build(config)``: the component, with the ports the chip uses.
    serial : bool
        Its ports outnumber the package's pins: place it behind `SerialPorts`
        (else `RegisteredPorts`). Both put a flip-flop on every port bit.
    """

    def __init__(self, name, title, build, *, serial):
        self.name, self.title, self.build, self.serial = name, title, build, serial


BLOCK_UNITS = {b.name: b for b in [
    # In the chip the load DMA's store half sees no AW/W/B handshake and no
    # on-chip read data, and the store DMA's load half no R beat (hdl/top.py).
    Block("load_dma", "load DMA (a Dma with its store half tied off, as in the chip)",
          lambda c: PortSubset(Dma(c), lambda p: p[0] not in ("vmem_read", "acc_read")
                               and _axi_read(p)), serial=True),
    Block("store_dma", "store DMA (a Dma with its load half tied off, as in the chip)",
          lambda c: PortSubset(Dma(c), lambda p: not p[0].startswith(("vmem_write", "acc_write"))
                               and _axi_write(p)), serial=True),
    # The load DMA's weight expander, on its own: the fp32 datapath between
    # the bus and VMEM (hdl/expander.py).
    Block("expander", "weight expander (the load DMA's, quant_rows rows a cycle; every "
          "format that fits when the chip has none)",
          lambda c: Expander(c if c.quant_formats else c.replace(quant_formats=None)),
          serial=False),
    Block("controller", "controller (decode, queues, tokens, status, counters)",
          lambda c: Controller(c), serial=True),
    Block("regs", "host register file (AXI4-Lite slave)", lambda c: RegisterFile(c), serial=True),
    Block("fetch", "instruction fetch", lambda c: PortSubset(InstructionFetch(c), _axi_read),
          serial=True),
    Block("loop", "one LOOP expander", lambda c: LoopExpander(c), serial=True),
    Block("lane", "one vector lane (VectorLane, every VpuOp)",
          lambda c: VectorLane(stages=c.vpu_stages), serial=False),
    # A lane is a pipeline of fp32 units of `vpu_stages` stages each
    # (hdl/pipeline.py), with integer glue between them: these are the units
    # alone between registers.
    Block("lane_fadd", "a vector lane's fp32 adder (Fp32Adder of vpu_stages stages)",
          lambda c: Fp32Adder(c.vpu_stages), serial=False),
    Block("lane_fmul", "a vector lane's fp32 multiplier (Fp32Multiplier of vpu_stages stages)",
          lambda c: Fp32Multiplier(stages=c.vpu_stages), serial=False),
    # The row reductions behind the lanes: `tree_levels` levels of adders and
    # max units, every op's row beside them.
    Block("tree", "the vector unit's reduction tree (ReductionTree: cols lanes, vpu_stages)",
          lambda c: ReductionTree(c), serial=True),
]}


def block_unit(name, config):
    """The component of block `name` for `config`."""
    try:
        return BLOCK_UNITS[name].build(config)
    except KeyError:
        raise ValueError(f"unknown block {name!r}; choose one of {', '.join(BLOCK_UNITS)}") from None
