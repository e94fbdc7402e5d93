"""Verilated models compiled with a C++ harness into a shared library and called
through ctypes: the fast path, with no VPI and no Python in the per-cycle loop
(docs/simulation.md)."""

import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .cache import META, cached_build, source_digest
from .toolchain import CLANG_FLAGS, clang_command, setup_environment

__all__ = ["CSRC", "HDL_SOURCES", "generator_digest", "build_native", "load_native",
           "native_library"]

CSRC = Path(__file__).parent / "csrc"
# What generates a simulation model's Verilog: the HDL package and the backend
# modules that turn it into Verilog (docs/cache.md).
HDL_SOURCES = Path(__file__).resolve().parent.parent.parent / "hdl"
_GENERATORS = ("verilog.py", "fast_array.py", "fast_pending.py", "fast_vpu.py", "harness.py", "units.py",
               "axi_memory.py", "link_model.py")

# -O3 in the generated model, no tracing, no assertions: the run path is for speed;
# cocotb builds are the ones that carry debug visibility.
# -Bsymbolic: the library's calls between its own functions (Verilator's
# per-region functions, the DPI models) bind to them at link time instead of
# going through the PLT; MiniLM ran 2-3 % faster (docs/simulation.md).
_FLAGS = ("--cc", "--exe", "-O3", "--x-assign", "fast", "--x-initial", "fast",
          "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--prefix", "Vtop",
          "--top-module", "top", "-LDFLAGS", "-Wl,-Bsymbolic")
# g++ levels (the variables of verilated.mk): -O2 for the code that runs every
# cycle and for the run-time library, none for the "slow" code that runs once
# (constructors, initial and settle), which is about half of a large model's C++
# and compiles four times faster at -O0.
_OPT_VARS = ("OPT_FAST=-O2", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2")


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


def build_native(name, harness, *, key, verilog, extra_flags=(), make_vars=(), extra_cpp=None,
                 clang=False):
    """``lib<name>.so``: the Verilog from `verilog()` (module ``top``) compiled
    with the C++ file `harness` from ``sim/backends/csrc`` (which may include any
    header there, e.g. ``axi_mem.h``). Cached under `key`
    (a sequence of strings that, with the generator sources, the harness and the
    flags, determines the Verilog); `verilog` is called only to build. Returns
    the library's path. `make_vars` are extra ``make`` variable assignments
    (e.g. ``LDLIBS=-lz``); `extra_cpp`, if given, is called for a generated C++
    source compiled in too (its generator is one of the keyed sources). With
    `clang`, the C++ is compiled by `clang_command` where there is one (the
    fast-MAC chip models: their per-cycle code runs faster, docs/simulation.md)."""
    setup_environment()
    flags = _FLAGS + tuple(extra_flags)
    make_vars = _OPT_VARS + tuple(make_vars)
    cxx = clang_command() if clang else None
    # The key names the compiler by its flags (its version is in the tools'),
    # not by the virtualenv's path in the command: clones share builds.
    compiler = ("clang", *CLANG_FLAGS) if cxx else ()
    build_vars = make_vars + ((f"CXX={cxx}", f"LINK={cxx}") if cxx else ())
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
        _run(["verilator", *flags, "-Mdir", str(obj), "-CFLAGS", f"-fPIC -I{CSRC} -I{CSRC / 'lz4'}",
              "-LDFLAGS", "-shared", "-o", str(directory / library), *sources],
             log, f"Verilator on {name}")
        status("compiling C++")
        _reuse_runtime(obj, build_vars, log)
        _run(["make", "-j", "2", "-C", str(obj), "-f", "Vtop.mk", *build_vars], log,
             f"compiling {name}")

    entry = cached_build("native", name, [generator_digest(), harness, *flags, *make_vars, *compiler,
                                          *key],
                         build,
                         artifacts=[library], what=f"{name} (Verilator, native)")
    return entry / library


def _runtime_objects(obj):
    """The Verilator run-time library's objects that the model in `obj` links
    (``VM_GLOBAL_FAST`` and ``VM_GLOBAL_SLOW`` of its ``Vtop_classes.mk``)."""
    text = (obj / "Vtop_classes.mk").read_text()
    names = []
    for block in re.findall(r"^VM_GLOBAL_(?:FAST|SLOW) \+= \\\n((?:  \S+ \\\n)*)", text, re.M):
        names += [line.split()[0] + ".o" for line in block.splitlines()]
    return names


def _reuse_runtime(obj, make_vars, log):
    """Put the Verilator run-time objects into `obj` before ``make`` runs, from a
    cache entry keyed by their exact compile commands, so that a build compiles
    only its own model and harness: every build links the same ``verilated.o``
    and friends, about 15 CPU seconds of g++ each time otherwise
    (docs/cache.md). ``make`` then finds them newer than their sources."""
    names = _runtime_objects(obj)
    if not names:
        return
    dry = subprocess.run(["make", "-n", "-s", "--no-print-directory", "-C", str(obj), "-f", "Vtop.mk",
                          *make_vars, *names], capture_output=True, text=True)
    commands = [line for line in dry.stdout.splitlines() if line.strip()]
    if dry.returncode != 0 or len(commands) != len(names):
        with open(log, "a") as f:
            f.write(f"(run-time objects compiled in place: make -n gave {dry.stdout}{dry.stderr})\n")
        return

    def build(directory, status):
        jobs = [subprocess.Popen(command, shell=True, cwd=directory, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for command in commands]
        outputs = [job.communicate()[0] for job in jobs]
        (directory / "build.log").write_text("".join(f"$ {c}\n{o}\n" for c, o in zip(commands, outputs)))
        if any(job.returncode for job in jobs):
            raise RuntimeError("compiling the Verilator run-time failed:\n" + "".join(outputs)[-3000:])

    entry = cached_build("native", "verilator_runtime", commands, build, artifacts=names,
                         quiet=True)
    for name in names:
        shutil.copyfile(entry / name, obj / name)
        os.utime(obj / name)


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
