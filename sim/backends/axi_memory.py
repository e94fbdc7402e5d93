"""The external-memory model inside the Verilated chip (native builds only):
a module whose ``always @(posedge clk)`` makes one DPI call,
``mxu_axi_mem_step``, into the harness's `AxiMem` (``sim/backends/csrc/axi_mem.h``),
and holds the slave's outputs in registers until the next edge.

Why: with the memory model in the C++ harness, the chip's AXI slave signals
were inputs of the Verilated model, and everything that depends on them (most
of both DMA engines' next-state logic) ran in Verilator's input region, at
each of the harness's two ``eval()`` calls in a cycle, and again after the edge
(docs/simulation.md, "Where the time goes"). As registers of the model, they
change only at the edge, and that logic runs once.

Same cycles as the harness-side model: at the edge that ends cycle ``n`` the
call sees the master's outputs of cycle ``n`` (what the harness sampled
between its two evaluations), completes that cycle's handshakes (`update`) and
computes the slave's outputs of cycle ``n + 1`` (`drive`), which is the order
the harness called them in. The master's outputs are passed as one vector,
least significant field first: ``wdata``, ``wstrb``, ``awaddr``, ``araddr``,
then `MASTER_FIELDS`; the slave's likewise: ``rdata`` then `SLAVE_FIELDS`.
"""

import functools

__all__ = ["MASTER_FIELDS", "SLAVE_FIELDS", "axi_memory_verilog", "dpi_step_module"]

# (name, width) after the wide fields, least significant first; the C++ side
# (`mxu_axi_mem_step` in chip_harness.cpp) unpacks them in this order.
MASTER_FIELDS = (("awlen", 8), ("awsize", 3), ("awburst", 2), ("awid", 1), ("awvalid", 1),
                 ("wlast", 1), ("wvalid", 1), ("bready", 1), ("arlen", 8), ("arsize", 3),
                 ("arburst", 2), ("arid", 1), ("arvalid", 1), ("rready", 1))
SLAVE_FIELDS = (("rresp", 2), ("rlast", 1), ("rvalid", 1), ("rid", 1), ("bresp", 2),
                ("bvalid", 1), ("bid", 1), ("awready", 1), ("wready", 1), ("arready", 1))

_TEMPLATE = """\
module {name}(clk, {ports});
  /*verilator no_inline_module*/
  import "DPI-C" function chandle mxu_chip_bind();
  import "DPI-C" function void {function}(input chandle chip, {params}
      input bit [{m_msb}:0] m, output bit [{s_msb}:0] s);
  input clk;
{decls}
  chandle chip;
  initial chip = mxu_chip_bind();
  bit [{s_msb}:0] next;
  always @(posedge clk) begin
    {function}(chip, {args}{{{m_cat}}}, next);
    {{{s_cat}}} <= next;
  end
endmodule
"""


def dpi_step_module(name, function, inputs, outputs, constants=()):
    """Verilog of a module that, at every rising edge of ``clk``, passes its
    `inputs` ([(port, width)], least significant first) as one vector to the
    DPI function `function`, after the harness's chip and the integer
    `constants` ([(name, value)]), and holds the vector it returns in its
    `outputs` until the next edge.

    The chip is a handle that ``mxu_chip_bind`` returns once, at the model's
    first evaluation, in the thread that evaluates it: with ``--threads``
    Verilator may make the step call from one of its own threads, where the
    harness's thread-local current chip is not set."""
    decls = [f"  input [{w - 1}:0] {n};" for n, w in inputs]
    decls += [f"  output reg [{w - 1}:0] {n} = 0;" for n, w in outputs]
    return _TEMPLATE.format(
        name=name, function=function, ports=", ".join(n for n, _ in inputs + outputs),
        params="".join(f"input int {n}, " for n, _ in constants).rstrip(),
        args="".join(f"{v}, " for _, v in constants), decls="\n".join(decls),
        m_msb=sum(w for _, w in inputs) - 1, s_msb=sum(w for _, w in outputs) - 1,
        m_cat=", ".join(n for n, _ in reversed(inputs)),
        s_cat=", ".join(n for n, _ in reversed(outputs)))


@functools.lru_cache(maxsize=None)
def axi_memory_verilog(data_bits, addr_bits):
    """(module name, Verilog) of the memory model for an AXI4 bus of
    `data_bits` and `addr_bits` (ID 1 bit), ports named as the chip's."""
    name = f"mxu_axi_memory_d{data_bits}_a{addr_bits}"
    master = [("wdata", data_bits), ("wstrb", data_bits // 8), ("awaddr", addr_bits),
              ("araddr", addr_bits), *MASTER_FIELDS]
    slave = [("rdata", data_bits), *SLAVE_FIELDS]
    return name, dpi_step_module(name, "mxu_axi_mem_step", master, slave,
                                 [("addr_bits", addr_bits)])
