"""Verilog generation and cached simulator builds.

A build directory is named by a hash of (generated Verilog, build flags, tool
versions), so a second run of the same configuration does not recompile, and a
file lock makes concurrent pytest workers wait for one build instead of racing.
"""

import contextlib
import fcntl
import os
from pathlib import Path

from amaranth.back import verilog

from .toolchain import cache_root, content_hash, setup_environment, tool_versions

__all__ = ["to_verilog", "lean_verilog", "build_lock", "cached_build_dir", "cocotb_build",
           "cocotb_test"]


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
    """`mxu.sim.build.to_verilog` without all-zero memory initialisers (for
    simulation: Verilator starts memories at zero)."""
    with _no_zero_meminit():
        return to_verilog(component, name)


@contextlib.contextmanager
def build_lock(directory):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_build_dir(kind, name, *keys):
    """``<cache>/<kind>/<name>-<hash of keys and tool versions>``."""
    return cache_root() / kind / f"{name}-{content_hash(tool_versions(), *keys)}"


def cocotb_build(verilog_text, toplevel, simulator="verilator", *, name=None, build_args=()):
    """Build `verilog_text` for cocotb on `simulator` ("verilator" or "icarus"),
    once per distinct input; returns the build directory."""
    from cocotb_tools.runner import get_runner

    setup_environment()
    if simulator == "verilator":
        # Amaranth's Verilog is correct by construction but trips width lints.
        build_args = ("-Wno-fatal", "-Wno-lint", "-Wno-style", *build_args)
    build_dir = cached_build_dir(f"cocotb-{simulator}", name or toplevel, verilog_text,
                                 toplevel, *build_args)
    with build_lock(build_dir):
        done = build_dir / ".built"
        if not done.exists():
            source = build_dir / f"{toplevel}.v"
            source.write_text(verilog_text)
            runner = get_runner(simulator)
            runner.build(sources=[source], hdl_toplevel=toplevel, build_dir=build_dir,
                         build_args=list(build_args), timescale=("1ns", "1ps"),
                         log_file=build_dir / "build.log")
            done.touch()
    return build_dir


def cocotb_test(build_dir, toplevel, test_module, simulator="verilator", *, test_dir,
                testcase=None, extra_env=None, seed=None):
    """Run cocotb `test_module` against a build; raise AssertionError if any test fails."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    setup_environment()
    runner = get_runner(simulator)
    runner.build_dir = Path(build_dir)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH")]))}
    env.update(extra_env or {})
    results = runner.test(test_module=test_module, hdl_toplevel=toplevel, build_dir=build_dir,
                          hdl_toplevel_lang="verilog",
                          test_dir=test_dir, testcase=testcase, extra_env=env, seed=seed,
                          timescale=("1ns", "1ps"))
    tests, failed = get_results(results)
    if tests == 0:
        raise AssertionError(f"cocotb ran no test from {test_module}")
    if failed:
        raise AssertionError(f"{failed} of {tests} cocotb tests in {test_module} failed")
    return tests
