"""`SimulatedChip`: one simulated mxu chip and its external memory
(docs/simulation.md, docs/driver.md).

The chip and its external memory run inside one Verilated shared library; Python
writes bytes straight into the model's memory, writes the registers, lets C++
clock the chip until ``irq``, and reads results back. No Python runs per cycle.
This layer knows registers, memory and programs as bytes; it knows no compiler
and no tensors (the runtime's `mxu.sim.Chip` wraps it).

Recovery contract (docs/driver.md): after anything that can leave the chip in
an unknown state -- the watchdog, an error code, an AXI protocol violation, an
exception or Ctrl-C during a run -- the driver hard-resets the chip (and drops
the memory model's transactions in flight) before it returns or raises, so the
next call starts from a known state; every error message says so.

>>> chip = SimulatedChip(ChipConfig(rows=8, cols=8))
>>> result = chip.run(program_bytes)
>>> result.counters["cycles"]
"""

import ctypes
import functools
import numbers
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mxu.hdl.config import ChipConfig
from mxu.hdl.isa import INSTR_BYTES, ErrorCode
from mxu.hdl.regs import BUS_USERS, CHIP_ID, COUNTERS, REG

from ..backends.fast_vpu import vpu_cpp_source
from ..backends.native import native_library
from ..backends.toolchain import require_simulator
from ..backends.verilog import chip_verilog
from .trace import decode_trace, trace_mask

__all__ = ["SimulatedChip", "RunResult", "ChipError", "AXI_CHANNELS", "WAVE_WARN_BYTES", "MAX_THREADS",
           "check_flag", "check_integer", "build_model"]

AXI_CHANNELS = ("aw", "w", "b", "ar", "r")
WAVE_WARN_BYTES = 1 << 30
MAX_THREADS = 8
_MAX_LATENCY = 1 << 16
_SLICE_SECONDS = 0.1        # wall time of one C++ slice: Ctrl-C acts within about this

_U64, _U32, _PTR = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p
_SIGNATURES = {
    "mxu_chip_new": (_PTR, [_U64, _U32]),
    "mxu_chip_free": (None, [_PTR]),
    "mxu_chip_reset": (None, [_PTR]),
    "mxu_chip_mem": (ctypes.POINTER(ctypes.c_uint8), [_PTR]),
    "mxu_chip_mem_params": (None, [_PTR, _U32, _U32, ctypes.POINTER(_U32), _U64]),
    "mxu_chip_add_error": (None, [_PTR, _U64, _U64, _U32]),
    "mxu_chip_clear_errors": (None, [_PTR]),
    "mxu_chip_skip_quiet_memory": (None, [_PTR, ctypes.c_int]),
    "mxu_chip_reg_write": (ctypes.c_int, [_PTR, _U32, _U32, ctypes.POINTER(_U32)]),
    "mxu_chip_reg_read": (ctypes.c_int, [_PTR, _U32, ctypes.POINTER(_U32), ctypes.POINTER(_U32)]),
    "mxu_chip_run_for": (_U64, [_PTR, _U64]),
    "mxu_chip_irq": (ctypes.c_int, [_PTR]),
    "mxu_chip_cycles": (_U64, [_PTR]),
    "mxu_chip_violations": (ctypes.c_char_p, [_PTR, ctypes.POINTER(_U64)]),
    "mxu_chip_clear_violations": (None, [_PTR]),
    "mxu_chip_mem_busy": (_U64, [_PTR]),
    "mxu_chip_trace": (ctypes.c_int, [_PTR, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]),
    "mxu_chip_trace_window": (None, [_PTR, _U64, _U64]),
    "mxu_chip_trace_flush": (None, [_PTR]),
    "mxu_chip_trace_begin": (ctypes.c_int, [_PTR, ctypes.POINTER(_U32), _U32, _U32, _U32]),
    "mxu_chip_trace_events": (_U64, [_PTR, ctypes.POINTER(ctypes.POINTER(_U32))]),
    "mxu_chip_trace_buckets": (_U64, [_PTR, ctypes.POINTER(ctypes.POINTER(_U32))]),
    "mxu_chip_trace_truncated": (ctypes.c_int, [_PTR]),
    "mxu_chip_clock": (None, [_PTR, _U64]),
    "mxu_chip_link_setup": (None, [_PTR, ctypes.c_int, _U32, _U32]),
    "mxu_chip_link_pending": (None, [_PTR, ctypes.c_int, ctypes.POINTER(_U64),
                                     ctypes.POINTER(_U64)]),
    "mxu_chip_link_take": (None, [_PTR, ctypes.c_int, _PTR, _PTR, _PTR]),
    "mxu_chip_link_give": (None, [_PTR, ctypes.c_int, _U64, _PTR, _PTR, _U64, _PTR]),
    "mxu_chip_link_arriving": (_U64, [_PTR, ctypes.c_int]),
}

RESET_NOTE = "the chip has been reset and is ready for the next run"
# Cycles a soft reset may take to drain the bus (docs/driver.md): the longest
# bursts in flight under the slowest memory timing the model allows.
SOFT_RESET_CYCLES = 2_000_000
# The AXI channels of each bus user (STATUS bits 10:8, `BUS_USERS` order).
_BUS_CHANNELS = {"fetch": "the instruction fetch's read bursts (AR/R, ID 1)",
                 "load_dma": "the load DMA's read bursts (AR/R, ID 0)",
                 "store_dma": "the store DMA's write bursts (AW/W/B)"}
CLOSED_NOTE = ("this chip has been closed (close()): its simulator and external memory are "
               "freed, and its tensors with them; make a new chip")


class ChipError(RuntimeError):
    """The chip stopped with an error code, the watchdog ended a stuck run, or the
    chip broke the AXI protocol. `result` holds the `RunResult` where there is
    one. The driver has reset the chip before raising (docs/driver.md)."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


@dataclass
class RunResult:
    """What one `SimulatedChip.run` left behind.

    ``memory`` is a view of the external memory as it is *now* (a later run
    changes it; copy what you keep). It keeps the simulated chip alive, so it
    stays valid after the chip object is gone.
    """
    error: ErrorCode
    error_pc: int
    counters: dict
    memory: np.ndarray = field(repr=False)
    wall_s: float = 0.0
    trace: object = field(default=None, repr=False)    # a `ChipTraceData` when traced

    @property
    def ok(self):
        return self.error is ErrorCode.NONE


_TRACE_FLAGS = {
    None: (),
    "vcd": ("--trace", "--trace-structs"),
    # FST: zlib from the OS; LZ4 from our stand-in header (csrc/lz4/lz4.h, on
    # every native build's include path).
    "fst": ("--trace-fst", "--trace-structs"),
}
_TRACE_MAKE = {"fst": ("LDLIBS=-lz",)}


def _wave_format(waves):
    """"vcd" or "fst" for a waveform path, after checking that it can be written."""
    if waves is None:
        return None
    path = Path(waves)
    suffix = path.suffix.lower()
    if suffix not in (".vcd", ".fst"):
        raise ValueError(f"waves must name a .vcd or .fst file, not {str(waves)!r}")
    if suffix == ".fst" and not Path("/usr/include/zlib.h").exists():
        raise ValueError("FST waveforms need zlib's development headers from the OS "
                         "(apt-get install zlib1g-dev); name a .vcd file instead")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ValueError(f"cannot write the waveform {str(waves)!r}: "
                         f"directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"cannot write the waveform {str(waves)!r}: permission denied")
    return suffix[1:]


@functools.lru_cache(maxsize=4)
def _library(config, waves=None, fast_mac=False, trace=False, units=False, threads=1,
             idle_gating=True):
    # Waveforms, the profiler's trace, the per-unit profile, each thread count
    # and the ungated model need builds of their own, so that the plain model
    # pays nothing for them.
    # clang compiles the fast-MAC models, whose runs it speeds up by a sixth;
    # g++ the all-RTL ones, which it compiles in half the time (and runs 10 %
    # slower: docs/simulation.md, "Toolchain").
    name = f"chip{config.rows}x{config.cols}" + ("_fastmac" if fast_mac else "") + \
        (f"_{waves}" if waves else "") + ("_trace" if trace else "") + \
        ("_units" if units else "") + (f"_t{threads}" if threads > 1 else "") + \
        ("" if idle_gating else "_ungated")
    # One evaluation a cycle (docs/simulation.md) for the gated fast models;
    # waveform and trace builds keep two, whose samples fall between them.
    one_eval = fast_mac and idle_gating and waves is None and not trace
    threaded = ("--threads", str(threads), "-CFLAGS", f"-DMXU_THREADS={threads}")
    flags = _TRACE_FLAGS[waves] + (("-CFLAGS", "-DMXU_TRACE") if trace else ()) + \
        (threaded if threads > 1 else ()) + \
        (("-CFLAGS", "-DMXU_ONE_EVAL") if one_eval else ()) + \
        (("-CFLAGS", "-DMXU_VECTOR_GATE") if one_eval and config.vpu else ())
    lib = native_library(name, "chip_harness.cpp", key=[repr(config)], extra_flags=flags,
                         make_vars=_TRACE_MAKE.get(waves, ()),
                         verilog=lambda: chip_verilog(config, fast_mac, trace, units=units, memory=True,
                                                      idle_gating=idle_gating, one_eval=one_eval),
                         extra_cpp=vpu_cpp_source if config.vpu and fast_mac else None,
                         clang=fast_mac and waves is None)
    for fn_name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, fn_name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def build_model(config, fast_mac=False):
    """Build, or find in ~/.cache/mxu, the Verilated model that
    ``SimulatedChip(config, fast_mac=fast_mac)`` loads, without making a chip
    (which would allocate its whole external memory): a pod builds it in the
    process that shows the progress, before its actors load it."""
    # The arguments SimulatedChip.__init__ passes for these settings (and so
    # the same build): only a fast-MAC model gates idle units.
    _library(config, None, fast_mac, False, False, 1, fast_mac)


class _NativeChip:
    """Owns one native chip instance; frees it when nothing refers to it any
    more. Memory views refer to it, so they never outlive the memory."""

    def __init__(self, lib, config):
        self.lib = lib
        self.handle = lib.mxu_chip_new(config.ext_mem_bytes, config.axi_data_bytes)
        if not self.handle:
            raise MemoryError(f"could not allocate a simulated chip with "
                              f"{config.ext_mem_bytes} bytes of external memory")

    def memory(self, nbytes):
        pointer = ctypes.cast(self.lib.mxu_chip_mem(self.handle), ctypes.c_void_p).value
        buffer = (ctypes.c_uint8 * nbytes).from_address(pointer)
        buffer._owner = self
        return np.frombuffer(buffer, np.uint8)

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self.lib.mxu_chip_free(handle)


def check_flag(value, name):
    """`value` as a bool, checked: True, False or a NumPy bool, nothing else."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def check_integer(value, name, low=None, high=None):
    """`value` as an int, checked: NumPy integers are accepted, bools and
    floats are not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {span}, not {value}")
    return value


def _as_bytes(data, name):
    """Raw bytes of `data`: bytes-like or a NumPy array (its bytes in memory order)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(data), np.uint8)
    raise TypeError(f"{name} must be bytes or a NumPy array, not {type(data).__name__}")


class SimulatedChip:
    """One simulated mxu chip with its external memory.

    Parameters
    ----------
    config : ChipConfig or None
        Sizes; the default 16x16 chip if None.
    simulator : str
        "verilator" (the only whole-chip backend; cocotb testbenches in
        the verification package run the same RTL on other simulators).
    mem_latency : (int, int)
        Random latency range, in cycles, of the external memory's responses.
    mem_pause : dict or None
        Percent (0..99) of cycles each AXI channel ("aw", "w", "b", "ar", "r") stalls.
    seed : int
        Seed of the memory model's randomness.
    waves : str or None
        Record a waveform of every run into this .vcd or .fst file (FST needs
        zlib's headers from the OS), from a separately built traced model.
    waves_from, waves_cycles : int
        The window of each run to record: from cycle `waves_from` of the run,
        `waves_cycles` cycles (None: to the end).
    waves_scope : str
        Record only the signals under this hierarchy ("TOP" is the whole chip;
        e.g. "TOP.top.chip.core.compute" for the compute engine).
    waves_depth : int or None
        Hierarchy levels to record below `waves_scope` (None: all). A warning is
        printed when the file is projected to exceed 1 GiB.
    fast_mac : bool
        Simulate the array's PE grid as one C++ model of the same IEEE
        arithmetic and the same cycles instead of its gate-level fp32 datapath
        (`mxu.sim.backends.fast_array`): tens of times faster, identical results
        and cycle counts; with the vector unit, each vector lane's element op
        likewise (`mxu.sim.backends.fast_vpu`). Everything else, the array's
        weight queue and tile admission included, is still the RTL. Default
        False: the whole chip is RTL.
    trace : bool
        Build the chip with its trace port and record, in every run, what each
        engine started and completed and when (`RunResult.trace`, a
        `ChipTraceData`; docs/profiler.md).
    profile_units : bool
        Build the chip with each unit of its core a C++ class of its own, so
        that a sampling profiler (``perf``) names the unit each simulated
        cycle's time goes to (``bench/simprofile.py``, docs/simulation.md).
        Same bits and cycles; the model runs slower.
    threads : int
        Threads Verilator evaluates the model with, 1 (the default) to
        `MAX_THREADS` (a build of its own per count). Same bits and cycles.
        On the 2-core machine more than one thread is slower for every chip
        measured, the all-RTL 16x16 chip included: the work of a cycle is too
        small to split, and every clock edge waits for the slowest thread
        (docs/simulation.md, "Threads").
    idle_gating : bool
        With the fast MAC: gate the clocks of the vector unit and of the
        store engine with its DMA in the cycles where they are idle and
        offered nothing, so that Verilator skips their logic there (the
        default). Same bits and cycles; False builds the model that
        evaluates them every cycle, to check that (docs/simulation.md,
        "Idle gating").
    """

    _native = None      # the `_NativeChip`; None once closed (or before it is made)

    def __init__(self, config=None, simulator="verilator", *, mem_latency=(0, 0), mem_pause=None,
                 seed=1, waves=None, waves_from=0, waves_cycles=None, waves_depth=None,
                 waves_scope="TOP", fast_mac=False, trace=False, trace_bucket=256,
                 profile_units=False, threads=1, idle_gating=True):
        if config is not None and not isinstance(config, ChipConfig):
            raise TypeError(f"config must be a ChipConfig, not {type(config).__name__}")
        self.config = config or ChipConfig()
        require_simulator(simulator)
        if simulator != "verilator":
            raise ValueError(f"Chip runs on Verilator only (the cocotb testbenches cover "
                             f"{simulator!r}); got simulator={simulator!r}")
        check_flag(fast_mac, "fast_mac")
        timing = self._check_timing(mem_latency, mem_pause, seed)
        wave_format = _wave_format(waves)
        self._window = (check_integer(waves_from, "waves_from", 0),
                        None if waves_cycles is None else check_integer(waves_cycles, "waves_cycles", 1))
        levels = 0 if waves_depth is None else check_integer(waves_depth, "waves_depth", 1, 99)
        if not isinstance(waves_scope, str) or not waves_scope:
            raise TypeError(f"waves_scope must be a hierarchy name such as 'TOP', not {waves_scope!r}")
        if waves_scope != "TOP" and waves_depth is None:
            levels = 99
        self.simulator = simulator
        self.fast_mac = bool(fast_mac)
        self.waves = None if waves is None else str(waves)
        self.trace = bool(check_flag(trace, "trace"))
        self.trace_bucket = check_integer(trace_bucket, "trace_bucket", 1)
        self.profile_units = bool(check_flag(profile_units, "profile_units"))
        self.threads = check_integer(threads, "threads", 1, MAX_THREADS)
        # Only the fast builds gate: an RTL chip's model is the same either way.
        self.idle_gating = bool(check_flag(idle_gating, "idle_gating")) and self.fast_mac
        self._lib = _library(self.config, wave_format, self.fast_mac, self.trace, self.profile_units,
                             self.threads, self.idle_gating)
        self._native = _NativeChip(self._lib, self.config)
        if waves is not None:
            code = self._lib.mxu_chip_trace(self._handle, str(waves).encode(), levels,
                                            waves_scope.encode())
            if code != 0:
                raise ValueError(f"cannot write the waveform {str(waves)!r}")
        self._memory = self._native.memory(self.config.ext_mem_bytes)
        self._needs_reset = False
        self._warned_waves = False
        self._set_timing(*timing)
        if self.read_reg("ID") != CHIP_ID:
            raise ChipError("the simulated chip does not answer with the mxu ID")

    # ---- lifetime ---------------------------------------------------------------------
    @property
    def closed(self):
        return self._native is None

    @property
    def _handle(self):
        if self._native is None:
            raise ChipError(CLOSED_NOTE)
        return self._native.handle

    @property
    def memory(self):
        """The external memory as a uint8 view (ChipError once closed)."""
        if self._native is None:
            raise ChipError(CLOSED_NOTE)
        return self._memory

    def close(self):
        """Free the simulated chip and its external memory now, rather than
        when the garbage collector gets to them; every later call raises
        `ChipError`. Idempotent. (A `RunResult.memory` view still held keeps
        the memory until it goes.)"""
        self._native, self._memory = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- external memory ---------------------------------------------------------
    @staticmethod
    def _check_timing(latency, pause, seed):
        if not isinstance(latency, (tuple, list)) or len(latency) != 2:
            raise TypeError(f"mem_latency must be a pair (min, max) of cycles, not {latency!r}")
        lo = check_integer(latency[0], "mem_latency[0]", 0, _MAX_LATENCY)
        hi = check_integer(latency[1], "mem_latency[1]", lo, _MAX_LATENCY)
        pause = {} if pause is None else pause
        if not isinstance(pause, dict):
            raise TypeError(f"mem_pause must be a dict of channel: percent, not {pause!r}")
        unknown = set(pause) - set(AXI_CHANNELS)
        if unknown:
            raise ValueError(f"mem_pause has unknown AXI channels {sorted(unknown)}; "
                             f"use {AXI_CHANNELS}")
        pcts = [check_integer(pause.get(ch, 0), f"mem_pause[{ch!r}]", 0, 99) for ch in AXI_CHANNELS]
        return lo, hi, pcts, check_integer(seed, "seed", 0, (1 << 64) - 1)

    def _set_timing(self, lo, hi, pcts, seed):
        self._lib.mxu_chip_mem_params(self._handle, lo, hi, (_U32 * 5)(*pcts), seed)

    def set_memory_timing(self, latency=(0, 0), pause=None, seed=1):
        """Latency range (cycles) and per-channel pause percentages (0..99) of the
        external memory model."""
        self._set_timing(*self._check_timing(latency, pause, seed))

    def inject_error(self, lo, hi, resp="slverr"):
        """Make every access to external bytes [lo, hi) answer SLVERR or DECERR."""
        if resp not in ("slverr", "decerr"):
            raise ValueError(f"resp must be 'slverr' or 'decerr', not {resp!r}")
        lo = check_integer(lo, "lo", 0)
        hi = check_integer(hi, "hi", lo)
        self._lib.mxu_chip_add_error(self._handle, lo, hi, {"slverr": 2, "decerr": 3}[resp])

    def clear_errors(self):
        """Remove every injected error range."""
        self._lib.mxu_chip_clear_errors(self._handle)

    def write_memory(self, addr, data, name="data"):
        """Copy bytes (or a NumPy array's bytes) to external address `addr`."""
        addr = check_integer(addr, "addr", 0)
        data = _as_bytes(data, name)
        if addr + data.size > self.memory.size:
            raise ValueError(f"{name}: {data.size} bytes at 0x{addr:x} do not fit in the "
                             f"{self.memory.size}-byte external memory")
        self.memory[addr:addr + data.size] = data

    def read_memory(self, addr, nbytes):
        """A copy of `nbytes` external bytes from `addr`."""
        addr, nbytes = check_integer(addr, "addr", 0), check_integer(nbytes, "nbytes", 0)
        if addr + nbytes > self.memory.size:
            raise ValueError(f"{nbytes} bytes at 0x{addr:x} lie beyond the "
                             f"{self.memory.size}-byte external memory")
        return self.memory[addr:addr + nbytes].copy()

    # ---- registers -----------------------------------------------------------------
    def write_reg(self, name, value):
        if name not in REG:
            raise ValueError(f"unknown register {name!r}; registers are {sorted(REG)}")
        resp = _U32()
        if self._lib.mxu_chip_reg_write(self._handle, REG[name], int(value) & 0xFFFFFFFF,
                                        ctypes.byref(resp)) != 0:
            self.reset()
            raise ChipError(f"register write to {name} timed out; {RESET_NOTE}")
        return resp.value

    def read_reg(self, name, offset=0):
        if name not in REG:
            raise ValueError(f"unknown register {name!r}; registers are {sorted(REG)}")
        data, resp = _U32(), _U32()
        if self._lib.mxu_chip_reg_read(self._handle, REG[name] + offset, ctypes.byref(data),
                                       ctypes.byref(resp)) != 0:
            self.reset()
            raise ChipError(f"register read of {name} timed out; {RESET_NOTE}")
        return data.value

    def counters(self):
        out = {}
        for i, name in enumerate(COUNTERS):
            lo = self.read_reg("COUNTERS", 8 * i)
            hi = self.read_reg("COUNTERS", 8 * i + 4)
            out[name] = lo | hi << 32
        return out

    def soft_reset(self, max_cycles=SOFT_RESET_CYCLES):
        """The register file's soft reset (CTRL bit 1): everything but the
        registers and the memories' contents, once the bursts in flight
        have completed (the chip drains the bus first: docs/driver.md).
        Waits until STATUS no longer shows ``resetting``; after `max_cycles`
        the chip is hard-reset and `ChipError` names the bursts that did not
        complete. `reset` is the stronger one."""
        max_cycles = check_integer(max_cycles, "max_cycles", 1)
        self.write_reg("CTRL", 0b10)
        waited, step = 0, 16
        while True:
            status = self.read_reg("STATUS")
            if not status & 0b100:
                return
            if waited >= max_cycles:
                break
            step = min(step * 2, 65_536, max_cycles - waited)
            self._lib.mxu_chip_clock(self._handle, step)
            waited += step
        stuck = [_BUS_CHANNELS[u] for i, u in enumerate(BUS_USERS) if status >> (8 + i) & 1]
        self.reset()
        raise ChipError(f"soft reset: the bus did not drain within {max_cycles} cycles: "
                        f"{', '.join(stuck) or 'no bursts (yet still resetting)'} did not "
                        f"complete (STATUS=0x{status:x}); {RESET_NOTE}")

    def reset(self):
        """Hard reset: the whole chip, and the memory model's transactions in
        flight. Memory contents, timing and injected errors stay."""
        self._lib.mxu_chip_reset(self._handle)
        self._lib.mxu_chip_clear_violations(self._handle)
        self._needs_reset = False

    @property
    def busy(self):
        return bool(self.read_reg("STATUS") & 1)

    @property
    def memory_busy(self):
        """The memory model holds a transaction in flight (read without clocking)."""
        return bool(self._lib.mxu_chip_mem_busy(self._handle))

    # ---- running ---------------------------------------------------------------------
    def _program_bytes(self, program):
        code = program.to_bytes() if hasattr(program, "to_bytes") else program
        if not isinstance(code, (bytes, bytearray, memoryview)):
            raise TypeError(f"program must be a Program or bytes, not {type(program).__name__}")
        code = bytes(code)
        if not code or len(code) % INSTR_BYTES:
            raise ValueError(f"program is {len(code)} bytes, not a whole, non-zero number of "
                             f"{INSTR_BYTES}-byte instructions")
        return code

    def _place(self, code, base):
        # A misaligned base is the hardware's to report (FETCH_ERROR); one that
        # does not fit cannot even be written.
        if base is None:
            base = (self.memory.size - len(code)) & ~0xFFFF
        base = check_integer(base, "base", 0)
        if base + len(code) > self.memory.size:
            raise ValueError(f"a {len(code)}-byte program at base 0x{base:x} does not fit in the "
                             f"{self.memory.size}-byte external memory")
        return base

    def run(self, program, memory_image=None, *, base=None, max_cycles=None,
            expected_cycles=None):
        """Run `program` (a `Program` or bytes) to its end.

        `memory_image` is None, or a dict {address: bytes or ndarray} written to
        external memory first. The program goes at `base` (default: the top
        64 KiB-aligned region that holds it). Returns a `RunResult`, whose
        ``error`` may be a chip error code (the chip halted cleanly and has been
        reset). Raises `ChipError` when the watchdog (`max_cycles`, default
        50 M cycles plus 100 per instruction) expires or the chip breaks the
        AXI protocol, and re-raises Ctrl-C; the chip is reset in every case.
        `expected_cycles` (optional) lets the waveform size warning project.
        """
        limit, start = self._begin(program, memory_image, base, max_cycles)
        try:
            cycles = self._clock(limit, expected_cycles)
            wall = time.perf_counter() - start
        except BaseException:
            self.reset()
            raise
        return self._finish(cycles, limit, wall)

    def _begin(self, program, memory_image, base, max_cycles):
        """Check and place the program and the image, and start the chip;
        returns (watchdog limit in cycles, wall time of the start)."""
        code = self._program_bytes(program)
        base = self._place(code, base)
        image = {}
        for addr, data in (memory_image or {}).items():
            key = f"memory_image[{addr!r}]"
            image[check_integer(addr, f"memory_image key {addr!r}", 0)] = _as_bytes(data, key)
        for addr, data in image.items():
            if addr < base + len(code) and base < addr + data.size:
                raise ValueError(f"memory_image[0x{addr:x}] ({data.size} bytes) overlaps the "
                                 f"program at 0x{base:x} ({len(code)} bytes); give another base")
        limit = 50_000_000 + 100 * len(code) if max_cycles is None else \
            check_integer(max_cycles, "max_cycles", 1)
        for addr, data in image.items():
            self.write_memory(addr, data, f"memory_image[0x{addr:x}]")
        if self._needs_reset or self.busy:
            self.reset()
        self.write_memory(base, code, "program")
        try:
            self._needs_reset = True
            self.write_reg("PROG_BASE", base)
            self.write_reg("PROG_LEN", len(code) // INSTR_BYTES)
            start = time.perf_counter()
            self._open_window()
            if self.trace:
                self._trace_begin()
            self.write_reg("CTRL", 1)
        except BaseException:
            self.reset()
            raise
        return limit, start

    # ---- lockstep windows (a pod's chips, docs/pod.md) --------------------------------
    def start(self, program, memory_image=None, *, base=None):
        """Start `program` as `run` does, without clocking it: a pod then
        advances its chips with `clock` and carries their link traffic, and
        ends the run with `finish`."""
        self._pod_limit, self._pod_start = self._begin(program, memory_image, base, None)

    @property
    def cycle(self):
        """Cycles clocked since the model was built (register accesses included)."""
        return self._lib.mxu_chip_cycles(self._handle)

    @property
    def done(self):
        """The chip's irq: the run has finished (read without clocking)."""
        return bool(self._lib.mxu_chip_irq(self._handle))

    def clock(self, cycles):
        """Clock exactly `cycles` cycles, whether the run has finished or not."""
        self._lib.mxu_chip_clock(self._handle, check_integer(cycles, "cycles", 0))

    def set_link_bandwidth(self, bytes_per_cycle):
        """Every link carries at most `bytes_per_cycle` bytes a cycle (a flit
        of ``config.link_flit_bytes`` leaves when that many have accrued)."""
        self._check_links(0)
        bpc = check_integer(bytes_per_cycle, "bytes_per_cycle", 1, 1 << 20)
        self._lib.mxu_chip_link_setup(self._handle, self.config.links,
                                      self.config.link_flit_bytes, bpc)

    def _check_links(self, link):
        if not self.config.links:
            raise ValueError("this chip has no links (ChipConfig.links is 0)")
        check_integer(link, "link", 0, self.config.links - 1)

    def link_take(self, link):
        """What link `link` sent since the last call: (cycles of its flits,
        uint64[n]; the flits, uint8[n, link_flit_bytes]; cycles of the
        credits it gave back, uint64[m])."""
        self._check_links(link)
        n, k = _U64(), _U64()
        self._lib.mxu_chip_link_pending(self._handle, link, ctypes.byref(n), ctypes.byref(k))
        cycles = np.zeros(n.value, np.uint64)
        flits = np.zeros((n.value, self.config.link_flit_bytes), np.uint8)
        credits = np.zeros(k.value, np.uint64)
        self._lib.mxu_chip_link_take(self._handle, link, cycles.ctypes.data, flits.ctypes.data,
                                     credits.ctypes.data)
        return cycles, flits, credits

    def link_give(self, link, cycles, flits, credits):
        """Flits (and credits) that arrive on link `link` at the given cycles of
        this chip's clock, ascending and after any given before."""
        self._check_links(link)
        cycles = np.ascontiguousarray(cycles, np.uint64)
        flits = np.ascontiguousarray(flits, np.uint8)
        credits = np.ascontiguousarray(credits, np.uint64)
        if flits.shape != (len(cycles), self.config.link_flit_bytes):
            raise ValueError(f"flits must be {len(cycles)} rows of "
                             f"{self.config.link_flit_bytes} bytes, not {flits.shape}")
        self._lib.mxu_chip_link_give(self._handle, link, len(cycles), cycles.ctypes.data,
                                     flits.ctypes.data, len(credits), credits.ctypes.data)

    def link_arriving(self, link):
        """Flits and credits given to link `link` and not yet presented."""
        self._check_links(link)
        return self._lib.mxu_chip_link_arriving(self._handle, link)

    def finish(self):
        """End a run begun with `start` once `done`: its `RunResult`, with the
        checks and the recovery of `run`."""
        return self._finish(0 if self.done else None, self._pod_limit,
                            time.perf_counter() - self._pod_start)

    def _open_window(self):
        if self.waves is None:
            return
        now = self._lib.mxu_chip_cycles(self._handle)
        first, count = self._window
        until = (1 << 64) - 1 if count is None else now + first + count
        self._lib.mxu_chip_trace_window(self._handle, now + first, until)

    def _clock(self, limit, expected):
        """Clock until irq, in slices of about `_SLICE_SECONDS` of wall time so
        that Python's signal handlers (Ctrl-C) run between them. Returns the
        cycles run, or None when the watchdog expired."""
        done, chunk = 0, 20_000
        lib, handle = self._lib, self._handle
        while not lib.mxu_chip_irq(handle):
            if done >= limit:
                return None
            t0 = time.perf_counter()
            done += lib.mxu_chip_run_for(handle, min(chunk, limit - done))
            spent = time.perf_counter() - t0
            chunk = int(min(max(chunk * _SLICE_SECONDS / max(spent, 1e-6), 1_000), 50_000_000))
            if self.waves is not None:
                self._check_wave_size(done, expected)
        return done

    def _check_wave_size(self, done, expected):
        if self._warned_waves or done < 2_000:
            return
        self._lib.mxu_chip_trace_flush(self._handle)
        size = Path(self.waves).stat().st_size if Path(self.waves).exists() else 0
        first, count = self._window
        dumped = max(1, done - first)
        window = count if count is not None else max(expected or 0, dumped)
        projected = size / dumped * window
        if projected > WAVE_WARN_BYTES or size > WAVE_WARN_BYTES:
            self._warned_waves = True
            print(f"mxu: warning: the waveform {self.waves} is projected to reach "
                  f"{max(projected, size) / 2**30:.1f} GiB ({size / dumped / 1024:.0f} KiB per "
                  f"cycle); narrow it with waves_from/waves_cycles/waves_depth "
                  f"(--waves-from, --waves-cycles, --waves-depth)", file=sys.stderr)

    def _trace_begin(self):
        mask, accept, running = trace_mask()
        if self._lib.mxu_chip_trace_begin(self._handle, (_U32 * len(mask))(*mask), accept, running,
                                          self.trace_bucket) < 0:
            raise ChipError("this chip model was built without the trace port")

    def _trace_read(self):
        words = ctypes.POINTER(_U32)()
        n = self._lib.mxu_chip_trace_events(self._handle, ctypes.byref(words))
        width = len(trace_mask()[0])
        raw = np.ctypeslib.as_array(words, shape=(n * (2 + width),)).copy() if n else \
            np.zeros(0, np.uint32)
        counts = ctypes.POINTER(_U32)()
        b = self._lib.mxu_chip_trace_buckets(self._handle, ctypes.byref(counts))
        buckets = np.ctypeslib.as_array(counts, shape=(b,)).copy() if b else np.zeros(0, np.uint32)
        if self._lib.mxu_chip_trace_truncated(self._handle):
            raise ChipError(f"the trace of this run outgrew its buffer ({n:,} events): profile "
                            f"a smaller run; the run itself finished and its results are in memory")
        return decode_trace(raw.reshape(n, 2 + width), buckets, self.trace_bucket)

    def _check_violations(self):
        """Raise `ChipError` (after a hard reset) if the memory model saw the
        chip break the AXI protocol."""
        count = _U64()
        text = self._lib.mxu_chip_violations(self._handle, ctypes.byref(count))
        if count.value:
            message = text.decode()
            self.reset()
            raise ChipError(f"AXI protocol violation by the chip: {message}; {RESET_NOTE}")

    def _finish(self, cycles, limit, wall):
        if self.waves is not None:
            self._lib.mxu_chip_trace_flush(self._handle)
        if cycles is None:
            status = self.read_reg("STATUS")
            # A soft reset: the bursts in flight complete first, so that the
            # memory sees no burst cut short (docs/driver.md).
            stop = f"watchdog: the chip did not finish within {limit} cycles (STATUS=0x{status:x})"
            try:
                self.soft_reset()
            except ChipError as error:
                raise ChipError(f"{stop}; then {error}") from None
            self._check_violations()
            self._needs_reset = False
            raise ChipError(f"{stop}; its bursts drained, {RESET_NOTE}")
        self._check_violations()
        status = self.read_reg("STATUS")
        result = RunResult(error=ErrorCode((status >> 4) & 0xF), error_pc=self.read_reg("ERROR_PC"),
                           counters=self.counters(), memory=self.memory, wall_s=wall,
                           trace=self._trace_read() if self.trace else None)
        if result.ok:
            self._needs_reset = False
        else:
            self.reset()
        return result
