"""Verilated models compiled with a C++ harness into a shared library and called
through ctypes: the fast path, with no VPI and no Python in the per-cycle loop."""

import ctypes
import subprocess
from pathlib import Path

from .build import build_lock, cached_build_dir
from .toolchain import setup_environment

__all__ = ["CSRC", "build_native", "load_native"]

CSRC = Path(__file__).parent / "csrc"

# -O3 in the generated model, no tracing, no assertions: the run path is for speed;
# cocotb builds are the ones that carry debug visibility.
_FLAGS = ("--cc", "--exe", "--build", "-O3", "--x-assign", "fast", "--x-initial", "fast",
          "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--prefix", "Vtop",
          "--top-module", "top")


def build_native(verilog_text, harness, *, name, extra_flags=()):
    """Compile `verilog_text` (module ``top``) with the C++ file `harness` from
    ``sim/csrc`` into ``lib<name>.so``; cached by content. Returns its path."""
    setup_environment()
    harness_src = (CSRC / harness).read_text()
    flags = _FLAGS + tuple(extra_flags)
    build_dir = cached_build_dir("native", name, verilog_text, harness_src, *flags)
    library = build_dir / f"lib{name}.so"
    with build_lock(build_dir):
        if not library.exists():
            (build_dir / "top.v").write_text(verilog_text)
            (build_dir / harness).write_text(harness_src)
            cmd = ["verilator", *flags, "-j", "2", "-Mdir", str(build_dir / "obj"),
                   "-CFLAGS", "-fPIC -O2", "-LDFLAGS", "-shared",
                   "-o", str(library), str(build_dir / "top.v"), str(build_dir / harness)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            (build_dir / "build.log").write_text(result.stdout + result.stderr)
            if result.returncode != 0 or not library.exists():
                raise RuntimeError(f"Verilator build of {name} failed; see {build_dir / 'build.log'}:\n"
                                   + (result.stdout + result.stderr)[-3000:])
    return library


def load_native(library):
    return ctypes.CDLL(str(library))
