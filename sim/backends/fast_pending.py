"""A simulation-only stand-in for the compute engine's record of pending rows
(`mxu.hdl.compute._PendingRows`, the read-after-write interlock of the
accumulator): one module whose work is a C++ model
(``sim/backends/csrc/fast_pending.h``), called once per clock edge, with the
ports of `mxu.hdl.compute.pending_rows_signature` and the RTL's registers.

Why: the RTL compares the probe's row with every entry in every cycle, and
its one-hot masks come out of Verilator as 127-bit shifts; that was about a
tenth of a fast-MAC chip's simulated cycle (docs/simulation.md). The model
compares only when a probe loads. `tests/test_sim_pending.py` holds it to the
RTL under random traffic, output for output in every cycle; the whole-chip
tests that compare the fast builds with the all-RTL chip hold it there too.
"""

import functools

__all__ = ["fast_pending_verilog"]

_TEMPLATE = """\
module {name}(clk, rst, add__valid, add__payload, add__ready, head, empty, retire, probe,
              probe_load, hit);
  /*verilator no_inline_module*/
  import "DPI-C" function chandle mxu_pending_new(input int depth, input int addr_bits);
  import "DPI-C" function void mxu_pending_step(input chandle h, input bit rst,
      input bit add_valid, input int add_payload, input bit retire, input int probe,
      input bit probe_load, output int head, output bit add_ready, output bit empty,
      output bit hit);
  input clk, rst, add__valid, retire, probe_load;
  input [{entry_msb}:0] add__payload;
  input [{addr_msb}:0] probe;
  output reg [{entry_msb}:0] head = 0;
  output reg add__ready = 1'b1;
  output reg empty = 1'b1;
  output reg hit = 1'b0;
  chandle model;
  int next_head;
  bit next_ready, next_empty, next_hit;
  initial model = mxu_pending_new({depth}, {addr_bits});
  always @(posedge clk) begin
    mxu_pending_step(model, rst, add__valid, 32'(add__payload), retire, 32'(probe), probe_load,
                     next_head, next_ready, next_empty, next_hit);
    head <= next_head[{entry_msb}:0];
    add__ready <= next_ready;
    empty <= next_empty;
    hit <= next_hit;
  end
endmodule
"""


@functools.lru_cache(maxsize=None)
def fast_pending_verilog(depth, addr_bits, entry_bits):
    """(module name, Verilog) of the stand-in for a record of `depth` pending
    rows (a power of two) of `addr_bits`-bit accumulator rows, whose entries
    (`mxu.hdl.compute.pending_entry_layout`) are `entry_bits` wide."""
    if depth < 1 or depth & (depth - 1):
        raise ValueError(f"depth must be a power of two, not {depth}")
    if not 1 <= addr_bits <= 16:
        raise ValueError(f"addr_bits must be 1 to 16 (the model keeps 16-bit rows), "
                         f"not {addr_bits}")
    if not addr_bits < entry_bits <= 32:
        raise ValueError(f"entry_bits must be more than addr_bits and at most 32, not {entry_bits}")
    name = f"mxu_pending_rows_d{depth}_a{addr_bits}_e{entry_bits}"
    return name, _TEMPLATE.format(name=name, depth=depth, addr_bits=addr_bits,
                                  addr_msb=addr_bits - 1, entry_msb=entry_bits - 1)
