"""Run a streaming component (``i``/``o`` stream ports, payloads up to 64 bits) over
a whole array of input payloads in one simulator session, on any simulator.

Verilator: a C++ loop in a shared library (no Python per cycle). Icarus: a
Verilog testbench that reads and writes hex files. Amaranth: its own simulator.
Each raises `RuntimeError` if the design stops making progress (the watchdog).
"""

import ctypes

import numpy as np

from .native import native_library
from .runner import InStream, OutStream, StuckError, run_amaranth, run_icarus
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
        _LOADED[name] = native_library(name, "stream_harness.cpp", key=[name],
                                       verilog=lambda: to_verilog(make_component()))
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


def _ports(make_component, payloads, ready_percent):
    component = make_component()
    iw = len(component.i.payload.as_value())
    ow = len(component.o.payload.as_value())
    return component, (InStream("i", iw, tuple(int(p) for p in payloads)),), \
        (OutStream("o", ow, payloads.size, ready_percent),)


def _run_icarus(make_component, payloads, name, ready_percent, seed):
    component, inputs, outputs = _ports(make_component, payloads, ready_percent)
    try:
        run = run_icarus(name, [name], lambda: to_verilog(component), inputs, outputs, seed=seed,
                         max_cycles=_watchdog(payloads.size, ready_percent))
    except StuckError as e:
        raise _stuck(name, payloads.size, "some") from e
    return np.array(run.outputs["o"], np.uint64), run.cycles


def _run_amaranth(make_component, payloads, name, ready_percent, seed):
    component, inputs, outputs = _ports(make_component, payloads, ready_percent)
    try:
        run = run_amaranth(component, inputs, outputs, seed=seed, name=name,
                           max_cycles=_watchdog(payloads.size, ready_percent))
    except StuckError as e:
        raise _stuck(name, payloads.size, "some") from e
    return np.array(run.outputs["o"], np.uint64), run.cycles
