"""Verilated models compiled with a C++ harness into a shared library and called
through ctypes: the fast path, with no VPI and no Python in the per-cycle loop
(docs/simulation.md)."""

import ctypes
import functools
import subprocess
import sys
from pathlib import Path

from .cache import META, cached_build, source_digest
from .toolchain import setup_environment

__all__ = ["CSRC", "HDL_SOURCES", "generator_digest", "build_native", "load_native",
           "native_library"]

CSRC = Path(__file__).parent / "csrc"
# What generates a simulation model's Verilog: the HDL package and the backend
# modules that turn it into Verilog (docs/cache.md).
HDL_SOURCES = Path(__file__).resolve().parent.parent.parent / "hdl"
_GENERATORS = ("verilog.py", "fast_array.py", "fast_vpu.py", "harness.py", "units.py")

# -O3 in the generated model, no tracing, no assertions: the run path is for speed;
# cocotb builds are the ones that carry debug visibility.
_FLAGS = ("--cc", "--exe", "-O3", "--x-assign", "fast", "--x-initial", "fast",
          "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--prefix", "Vtop",
          "--top-module", "top")


@functools.cache
def generator_digest(hdl=HDL_SOURCES):
    """Digest of every source that shapes a model's Verilog and C++: the `mxu.hdl`
    package (`hdl`), the Verilog-generating backend modules and the C++ sources."""
    here = Path(__file__).parent
    return source_digest(hdl, *(here / g for g in _GENERATORS), CSRC)


def _run(cmd, log, what, cwd=None):
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed; see {log}:\n" + (result.stdout + result.stderr)[-3000:])


def build_native(name, harness, *, key, verilog, extra_flags=(), make_vars=(), extra_cpp=None):
    """``lib<name>.so``: the Verilog from `verilog()` (module ``top``) compiled
    with the C++ file `harness` from ``sim/backends/csrc`` (which may include any
    header there, e.g. ``axi_mem.h``). Cached under `key`
    (a sequence of strings that, with the generator sources, the harness and the
    flags, determines the Verilog); `verilog` is called only to build. Returns
    the library's path. `make_vars` are extra ``make`` variable assignments
    (e.g. ``LDLIBS=-lz``); `extra_cpp`, if given, is called for a generated C++
    source compiled in too (its generator is one of the keyed sources)."""
    setup_environment()
    flags = _FLAGS + tuple(extra_flags)
    library = f"lib{name}.so"

    def build(directory, status):
        status("generating Verilog")
        (directory / "top.v").write_text(verilog())
        log = directory / "build.log"
        obj = directory / "obj"
        sources = [str(directory / "top.v"), str(CSRC / harness)]
        if extra_cpp is not None:
            (directory / "generated.cpp").write_text(extra_cpp())
            sources.append(str(directory / "generated.cpp"))
        status("Verilator: Verilog to C++")
        # The include path is not part of the key: clones at other paths share builds.
        _run(["verilator", *flags, "-Mdir", str(obj), "-CFLAGS", f"-fPIC -O2 -I{CSRC} -I{CSRC / 'lz4'}",
              "-LDFLAGS", "-shared", "-o", str(directory / library), *sources],
             log, f"Verilator on {name}")
        status("compiling C++")
        _run(["make", "-j", "2", "-C", str(obj), "-f", "Vtop.mk", *make_vars], log,
             f"compiling {name}")

    entry = cached_build("native", name, [generator_digest(), harness, *flags, *make_vars, *key],
                         build,
                         artifacts=[library], what=f"{name} (Verilator, native)")
    return entry / library


def load_native(library):
    return ctypes.CDLL(str(library))


def native_library(name, harness, **options):
    """`build_native` then load it: a ctypes library. A library that passed the
    cache's checks but still does not load (another process evicted it in
    between, say) is rebuilt once."""
    library = build_native(name, harness, **options)
    try:
        return load_native(library)
    except OSError as error:
        print(f"mxu: rebuilding {library.parent.name}: it did not load ({error})", file=sys.stderr)
        (library.parent / META).unlink(missing_ok=True)
        return load_native(build_native(name, harness, **options))
