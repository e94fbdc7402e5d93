"""cocotb builds (cached) and test runs, on Verilator or Icarus."""

import hashlib
import os
import sys
from pathlib import Path

from .cache import cached_build
from .toolchain import setup_environment

__all__ = ["cocotb_build", "cocotb_test", "cocotb_runtime_key"]


def cocotb_runtime_key(simulator):
    """What a cocotb build links at run time: a Verilator executable links
    ``libcocotbvpi_verilator.so`` of the virtualenv that built it, by path, so
    the path and contents of that library are part of its cache key (a build
    from a deleted virtualenv is then never reused). Icarus loads the VPI
    library at test time, from the current virtualenv."""
    import cocotb_tools.config
    if simulator != "verilator":
        return []
    libs = Path(cocotb_tools.config.libs_dir).resolve()
    vpi = libs / "libcocotbvpi_verilator.so"
    digest = hashlib.sha256(vpi.read_bytes()).hexdigest() if vpi.exists() else "absent"
    return [str(libs), digest, sys.version]


def cocotb_build(verilog_text, toplevel, simulator="verilator", *, name=None, build_args=(),
                 cpp_text=None):
    """Build `verilog_text` for cocotb on `simulator` ("verilator" or "icarus"),
    once per distinct input; returns the build directory. `cpp_text`: C++
    compiled into the model too (DPI functions; Verilator only)."""
    if cpp_text is not None and simulator != "verilator":
        raise ValueError("C++ sources (cpp_text) need the Verilator simulator")
    from cocotb_tools.runner import get_runner

    setup_environment()
    if simulator == "verilator":
        # Amaranth's Verilog is correct by construction but trips width lints.
        # Our testbenches drive and read the top-level ports only, so only the
        # top module is public: the runner's --public-flat-rw on every signal
        # made the 4x4 chip's build take three times as long (docs/cache.md).
        build_args = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "--no-public-flat-rw",
                      "--public-depth", "1", *build_args)

    def build(directory, status):
        status(f"cocotb build on {simulator}")
        source = directory / f"{toplevel}.v"
        source.write_text(verilog_text)
        args = list(build_args)
        if cpp_text is not None:          # the runner takes HDL sources only: C++ goes as an argument
            (directory / "generated.cpp").write_text(cpp_text)
            args.append(str(directory / "generated.cpp"))
        get_runner(simulator).build(sources=[source], hdl_toplevel=toplevel, build_dir=directory,
                                    build_args=args, timescale=("1ns", "1ps"),
                                    log_file=directory / "build.log")

    # A Verilator test runs only the executable; Icarus needs the whole build.
    artifacts = [toplevel] if simulator == "verilator" else ["sim.vvp"]
    key = [verilog_text, cpp_text or "", toplevel, *build_args, *cocotb_runtime_key(simulator)]
    return cached_build(f"cocotb-{simulator}", name or toplevel, key, build, artifacts=artifacts,
                        prune=simulator == "verilator",
                        what=f"{name or toplevel} (cocotb, {simulator})")


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
