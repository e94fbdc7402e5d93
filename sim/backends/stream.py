"""Run a streaming component (``i``/``o`` stream ports, payloads up to 64 bits) over
a whole array of input payloads in one simulator session, on any simulator.

Verilator: a C++ loop in a shared library (no Python per cycle). Icarus: a
Verilog testbench that reads and writes hex files. Amaranth: its own simulator.
Each raises `RuntimeError` if the design stops making progress (the watchdog).
"""

import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from amaranth.sim import Simulator

from .cache import cached_build
from .native import build_native, generator_digest, load_native
from .toolchain import require_simulator
from .verilog import to_verilog

__all__ = ["run_stream"]

# A healthy streaming unit takes one payload per cycle plus its latency; anything
# slower than this many cycles per payload (plus slack) is treated as a hang.
_WATCHDOG_CYCLES_PER_ITEM = 200
_WATCHDOG_SLACK = 10_000


def _watchdog(n, ready_percent):
    per_item = _WATCHDOG_CYCLES_PER_ITEM * 100 // max(ready_percent, 1)
    return n * per_item + _WATCHDOG_SLACK


def run_stream(make_component, payloads, *, simulator="verilator", name, ready_percent=100, seed=1):
    """Send every uint64 payload through the component that `make_component()`
    returns; return (outputs uint64, cycles).

    `ready_percent` below 100 withholds ``o.ready`` at random (seeded) to exercise
    back-pressure. `name` names the build and must identify the design: a process
    reuses the model it loaded under that name.
    """
    require_simulator(simulator)
    payloads = np.ascontiguousarray(payloads, dtype=np.uint64)
    if not 1 <= ready_percent <= 100:
        raise ValueError(f"ready_percent must be in 1..100, not {ready_percent!r}")
    runner = {"verilator": _run_verilator, "icarus": _run_icarus, "amaranth": _run_amaranth}
    return runner[simulator](make_component, payloads, name, ready_percent, seed)


def _stuck(name, n, done):
    return RuntimeError(f"watchdog: {name} stopped making progress "
                        f"({done} of {n} results after the cycle limit)")


# Loaded libraries by design name: generating Verilog costs about a second, so a
# process generates it once per design.
_LOADED = {}


def _run_verilator(make_component, payloads, name, ready_percent, seed):
    if name not in _LOADED:
        _LOADED[name] = load_native(build_native(
            name, "stream_harness.cpp", key=[name], verilog=lambda: to_verilog(make_component())))
    lib = _LOADED[name]
    run = lib.mxu_stream_run
    run.restype = ctypes.c_int64
    run.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                    ctypes.c_uint64, ctypes.c_uint64]
    n = payloads.size
    out = np.zeros(n, np.uint64)
    cycles = run(n, payloads.ctypes.data, out.ctypes.data, ready_percent, seed,
                 _watchdog(n, ready_percent))
    if cycles < 0:
        raise _stuck(name, n, "some")
    return out, int(cycles)


_ICARUS_TB = """\
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1;
  always #5 clk = ~clk;
  reg [{iw}-1:0] i_payload = 0;
  reg i_valid = 0, o_ready = 0;
  wire i_ready, o_valid;
  wire [{ow}-1:0] o_payload;
  top dut(.clk(clk), .rst(rst), .i__payload(i_payload), .i__valid(i_valid),
          .i__ready(i_ready), .o__payload(o_payload), .o__valid(o_valid), .o__ready(o_ready));
  reg [8*1024-1:0] infile, outfile;
  reg [63:0] next_in;
  integer fin, fout, n, pct, seed, max_cycles, sent, received, cycles, r;
  reg take_in;
  initial begin
    if (!$value$plusargs("N=%d", n) || !$value$plusargs("IN=%s", infile) ||
        !$value$plusargs("OUT=%s", outfile) || !$value$plusargs("PCT=%d", pct) ||
        !$value$plusargs("SEED=%d", seed) || !$value$plusargs("MAXCYC=%d", max_cycles)) begin
      $display("missing plusargs"); $finish;
    end
    fin = $fopen(infile, "r");
    fout = $fopen(outfile, "w");
    sent = 0; received = 0; cycles = 0;
    if (n > 0) r = $fscanf(fin, "%h\\n", next_in);
    repeat (2) @(posedge clk);
    #1 rst = 0;
    while (received < n && cycles < max_cycles) begin
      i_valid = sent < n;
      i_payload = next_in;
      o_ready = (pct >= 100) || (($random(seed) & 32'h7fffffff) % 100 < pct);
      #3;
      take_in = i_valid & i_ready;
      if (o_valid & o_ready) begin
        $fdisplay(fout, "%h", o_payload);
        received = received + 1;
      end
      @(posedge clk);
      #1;
      cycles = cycles + 1;
      if (take_in) begin
        sent = sent + 1;
        if (sent < n) r = $fscanf(fin, "%h\\n", next_in);
      end
    end
    $fdisplay(fout, "cycles %0d", cycles);
    $fclose(fout);
    $finish;
  end
endmodule
"""


def _run_icarus(make_component, payloads, name, ready_percent, seed):
    component = make_component()
    iw = len(component.i.payload.as_value())
    ow = len(component.o.payload.as_value())
    tb = _ICARUS_TB.format(iw=iw, ow=ow)

    def build(directory, status):
        status("generating Verilog")
        (directory / "top.v").write_text(to_verilog(component))
        (directory / "tb.v").write_text(tb)
        status("iverilog")
        result = subprocess.run(["iverilog", "-g2012", "-o", str(directory / "sim.vvp"), "-s", "tb",
                                 str(directory / "tb.v"), str(directory / "top.v")],
                                capture_output=True, text=True)
        (directory / "build.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"iverilog failed:\n{result.stdout}{result.stderr}"[-3000:])

    vvp = cached_build("icarus-stream", name, [generator_digest(), name, tb], build,
                       artifacts=["sim.vvp"], what=f"{name} (Icarus)") / "sim.vvp"
    n = payloads.size
    with tempfile.TemporaryDirectory(prefix="mxu-icarus-") as tmp:
        infile, outfile = Path(tmp) / "in.hex", Path(tmp) / "out.hex"
        infile.write_text("".join(f"{int(p):016x}\n" for p in payloads))
        subprocess.run(["vvp", "-n", str(vvp), f"+N={n}", f"+IN={infile}", f"+OUT={outfile}",
                        f"+PCT={ready_percent}", f"+SEED={seed}",
                        f"+MAXCYC={_watchdog(n, ready_percent)}"],
                       check=True, capture_output=True, text=True)
        lines = outfile.read_text().split()
    cycles = int(lines[-1])
    values = lines[:-2]
    if len(values) != n:
        raise _stuck(name, n, len(values))
    return np.array([int(v, 16) for v in values], np.uint64), cycles


def _run_amaranth(make_component, payloads, name, ready_percent, seed):
    component = make_component()
    rng = np.random.default_rng(seed)
    n = payloads.size
    out = np.zeros(n, np.uint64)
    state = {"cycles": 0, "received": 0}
    limit = _watchdog(n, ready_percent)

    async def testbench(ctx):
        sent = received = cycles = 0
        i, o = component.i, component.o
        while received < n and cycles < limit:
            ctx.set(i.valid, sent < n)
            ctx.set(i.payload.as_value(), int(payloads[sent]) if sent < n else 0)
            ctx.set(o.ready, ready_percent >= 100 or rng.integers(100) < ready_percent)
            take_in = ctx.get(i.valid) and ctx.get(i.ready)
            if ctx.get(o.valid) and ctx.get(o.ready):
                out[received] = ctx.get(o.payload.as_value())
                received += 1
            await ctx.tick()
            cycles += 1
            sent += bool(take_in)
        state.update(cycles=cycles, received=received)

    sim = Simulator(component)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    if state["received"] != n:
        raise _stuck(name, n, state["received"])
    return out, state["cycles"]
