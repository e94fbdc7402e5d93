"""A simulation-only stand-in for the systolic array's datapath: the PE grid,
its skew and de-skew registers and its weight bus as one module whose work is a
C++ model (``sim/backends/csrc/fast_array.h``), called once per clock edge.

The array around it stays RTL: the weight queue, the tile admission
(``weights_ready``), the stall logic and ``busy``
(`mxu.hdl.array.SystolicArray` with ``BuildHooks(datapath_module=...)``). The model keeps the
datapath's contract (`mxu.hdl.array.datapath_signature`) cycle for cycle: a
beat's result leaves exactly `array_latency` enabled cycles after the beat was
taken, computed as the sequential IEEE binary32 dot product of
docs/numerics.md.

Why: with one C call per PE per cycle (the earlier fast PE) Verilator still
evaluated every PE's registers and the skew chains every cycle, about half of
a whole-chip simulation (docs/simulation.md). Here a cycle costs one call, and
a beat rows*cols multiply-adds in a loop. `tests/test_sim_array.py` holds this model to the
RTL array, results and cycles, under random valid/ready; the chip tests do the
same on whole programs.
"""

import functools

__all__ = ["fast_datapath_verilog"]

_TEMPLATE = """\
module {name}(clk, rst, en, take, first, act, seed, weight_take, weight, result, result_valid);
  /*verilator no_inline_module*/
  import "DPI-C" function chandle mxu_array_new(input int rows, input int cols, input int latency,
      input int weight_rows);
  import "DPI-C" function void mxu_array_step(input chandle h, input bit rst, input bit en,
      input bit take, input bit first, input bit [{act_bits}:0] act, input bit [{seed_bits}:0] seed,
      input bit weight_take, input bit [{weight_bits}:0] weight, output bit [{seed_bits}:0] result,
      output bit result_valid);
  input clk, rst, en, take, first, weight_take;
  input [{act_bits}:0] act;
  input [{seed_bits}:0] seed;
  input [{weight_bits}:0] weight;
  output reg [{seed_bits}:0] result = 0;
  output reg result_valid = 1'b0;
  chandle model;
  bit [{seed_bits}:0] next_result;
  bit next_valid;
  initial model = mxu_array_new({rows}, {cols}, {latency}, {weight_rows});
  always @(posedge clk) begin
    mxu_array_step(model, rst, en, take, first, act, seed, weight_take, weight, next_result, next_valid);
    result <= next_result;
    result_valid <= next_valid;
  end
endmodule
"""


@functools.lru_cache(maxsize=None)
def fast_datapath_verilog(rows, cols, stages, weight_rows=1):
    """(module name, Verilog) of the fast datapath of a ``rows x cols`` array with
    `stages` MAC stages and `weight_rows` weight rows a beat."""
    from mxu.hdl.array import array_latency
    name = f"mxu_array_fast_{rows}x{cols}_s{stages}" + (f"_w{weight_rows}" if weight_rows > 1 else "")
    return name, _TEMPLATE.format(name=name, rows=rows, cols=cols,
                                  latency=array_latency(rows, cols, stages),
                                  weight_rows=weight_rows,
                                  act_bits=16 * rows - 1, seed_bits=32 * cols - 1,
                                  weight_bits=16 * cols * weight_rows - 1)
