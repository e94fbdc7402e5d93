"""`mxu.sim.backends.verilog.fold_resets`: the synchronous resets of a
register moved into its clocked block, in Amaranth's order, and only where
the next-state wire has no other reader."""

import re

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mxu.sim.backends.verilog import both_edges, fold_resets, to_verilog


class _Counters(wiring.Component):
    en: In(1)
    kept: Out(8)
    peek: Out(8)

    def elaborate(self, platform):
        m = Module()
        folded, read = Signal(8), Signal(8)
        with m.If(self.en):
            m.d.sync += [folded.eq(folded + 1), read.eq(read + 2)]
        m.d.comb += [self.kept.eq(folded), self.peek.eq(read)]
        return m


def _text():
    plain = to_verilog(_Counters())
    return plain, fold_resets(plain)


def test_a_register_gets_its_resets_in_its_clocked_block():
    plain, folded = _text()
    assert re.search(r"if \(rst\) begin\n\s+\\\$\d+  = 8'h00;", plain)
    assert not re.search(r"if \(rst\) begin", folded)
    for reg in ("kept", "peek"):         # Yosys names the registers after the outputs
        assert re.search(rf"if \(rst\) {reg} <= 8'h00; else {reg} <= \\\$\d+ ;", folded), reg


def test_resets_keep_their_priority_and_other_readers_block_the_fold():
    text = """module m(clk, rst, clear, d, q, r);
  input clk; input rst; input clear; input [3:0] d; output [3:0] q; output [3:0] r;
  reg [3:0] q = 4'h0;
  reg [3:0] \\$1 ;
  reg [3:0] \\$2 ;
  reg [3:0] s = 4'h0;
  assign r = \\$2 ;
  always @(posedge clk)
    q <= \\$1 ;
  always @(posedge clk)
    s <= \\$2 ;
  always @* begin
    \\$1  = d;
    if (clear) begin
      \\$1  = 4'h5;
    end
    if (rst) begin
      \\$1  = 4'h0;
    end
  end
  always @* begin
    \\$2  = d;
    if (rst) begin
      \\$2  = 4'h0;
    end
  end
endmodule
"""
    folded = fold_resets("\nmodule ".join(["", text[len("module "):]]))
    # The last `if` of the block wins, so it is tested first.
    assert "if (rst) q <= 4'h0; else if (clear) q <= 4'h5; else q <= \\$1 ;" in folded
    assert "s <= \\$2 ;" in folded and "if (rst) s" not in folded      # $2 is read by r too


def test_both_edges_runs_every_clocked_block_at_both_edges():
    """`both_edges` (the models evaluated once a cycle, docs/simulation.md):
    every lone rising-edge event gets the falling edge too; Verilog it cannot
    transform whole is refused rather than left half-clocked."""
    text = "always @(posedge clk)\n  q <= d;\nalways @(posedge \\gate.clk )\n  r <= q;\n"
    assert both_edges(text) == ("always @(posedge clk or negedge clk)\n  q <= d;\n"
                                "always @(posedge \\gate.clk  or negedge \\gate.clk )\n  r <= q;\n")
    for bad in ("always @(negedge clk) q <= d;", "always @(posedge clk, posedge rst) q <= d;"):
        with pytest.raises(ValueError, match="both_edges"):
            both_edges(bad)
