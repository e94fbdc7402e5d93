"""A simulation-only stand-in for `ProcessingElement` whose multiply-add is one
C call (`mxu_mac_f32` in ``sim/backends/csrc/fast_mac.h``) instead of the bit-level fp32
datapath.

Everything else about the PE is the same: ports, active/shadow weights, the
switch marker, the clock enable, reset values and the `mac_stages` latency. The C
function computes ``acc + a*w`` in IEEE binary32 with round-to-nearest-even
(x86-64 SSE arithmetic, no fast-math), i.e. exactly the golden model's NumPy
float32 order, with NaN made canonical. Whole-chip runs use it when asked
(``Chip(..., fast_mac=True)``): the RTL PE is verified bit-exact against the same
arithmetic by the unit regressions, and `tests/test_sim_chip.py` checks that both
PEs give identical results and identical cycle counts on the chip.
"""

import functools

__all__ = ["fast_pe_verilog"]

_TEMPLATE = """\
module {name}(west__data, west__switch, north__data, north__valid, weight__data,
    weight__load, clk, rst, east__data, east__switch, south__data, south__valid, en);
  /*verilator no_inline_module*/
  import "DPI-C" pure function int unsigned mxu_mac_f32(input int unsigned a,
      input int unsigned w, input int unsigned acc);
  input clk, rst, en;
  input [15:0] west__data;
  input west__switch;
  input [31:0] north__data;
  input north__valid;
  input [15:0] weight__data;
  input weight__load;
  output reg [15:0] east__data = 16'h0;
  output reg east__switch = 1'b0;
  output [31:0] south__data;
  output south__valid;
  reg [15:0] active = 16'h0, shadow = 16'h0;
  reg [31:0] sum [0:{last}];
  reg valid [0:{last}];
  wire [15:0] w = west__switch ? shadow : active;
  integer i;
  initial for (i = 0; i <= {last}; i = i + 1) begin sum[i] = 32'h0; valid[i] = 1'b0; end
  always @(posedge clk) begin
    if (rst) begin
      east__data <= 16'h0; east__switch <= 1'b0; active <= 16'h0; shadow <= 16'h0;
      for (i = 0; i <= {last}; i = i + 1) begin sum[i] <= 32'h0; valid[i] <= 1'b0; end
    end else if (en) begin
      east__data <= west__data;
      east__switch <= west__switch;
      if (west__switch) active <= shadow;
      if (weight__load) shadow <= weight__data;
      sum[0] <= mxu_mac_f32({{16'h0, west__data}}, {{16'h0, w}}, north__data);
      valid[0] <= north__valid;
      for (i = 1; i <= {last}; i = i + 1) begin sum[i] <= sum[i - 1]; valid[i] <= valid[i - 1]; end
    end
  end
  assign south__data = sum[{last}];
  assign south__valid = valid[{last}];
endmodule
"""


@functools.lru_cache(maxsize=None)
def fast_pe_verilog(stages):
    """(module name, Verilog) of the fast PE with `stages` cycles of MAC latency."""
    name = f"mxu_pe_fast_s{stages}"
    return name, _TEMPLATE.format(name=name, last=stages - 1)
