"""Streams through a design on Icarus or on Amaranth's simulator: the one
implementation behind every unit runner's second and third backend
(docs/simulation.md). The Verilator backend of each runner is a C++ harness of
its own (no Python per cycle); these two drive every port from Python or from a
generated Verilog testbench, so they are written once, for any number of
valid/ready stream ports.

A design has input streams (``<name>__valid``, ``__ready``, ``__payload``) that
are fed their payloads in order, and output streams whose payloads are
collected, under a seeded random ``ready``. The run ends when every output has
its expected count, or at the watchdog.
"""

import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cache import cached_build
from .native import generator_digest

__all__ = ["InStream", "OutStream", "StreamRun", "run_icarus", "run_amaranth"]


@dataclass(frozen=True)
class InStream:
    """An input stream port: `width` payload bits, `payloads` (ints) in order."""
    name: str
    width: int
    payloads: tuple


@dataclass(frozen=True)
class OutStream:
    """An output stream port: `count` payloads expected; ``ready`` is high in
    `ready_percent` % of cycles (seeded)."""
    name: str
    width: int
    count: int
    ready_percent: int = 100


@dataclass
class StreamRun:
    """What a run gives back: the payloads of each output, the cycle (from the
    end of reset) of each stream's first and last handshake, the cycles run and
    the wall time of the simulation proper."""
    outputs: dict
    first: dict = field(default_factory=dict)
    last: dict = field(default_factory=dict)
    cycles: int = 0
    wall_s: float = 0.0


class StuckError(RuntimeError):
    pass


def _stuck(name, outputs, got):
    parts = ", ".join(f"{o.name} {len(got.get(o.name, ()))} of {o.count}" for o in outputs)
    return StuckError(f"watchdog: {name} stopped making progress ({parts} after the cycle limit)")


_TB = """\
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1;
  always #5 clk = ~clk;
  integer cycle = 0, seed, max_cycles, fd, r;
{decls}
  top dut(.clk(clk), .rst(rst){ports});
  initial begin
    if (!$value$plusargs("SEED=%d", seed) || !$value$plusargs("MAXCYC=%d", max_cycles)) begin
      $display("missing plusargs"); $finish;
    end
{loads}
    repeat (2) @(posedge clk);
    #1 rst = 0;
    while (!({done}) && cycle < max_cycles) begin
{drive}
      #3;
{sample}
      @(posedge clk);
      #1;
{advance}
      cycle = cycle + 1;
    end
    fd = $fopen("result.txt", "w");
{report}
    $fdisplay(fd, "cycles %0d", cycle);
    $fclose(fd);
    $finish;
  end
endmodule
"""


def _testbench(inputs, outputs):
    decls, ports, loads, drive, sample, advance, report = [], [], [], [], [], [], []
    for s in inputs:
        n = max(1, len(s.payloads))
        decls += [f"  reg [{s.width - 1}:0] {s.name}_mem [0:{n - 1}];",
                  f"  reg {s.name}_valid = 0; wire {s.name}_ready; reg {s.name}_fire;",
                  f"  integer {s.name}_i = 0, {s.name}_n = {len(s.payloads)}, "
                  f"{s.name}_first = -1, {s.name}_last = -1;"]
        ports.append(f".{s.name}__valid({s.name}_valid), .{s.name}__ready({s.name}_ready), "
                     f".{s.name}__payload({s.name}_mem[{s.name}_i < {s.name}_n ? {s.name}_i : 0])")
        if s.payloads:
            loads.append(f'    $readmemh("{s.name}.hex", {s.name}_mem);')
        drive.append(f"      {s.name}_valid = {s.name}_i < {s.name}_n;")
        sample.append(f"      {s.name}_fire = {s.name}_valid & {s.name}_ready;")
        advance.append(f"      if ({s.name}_fire) begin {s.name}_i = {s.name}_i + 1; "
                       f"if ({s.name}_first < 0) {s.name}_first = cycle; {s.name}_last = cycle; end")
        report.append(f'    $fdisplay(fd, "first {s.name} %0d", {s.name}_first);')
        report.append(f'    $fdisplay(fd, "last {s.name} %0d", {s.name}_last);')
    for s in outputs:
        decls += [f"  reg {s.name}_ready = 0; wire {s.name}_valid; wire [{s.width - 1}:0] {s.name}_payload;",
                  f"  integer {s.name}_got = 0, {s.name}_first = -1, {s.name}_last = -1, {s.name}_fd;"]
        ports.append(f".{s.name}__valid({s.name}_valid), .{s.name}__ready({s.name}_ready), "
                     f".{s.name}__payload({s.name}_payload)")
        loads.append(f'    {s.name}_fd = $fopen("{s.name}.out", "w");')
        ready = "1" if s.ready_percent >= 100 else \
            f"(($random(seed) & 32'h7fffffff) % 100) < {s.ready_percent}"
        drive.append(f"      {s.name}_ready = {ready};")
        sample.append(f"      if ({s.name}_valid & {s.name}_ready) begin "
                      f'$fdisplay({s.name}_fd, "%h", {s.name}_payload); '
                      f"{s.name}_got = {s.name}_got + 1; "
                      f"if ({s.name}_first < 0) {s.name}_first = cycle; {s.name}_last = cycle; end")
        report.append(f"    $fclose({s.name}_fd);")
        report.append(f'    $fdisplay(fd, "first {s.name} %0d", {s.name}_first);')
        report.append(f'    $fdisplay(fd, "last {s.name} %0d", {s.name}_last);')
    done = " && ".join(f"{s.name}_got >= {s.count}" for s in outputs)
    return _TB.format(decls="\n".join(decls), ports="".join(", " + p for p in ports),
                      loads="\n".join(loads), drive="\n".join(drive), sample="\n".join(sample),
                      advance="\n".join(advance), report="\n".join(report), done=done)


def run_icarus(name, key, verilog, inputs, outputs, *, seed=1, max_cycles):
    """Run on Icarus: `verilog()` gives the design (module ``top``), built once
    per (`name`, `key`, stream widths and counts) and cached."""
    tb = _testbench(inputs, outputs)

    def build(directory, status):
        status("generating Verilog")
        (directory / "top.v").write_text(verilog())
        (directory / "tb.v").write_text(tb)
        status("iverilog")
        result = subprocess.run(["iverilog", "-g2012", "-o", str(directory / "sim.vvp"), "-s", "tb",
                                 str(directory / "tb.v"), str(directory / "top.v")],
                                capture_output=True, text=True)
        (directory / "build.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"iverilog failed; see {directory / 'build.log'}:\n"
                               f"{result.stdout}{result.stderr}"[-3000:])

    vvp = cached_build("icarus", name, [generator_digest(), *key, tb], build,
                       artifacts=["sim.vvp"], what=f"{name} (Icarus)") / "sim.vvp"
    with tempfile.TemporaryDirectory(prefix="mxu-icarus-") as work:
        work = Path(work)
        for s in inputs:
            digits = -(-s.width // 4)
            (work / f"{s.name}.hex").write_text("".join(f"{p:0{digits}x}\n" for p in s.payloads))
        start = time.perf_counter()
        result = subprocess.run(["vvp", "-n", str(vvp), f"+SEED={seed}", f"+MAXCYC={max_cycles}"],
                                cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode != 0 or not (work / "result.txt").exists():
            raise RuntimeError(f"vvp failed:\n{result.stdout}{result.stderr}"[-3000:])
        run = StreamRun({o.name: [int(v, 16) for v in (work / f"{o.name}.out").read_text().split()]
                         for o in outputs}, wall_s=wall)
        for line in (work / "result.txt").read_text().splitlines():
            kind, *rest = line.split()
            if kind == "cycles":
                run.cycles = int(rest[0])
            else:
                getattr(run, kind)[rest[0]] = int(rest[1])
    if any(len(run.outputs[o.name]) < o.count for o in outputs):
        raise _stuck(name, outputs, run.outputs)
    return run


def run_amaranth(component, inputs, outputs, *, seed=1, max_cycles, name="design"):
    """Run on Amaranth's simulator, driving every port from a Python testbench."""
    from amaranth.sim import Simulator

    rng = np.random.default_rng(seed)
    run = StreamRun({o.name: [] for o in outputs})
    ports = {s.name: getattr(component, s.name) for s in (*inputs, *outputs)}

    async def testbench(ctx):
        index = {s.name: 0 for s in inputs}
        cycle = 0
        while cycle < max_cycles and any(len(run.outputs[o.name]) < o.count for o in outputs):
            for s in inputs:
                i = index[s.name]
                ctx.set(ports[s.name].valid, i < len(s.payloads))
                ctx.set(ports[s.name].payload.as_value(), s.payloads[i] if i < len(s.payloads) else 0)
            for o in outputs:
                ctx.set(ports[o.name].ready,
                        bool(o.ready_percent >= 100 or rng.integers(100) < o.ready_percent))
            fired = [s for s in inputs if ctx.get(ports[s.name].valid) and ctx.get(ports[s.name].ready)]
            for o in outputs:
                if ctx.get(ports[o.name].valid) and ctx.get(ports[o.name].ready):
                    run.outputs[o.name].append(ctx.get(ports[o.name].payload.as_value()))
                    run.first.setdefault(o.name, cycle)
                    run.last[o.name] = cycle
            await ctx.tick()
            for s in fired:
                index[s.name] += 1
                run.first.setdefault(s.name, cycle)
                run.last[s.name] = cycle
            cycle += 1
        run.cycles = cycle

    sim = Simulator(component)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    start = time.perf_counter()
    sim.run()
    run.wall_s = time.perf_counter() - start
    if any(len(run.outputs[o.name]) < o.count for o in outputs):
        raise _stuck(name, outputs, run.outputs)
    return run
