"""`Chip`: drive the simulated mxu from Python (DESIGN section 5).

The chip and its external memory run inside one Verilated shared library; Python
writes the memory image straight into the model's byte array, writes the
registers, lets C++ clock the chip until ``irq``, and reads results back. No
Python runs per cycle.

>>> chip = Chip(ChipConfig(rows=8, cols=8))
>>> C = chip.matmul(A, B)            # see `Chip.matmul`
>>> chip.last_stats["utilization"]
"""

import ctypes
import functools
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np

from mxu.hdl.config import ChipConfig
from mxu.hdl.controller import COUNTERS
from mxu.hdl.isa import ErrorCode
from mxu.hdl.regs import CHIP_ID, REG

from .build import lean_verilog
from .dma import axi_mem_flags
from .native import build_native, load_native
from .toolchain import require_simulator

__all__ = ["Chip", "RunResult", "ChipError"]

_U64, _U32, _PTR = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p
_SIGNATURES = {
    "mxu_chip_new": (_PTR, [_U64, _U32]),
    "mxu_chip_free": (None, [_PTR]),
    "mxu_chip_mem": (ctypes.POINTER(ctypes.c_uint8), [_PTR]),
    "mxu_chip_mem_params": (None, [_PTR, _U32, _U32, ctypes.POINTER(_U32), _U64]),
    "mxu_chip_add_error": (None, [_PTR, _U64, _U64, _U32]),
    "mxu_chip_clear_errors": (None, [_PTR]),
    "mxu_chip_reg_write": (ctypes.c_int, [_PTR, _U32, _U32, ctypes.POINTER(_U32)]),
    "mxu_chip_reg_read": (ctypes.c_int, [_PTR, _U32, ctypes.POINTER(_U32), ctypes.POINTER(_U32)]),
    "mxu_chip_run": (ctypes.c_int64, [_PTR, _U64]),
    "mxu_chip_violations": (ctypes.c_char_p, [_PTR, ctypes.POINTER(_U64)]),
    "mxu_chip_trace": (ctypes.c_int, [_PTR, ctypes.c_char_p]),
}


class ChipError(RuntimeError):
    """The chip stopped with an error code, or the watchdog ended a stuck run."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


@dataclass
class RunResult:
    """What one `Chip.run` left behind."""
    error: ErrorCode
    error_pc: int
    counters: dict
    memory: np.ndarray = field(repr=False)   # the external memory (a view: copy to keep)

    @property
    def ok(self):
        return self.error is ErrorCode.NONE


@functools.lru_cache(maxsize=4)
def chip_verilog(config, fast_mac=False):
    """Verilog (module ``top``) of ``MxuChip(config)`` for simulation: the PE is a
    separate module instantiated rows*cols times -- the RTL `ProcessingElement`
    (`mxu.sim.array.pe_verilog`), or with `fast_mac` its stand-in whose multiply-add
    is a C call (`mxu.sim.fast_pe`)."""
    from mxu.hdl.top import MxuChip
    from .array import pe_verilog
    from .fast_pe import fast_pe_verilog
    pe_name, pe = (fast_pe_verilog if fast_mac else pe_verilog)(config.mac_stages)
    return pe + lean_verilog(MxuChip(config, pe_module=pe_name))


_TRACE_FLAGS = {
    None: (),
    "vcd": ("--trace", "--trace-structs"),
    # Verilator's FST writer needs the lz4 and zlib headers from the OS.
    "fst": ("--trace-fst", "--trace-structs", "-LDFLAGS", "-lz -llz4"),
}


def _wave_format(waves):
    if waves is None:
        return None
    suffix = Path(waves).suffix.lower()
    if suffix not in (".vcd", ".fst"):
        raise ValueError(f"waves must name a .vcd or .fst file, not {str(waves)!r}")
    if suffix == ".fst" and not Path("/usr/include/lz4.h").exists():
        raise ValueError("FST waveforms need the lz4 development headers (e.g. apt-get install "
                         "liblz4-dev), which this machine lacks; name a .vcd file instead")
    return suffix[1:]


@functools.lru_cache(maxsize=4)
def _library(config, waves=None, fast_mac=False):
    # Waveforms need a separate build: tracing slows every cycle down.
    trace = _TRACE_FLAGS[waves]
    name = f"chip{config.rows}x{config.cols}" + ("_fastmac" if fast_mac else "") + \
        (f"_{waves}" if waves else "")
    lib = load_native(build_native(chip_verilog(config, fast_mac), "chip_harness.cpp",
                                   name=name, extra_flags=axi_mem_flags() + trace))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class Chip:
    """One simulated mxu chip with its external memory.

    Parameters
    ----------
    config : ChipConfig or None
        Sizes; the default 16x16 chip if None.
    simulator : str
        "verilator" (the only whole-chip backend; cocotb testbenches in
        `mxu.verif` run the same RTL on other simulators).
    mem_latency : (int, int)
        Random latency range, in cycles, of the external memory's responses.
    mem_pause : dict or None
        Percent of cycles each AXI channel ("aw", "w", "b", "ar", "r") stalls.
    seed : int
        Seed of the memory model's randomness.
    waves : str or None
        Record every cycle of every run into this .vcd (or, where the OS has the
        lz4 headers, .fst) file, from a separately built traced model.
    fast_mac : bool
        Simulate each PE's multiply-add with a C function of the same IEEE
        arithmetic instead of its gate-level fp32 datapath (`mxu.sim.fast_pe`):
        several times faster, identical results and cycle counts; everything else
        is still the RTL. Default False: the whole chip is RTL.
    """

    def __init__(self, config=None, simulator="verilator", *, mem_latency=(0, 0), mem_pause=None,
                 seed=1, waves=None, fast_mac=False):
        self.config = config or ChipConfig()
        if not isinstance(self.config, ChipConfig):
            raise TypeError(f"config must be a ChipConfig, not {type(config).__name__}")
        require_simulator(simulator)
        if simulator != "verilator":
            raise ValueError(f"Chip runs on Verilator only (the cocotb testbenches cover "
                             f"{simulator!r}); got simulator={simulator!r}")
        self.simulator = simulator
        self.fast_mac = bool(fast_mac)
        self._lib = _library(self.config, _wave_format(waves), self.fast_mac)
        self._handle = self._lib.mxu_chip_new(self.config.ext_mem_bytes, self.config.axi_data_bytes)
        if waves and self._lib.mxu_chip_trace(self._handle, str(waves).encode()) != 0:
            raise ChipError("this chip model was built without tracing")
        pointer = self._lib.mxu_chip_mem(self._handle)
        self.memory = np.ctypeslib.as_array(pointer, shape=(self.config.ext_mem_bytes,))
        self.set_memory_timing(mem_latency, mem_pause, seed)
        self.last_stats = None
        if self.read_reg("ID") != CHIP_ID:
            raise ChipError("the simulated chip does not answer with the mxu ID")

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.mxu_chip_free(handle)
            self._handle = None

    # ---- external memory ---------------------------------------------------------
    def set_memory_timing(self, latency=(0, 0), pause=None, seed=1):
        pause = pause or {}
        unknown = set(pause) - {"aw", "w", "b", "ar", "r"}
        if unknown:
            raise ValueError(f"unknown AXI channels {sorted(unknown)}")
        pcts = (_U32 * 5)(*[int(pause.get(ch, 0)) for ch in ("aw", "w", "b", "ar", "r")])
        self._lib.mxu_chip_mem_params(self._handle, int(latency[0]), int(latency[1]), pcts, seed)

    def inject_error(self, lo, hi, resp="slverr"):
        """Make every access to external bytes [lo, hi) answer SLVERR or DECERR."""
        code = {"slverr": 2, "decerr": 3}[resp]
        self._lib.mxu_chip_add_error(self._handle, lo, hi, code)

    def clear_errors(self):
        self._lib.mxu_chip_clear_errors(self._handle)

    def write_memory(self, addr, data):
        data = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray)
                             else np.ascontiguousarray(data).tobytes(), np.uint8)
        if addr < 0 or addr + data.size > self.memory.size:
            raise ValueError(f"{data.size} bytes at 0x{addr:x} do not fit in the "
                             f"{self.memory.size}-byte external memory")
        self.memory[addr:addr + data.size] = data

    def read_memory(self, addr, nbytes):
        return self.memory[addr:addr + nbytes].copy()

    # ---- registers -----------------------------------------------------------------
    def write_reg(self, name, value):
        resp = _U32()
        if self._lib.mxu_chip_reg_write(self._handle, REG[name], value & 0xFFFFFFFF,
                                        ctypes.byref(resp)) != 0:
            raise ChipError(f"register write to {name} timed out")
        return resp.value

    def read_reg(self, name, offset=0):
        data, resp = _U32(), _U32()
        if self._lib.mxu_chip_reg_read(self._handle, REG[name] + offset, ctypes.byref(data),
                                       ctypes.byref(resp)) != 0:
            raise ChipError(f"register read of {name} timed out")
        return data.value

    def counters(self):
        out = {}
        for i, name in enumerate(COUNTERS):
            lo = self.read_reg("COUNTERS", 8 * i)
            hi = self.read_reg("COUNTERS", 8 * i + 4)
            out[name] = lo | hi << 32
        return out

    def soft_reset(self):
        self.write_reg("CTRL", 0b10)

    # ---- running ---------------------------------------------------------------------
    def run(self, program, memory_image=None, *, base=None, max_cycles=None):
        """Run `program` (a `Program` or bytes) in one simulator session.

        `memory_image` is None, or a dict {address: bytes/ndarray} written to
        external memory first. The program goes at `base` (default: the top
        64 KiB-aligned region that holds it). Returns a `RunResult`; the watchdog
        (`max_cycles`, default 100 cycles per instruction plus 50 M) raises
        `ChipError` if the chip never finishes.
        """
        code = program.to_bytes() if hasattr(program, "to_bytes") else bytes(program)
        if base is None:
            base = (self.memory.size - len(code)) & ~0xFFFF
        for addr, data in (memory_image or {}).items():
            self.write_memory(addr, data)
        self.write_memory(base, code)
        self.write_reg("PROG_BASE", base)
        self.write_reg("PROG_LEN", len(code) // 16)
        self.write_reg("CTRL", 1)
        limit = max_cycles or (50_000_000 + 100 * len(code))
        cycles = self._lib.mxu_chip_run(self._handle, limit)
        if cycles < 0:
            raise ChipError(f"watchdog: the chip did not finish within {limit} cycles "
                            f"(STATUS=0x{self.read_reg('STATUS'):x})")
        status = self.read_reg("STATUS")
        error = ErrorCode((status >> 4) & 0xF)
        count = _U64()
        text = self._lib.mxu_chip_violations(self._handle, ctypes.byref(count))
        if count.value:
            raise ChipError(f"AXI protocol violation by the chip: {text.decode()}")
        return RunResult(error=error, error_pc=self.read_reg("ERROR_PC"),
                         counters=self.counters(), memory=self.memory)

    def matmul(self, A, B, bias=None, out_dtype=np.float32, relu=False):
        """``relu?(A @ B + bias)`` on the chip; see `mxu.sim.compiler.compile_matmul`."""
        from .compiler import run_matmul
        return run_matmul(self, A, B, bias=bias, out_dtype=out_dtype, relu=relu)
