"""Native (ctypes) runner for the DMA subsystem next to the C++ external-memory
model (``sim/backends/csrc/axi_mem.h``).

`NativeDma` is what ``bench/dma.py`` and the large DMA tests use: Python fills
the external memory through a NumPy view of the model's byte array (no clock
steps), hands over a list of descriptors, and the whole run happens in C++.
"""

import ctypes

import numpy as np

from .native import native_library
from .verilog import dma_system_verilog

__all__ = ["NativeDma", "PAUSE_CHANNELS"]

PAUSE_CHANNELS = ("aw", "w", "b", "ar", "r")


def _words(value, n):
    return [(value >> (32 * i)) & 0xFFFFFFFF for i in range(n)]


class NativeDma:
    """A Verilated ``DmaSystem(config)`` with an `AxiMem` slave of
    ``config.ext_mem_bytes`` bytes (or `ext_bytes`).

    Parameters
    ----------
    config : ChipConfig
    latency : (int, int)
        Random per-burst latency range of the memory model, in cycles.
    pause : int or dict
        % of cycles the slave pauses each channel: one number for all five, or a
        dict over ``PAUSE_CHANNELS``.
    max_reads, max_writes : int
        Bursts the memory model accepts before it stops taking addresses.
    seed : int
        Seed of the model's back-pressure and latency.
    """

    def __init__(self, config, *, latency=(0, 0), pause=0, max_reads=8, max_writes=8, seed=1,
                 ext_bytes=None):
        from mxu.hdl.dma import dma_completion_layout, dma_descriptor_layout
        self.config = config
        self.ext_bytes = ext_bytes or config.ext_mem_bytes
        lib = native_library("dma_system", "dma_harness.cpp", key=[repr(config)],
                             verilog=lambda: dma_system_verilog(config))
        lib.mxu_dma_new.restype = ctypes.c_void_p
        lib.mxu_dma_new.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
        lib.mxu_dma_free.argtypes = [ctypes.c_void_p]
        lib.mxu_dma_mem.restype = ctypes.POINTER(ctypes.c_uint8)
        lib.mxu_dma_mem.argtypes = [ctypes.c_void_p]
        lib.mxu_dma_params.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                       ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                                       ctypes.c_uint32, ctypes.c_uint64]
        lib.mxu_dma_add_error.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                          ctypes.c_uint32]
        lib.mxu_dma_clear_errors.argtypes = [ctypes.c_void_p]
        lib.mxu_dma_stats.restype = ctypes.c_char_p
        lib.mxu_dma_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.mxu_dma_run.restype = ctypes.c_int64
        lib.mxu_dma_run.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                    ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                                    ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                                    ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64]
        lib.mxu_dma_read_rows.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.POINTER(ctypes.c_uint32)]
        lib.mxu_dma_write_acc.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.POINTER(ctypes.c_uint32)]
        self._lib = lib
        self._h = lib.mxu_dma_new(self.ext_bytes, config.axi_data_bytes)
        self.ext = np.ctypeslib.as_array(lib.mxu_dma_mem(self._h), shape=(self.ext_bytes,))
        self._desc_layout = dma_descriptor_layout(config)
        self._done_layout = dma_completion_layout(config)
        self._desc_words = -(-self._desc_layout.size // 32)
        self.set_params(latency=latency, pause=pause, max_reads=max_reads,
                        max_writes=max_writes, seed=seed)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            self.ext = None
            self._lib.mxu_dma_free(h)

    def set_params(self, *, latency=(0, 0), pause=0, max_reads=8, max_writes=8, seed=1):
        """Change the memory model's latency, back-pressure and acceptance limits."""
        if isinstance(pause, dict):
            unknown = set(pause) - set(PAUSE_CHANNELS)
            if unknown:
                raise ValueError(f"unknown AXI channels {sorted(unknown)}; use {PAUSE_CHANNELS}")
            pct = [int(pause.get(ch, 0)) for ch in PAUSE_CHANNELS]
        else:
            pct = [int(pause)] * 5
        if any(not 0 <= p <= 99 for p in pct):
            raise ValueError(f"pause percentages must be 0..99, not {pct}")
        lo, hi = latency
        if not 0 <= lo <= hi:
            raise ValueError(f"latency must be a range (lo, hi) with 0 <= lo <= hi, not {latency}")
        arr = (ctypes.c_uint32 * 5)(*pct)
        self._lib.mxu_dma_params(self._h, lo, hi, arr, max_reads, max_writes, seed)

    def add_error(self, lo, hi, resp):
        """Answer beats touching [lo, hi) with `resp` (2 = SLVERR, 3 = DECERR)."""
        self._lib.mxu_dma_add_error(self._h, lo, hi, resp)

    def clear_errors(self):
        self._lib.mxu_dma_clear_errors(self._h)

    def stats(self):
        """Counters of the memory model and the harness (a dict)."""
        s = (ctypes.c_uint64 * 11)()
        first = self._lib.mxu_dma_stats(self._h, s)
        keys = ("cycles", "ar_bursts", "aw_bursts", "r_beats", "w_beats", "max_reads_in_flight",
                "max_writes_in_flight", "violations", "r_error_beats", "b_errors", "mem_busy")
        out = dict(zip(keys, (int(v) for v in s)))
        out["first_violation"] = first.decode()
        return out

    def run(self, descriptors, *, array_traffic=False, max_cycles=None):
        """Run descriptors (objects with ``pack(config)``, or packed ints) back to
        back. Returns (list of (error, tag) per descriptor, cycles). Raises
        TimeoutError if the watchdog (`max_cycles`, default generous) expires.

        `array_traffic`: True (or "read") makes the array's read ports read
        consecutive VMEM and accumulator rows every cycle; "read+write" also makes
        its result port write zero rows into the last two accumulator rows every
        cycle (those rows are then zero).
        """
        from mxu.hdl.dma import DmaError
        packed = [d if isinstance(d, int) else d.pack(self.config) for d in descriptors]
        n = len(packed)
        if max_cycles is None:
            total = sum(_traffic_bytes(d) for d in descriptors if not isinstance(d, int))
            max_cycles = 10_000 + 200 * n + 50 * total // self.config.axi_data_bytes
        words = (ctypes.c_uint32 * (n * self._desc_words))(
            *[w for p in packed for w in _words(p, self._desc_words)])
        done = (ctypes.c_uint32 * max(n, 1))()
        c = self.config
        cycles = self._lib.mxu_dma_run(self._h, n, words, self._desc_words, done,
                                       _traffic_mode(array_traffic), c.vmem_rows, c.acc_rows,
                                       max_cycles)
        if cycles < 0:
            raise TimeoutError(f"DMA watchdog: {n} descriptors not complete after "
                               f"{max_cycles} cycles (stats {self.stats()})")
        out = []
        for i in range(n):
            f = {name: (done[i] >> fld.offset) & ((1 << fld.width) - 1)
                 for name, fld in self._done_layout}
            out.append((DmaError(f["error"]), f["tag"]))
        return out, cycles

    def read_rows(self, space, row, n):
        """``n`` on-chip rows from `row` (space "vmem" or "acc") as uint8[n, row_bytes],
        through the array's read port."""
        c = self.config
        row_bytes = c.vmem_row_bytes if space == "vmem" else c.acc_row_bytes
        words = -(-row_bytes // 4)
        out = (ctypes.c_uint32 * (n * words))()
        self._lib.mxu_dma_read_rows(self._h, 0 if space == "vmem" else 1, row, n, words, out)
        return np.frombuffer(out, dtype=np.uint32).view(np.uint8).reshape(n, words * 4)[:, :row_bytes].copy()

    def write_acc(self, row, rows):
        """Write uint8[n, acc_row_bytes] into accumulator rows from `row` on, through
        the array's result port."""
        from mxu.hdl.vmem import _addr_shape
        c = self.config
        rows = np.ascontiguousarray(rows, dtype=np.uint8).reshape(-1, c.acc_row_bytes)
        abits = _addr_shape(c.acc_rows).width
        words = -(-(abits + 8 * c.acc_row_bytes) // 32)
        flat = []
        for i, r in enumerate(rows):
            value = (row + i) | (int.from_bytes(r.tobytes(), "little") << abits)
            flat += _words(value, words)
        arr = (ctypes.c_uint32 * len(flat))(*flat)
        self._lib.mxu_dma_write_acc(self._h, len(rows), words, arr)


def _traffic_mode(array_traffic):
    modes = {False: 0, None: 0, True: 1, "read": 1, "read+write": 3}
    if array_traffic not in modes:
        raise ValueError(f"array_traffic must be one of {list(modes)}, not {array_traffic!r}")
    return modes[array_traffic]


def _traffic_bytes(d):
    return sum(end - start for start, end in d.ext_ranges()) if hasattr(d, "ext_ranges") else 0
