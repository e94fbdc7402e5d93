"""`Chip`: the simulated mxu as users see it (docs/runtime.md).

It owns one driver-level `SimulatedChip` (registers, external memory, ``run``)
and adds what a user of a matrix unit wants: tensors that live in the chip's
external memory (its HBM), matmuls of any size on ndarrays or device tensors,
recorded sequences of matmuls compiled into one program, a compile cache, and
statistics. ``chip.run(program)`` passes straight through to the driver.

>>> chip = Chip(ChipConfig(rows=8, cols=8))
>>> W = chip.upload(weights, dtype=ml_dtypes.bfloat16)     # stays on the chip
>>> y = chip.matmul(x, W, bias=b)                          # ndarray in, ndarray out
>>> with chip.record():                                    # one program for many matmuls
...     heads = [chip.matmul(q[:, 32*h:32*h+32], kt[h]) for h in range(12)]
>>> chip.last_stats.utilization
"""

import collections
import contextlib
import dataclasses
import gc
import time

import numpy as np

from mxu.hdl.dtypes import as_bf16, bfloat16

from ..compiler.matmul import compile_matmuls
from ..driver.chip import RESET_NOTE, ChipError, SimulatedChip
from ..compiler.layerops import layer_op
from .matmul import check_flag, prepare_matmul
from .memory import Allocator
from .profile import Trace
from .stats import RunStats
from .quant import upload_quantized
from .tensor import DTYPES, DeviceTensor
from .vector import prepare_vector

__all__ = ["Chip", "Recording", "Profile", "PROGRAM_CACHE_SIZE", "PROGRAM_CACHE_INSTRUCTIONS"]

# The compile cache keeps at most this many programs and this many instructions
# in all, the least recently used going first. A cached program is its image
# (`FrozenProgram`, 16 bytes an instruction; a compiled `Program` with its
# listing holds some 400), so the budget is 512 MiB: SmolLM2's programs on the
# 8x1 fpga-llm chip are millions of instructions (docs/runtime.md).
PROGRAM_CACHE_SIZE = 256
PROGRAM_CACHE_INSTRUCTIONS = 1 << 25


class Profile:
    """What ``chip.profile()`` returns: ``trace`` collects the programs run inside."""

    def __init__(self, chip):
        self.chip, self.trace = chip, None

    def __enter__(self):
        self.chip._profiles.append(self)
        return self

    def __exit__(self, *exc):
        self.chip._profiles.remove(self)
        return False

    def _add(self, trace):
        if self.trace is None:
            self.trace = Trace(bucket_cycles=trace.bucket_cycles)
        self.trace.extend(trace)


class Recording:
    """Matmuls recorded by ``with chip.record():``, compiled into one program and
    run when the block ends; `run()` runs them again (from the compile cache)."""

    def __init__(self, chip):
        self.chip, self.calls, self.stats = chip, [], None

    def __enter__(self):
        if self.chip._recording is not None:
            raise RuntimeError("recordings do not nest")
        self.chip._recording = self
        return self

    def __exit__(self, kind, error, tb):
        self.chip._recording = None
        try:
            if kind is None and self.calls:
                self.run()
        finally:
            for call in self.calls:
                for out in _outputs(call):
                    out._pending = None
        return False

    @property
    def outputs(self):
        return [call.out for call in self.calls]

    def run(self):
        """Run the recorded matmuls as one program; returns their `RunStats`."""
        if not self.calls:
            raise ValueError("nothing was recorded")
        for call in self.calls:
            call.check_alive()
        self.stats = self.chip._execute(self.calls)
        return self.stats


def _outputs(call):
    return getattr(call, "outputs", [call.out])


def _operand_bytes(op):
    operands = [getattr(op, name, None) for name in ("a", "b", "c", "x", "out", "out_bf16",
                                                      "out_t", "other")]
    return sum(o.rows * o.row_bytes for o in operands if o is not None)


def _vector_cycles(config, op):
    """About the cycles of a `VectorOp` or a matmul's epilogue: its row passes."""
    x = getattr(op, "x", None)
    if x is not None:
        rows, cols, kind = x.rows, x.cols, op.kind
    elif getattr(op, "epilogue", None) is not None:
        rows, cols, kind = op.M, op.N, op.epilogue.kind
    else:
        return 0
    return layer_op(kind).passes * rows * -(-cols // config.cols)


@contextlib.contextmanager
def _no_cycle_collection():
    """Python's cycle collector off for a compilation: a decode step's
    programs allocate millions of small objects, and each collection they
    set off walks every object alive, the compile cache's listings included
    (a sixth of a compilation's time). Their objects are freed by reference
    counting; cycles wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Chip:
    """One simulated mxu chip and the runtime around it.

    Parameters are those of `mxu.sim.driver.SimulatedChip`: ``config`` (a
    `ChipConfig`, default 16x16), ``simulator``, ``mem_latency``, ``mem_pause``,
    ``seed``, ``waves`` (and its window options), ``fast_mac``; and
    ``handoffs``: whether the compiler keeps an epilogue's result that the
    next matmul reads in VMEM (docs/compiler.md, "Hand-offs in VMEM"; the
    same bits either way, off only to compare).
    """

    def __init__(self, config=None, simulator="verilator", handoffs=True, **options):
        self.handoffs = check_flag(handoffs, "handoffs")
        self.device = SimulatedChip(config, simulator, **options)
        self.config = self.device.config
        self.last_stats = None
        self.last_trace = None
        self._profiles = []
        self._allocator = Allocator(self.config.ext_mem_bytes)
        self._programs = collections.OrderedDict()
        self._recording = None

    def __repr__(self):
        c = self.config
        if self.closed:
            return f"Chip({c.rows}x{c.cols}, closed)"
        return (f"Chip({c.rows}x{c.cols}, {'fast MAC' if self.device.fast_mac else 'RTL'}, "
                f"{self._allocator.free_bytes:,} of {c.ext_mem_bytes:,} bytes free)")

    # ---- lifetime -----------------------------------------------------------------------
    @property
    def closed(self):
        return self.device.closed

    def close(self):
        """Free the simulator and its external memory now (an ``llm`` chip
        holds 1 GiB); its tensors go with them. Every later use of the chip
        or of its tensors raises `ChipError`. Idempotent; ``with Chip(...) as
        chip:`` closes at the end of the block."""
        self.device.close()
        self._programs.clear()
        self.last_trace = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- the driver, passed through ---------------------------------------------
    @property
    def memory(self):
        return self.device.memory

    def run(self, program, memory_image=None, *, base=None, **options):
        """Run a `Program` (or program bytes); see `SimulatedChip.run`. Raw
        programs address external memory directly, device tensors included;
        without a `base` the program is placed in memory the allocator hands
        out (so it overwrites no tensor), with one it is the caller's business."""
        if base is not None:
            return self.device.run(program, memory_image, base=base, **options)
        code = self.device._program_bytes(program)
        block = self._allocator.alloc(len(code), "the program", top=True)
        try:
            return self.device.run(code, memory_image, base=block.addr, **options)
        finally:
            block.free()

    def soft_reset(self):
        self.device.soft_reset()

    def reset(self):
        self.device.reset()

    def inject_error(self, lo, hi, resp="slverr"):
        self.device.inject_error(lo, hi, resp)

    def clear_errors(self):
        self.device.clear_errors()

    def set_memory_timing(self, latency=(0, 0), pause=None, seed=1):
        self.device.set_memory_timing(latency, pause, seed)

    def write_memory(self, addr, data):
        self.device.write_memory(addr, data)

    def read_memory(self, addr, nbytes):
        return self.device.read_memory(addr, nbytes)

    def read_reg(self, name, offset=0):
        return self.device.read_reg(name, offset)

    def write_reg(self, name, value):
        return self.device.write_reg(name, value)

    def counters(self):
        return self.device.counters()

    # ---- tensors ------------------------------------------------------------------------
    @property
    def free_bytes(self):
        """External memory not held by tensors."""
        return self._allocator.free_bytes

    def empty(self, shape, dtype=np.float32, transient=False):
        """An uninitialised device tensor of `shape` (1-D or 2-D) and `dtype`
        (``np.float32`` or ``ml_dtypes.bfloat16``). A `transient` tensor is
        written and read inside one program (a recording): the compiler may
        keep it on the chip and never write it to external memory
        (docs/runtime.md); once that program has run, using it raises."""
        dtype = np.dtype(dtype)
        if dtype not in DTYPES:
            raise TypeError(f"device tensors are bfloat16 or float32, not {dtype}")
        shape = tuple(int(n) for n in np.atleast_1d(shape))
        if len(shape) not in (1, 2) or min(shape) < 1:
            raise ValueError(f"device tensors are 1-D or 2-D with sizes >= 1, not {shape}")
        nbytes = int(np.prod(shape)) * dtype.itemsize
        block = self._allocator.alloc(nbytes, f"a {shape} {dtype.name} tensor")
        block.transient = bool(check_flag(transient, "transient"))
        return DeviceTensor(self, block, block.addr, shape, dtype, shape[-1] * dtype.itemsize)

    def upload(self, array, dtype=None):
        """Copy a 1-D or 2-D float array into external memory: a `DeviceTensor`.
        `dtype`: ``ml_dtypes.bfloat16`` (rounded to nearest even) or
        ``np.float32``; None keeps bfloat16 arrays bfloat16 and makes every
        other float array float32."""
        if isinstance(array, DeviceTensor):
            raise TypeError("upload takes a numpy array; this is already a DeviceTensor")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"upload takes a numpy array, not {type(array).__name__}")
        if array.dtype != bfloat16 and not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"upload takes a float array, not {array.dtype}")
        dtype = np.dtype(bfloat16 if array.dtype == bfloat16 else np.float32) if dtype is None \
            else np.dtype(dtype)
        if dtype not in DTYPES:
            raise TypeError(f"device tensors are bfloat16 or float32, not {dtype}")
        data = as_bf16(array) if dtype == np.dtype(bfloat16) else array.astype(np.float32)
        tensor = self.empty(data.shape, dtype)
        self.device.write_memory(tensor.addr, np.ascontiguousarray(data), "array")
        return tensor

    def upload_quantized(self, raw, qtype, shape, name=None):
        """Put a GGUF tensor's raw blocks on the chip, in its tile-block layout
        (docs/memory.md, "Quantized loads"): a `QuantizedTensor` that
        `matmul` takes as its weights B, expanded to bf16 on the chip.
        `qtype`: a ``gguf.GGMLQuantizationType`` or its name (``"Q4_1"``);
        `shape`: (N, K) as the file stores it (N rows of K), so that B is K x
        N. Bad input raises ValueError naming `name` and the problem; nothing
        is then allocated."""
        return upload_quantized(self, raw, qtype, shape,
                                name if name is not None else "a quantized tensor")

    # ---- matmuls --------------------------------------------------------------------------
    def record(self):
        """``with chip.record() as rec:`` -- the matmuls inside become one program,
        run when the block ends. Inside, `matmul` returns device tensors (not
        yet computed); ``rec.stats`` and ``chip.last_stats`` describe the run."""
        return Recording(self)

    def matmul(self, A, B, bias=None, out_dtype=np.float32, relu=False, out=None, keep=False, *,
               then=None, out_bf16=None, other=None, params=None, scale=None, eps=None,
               transpose=None, paired=None):
        """``relu?(A @ B + bias)`` on the chip, bit-exact to
        ``golden.matmul(A, B, seed=bias, rows=config.rows)`` (docs/numerics.md).

        A (M x K) and B (K x N): ndarrays (rounded to bf16) or bf16 device
        tensors, views included; B may also be a `QuantizedTensor`
        (`upload_quantized`: GGUF blocks expanded to bf16 on the chip, the
        same bits as the bf16 upload of ``bf16(gguf dequantize)``). bias: None, (N,) or (M, N) fp32 (ndarray or
        device tensor). out_dtype: ``np.float32`` or ``ml_dtypes.bfloat16``.
        Returns an ndarray; a device tensor with ``keep=True``, or `out` (a
        device tensor to write) when given, so results feed the next matmul
        without a round trip. Any size that fits external memory runs: M and N
        are tiled, and K is split into chunks when one block cannot hold it.

        ``then`` (a chip with the vector unit): a layer op applied to the fp32
        result before it is written -- "softmax" (``softmax(r * scale +
        other)``, `other` one bias row as `softmax_bias` makes it, or None
        when nothing is masked and N is a multiple of cols), "gelu",
        "layer_norm" (`params` as `layer_norm_params` makes them),
        "add_layer_norm" (``layer_norm(r + other)``) or "transpose" (`out`,
        N x M bf16, is ``(r * scale).T``: K^T for attention scores). `out_bf16` receives a
        bf16 copy of an fp32 result. The vector unit works on each group of
        output tiles while the array computes the next (docs/vpu.md, "Fused
        epilogues"); the bits are those of the matmul followed by
        `Chip.vector` of the same kind.
        """
        keep = check_flag(keep, "keep")
        start = time.perf_counter()
        given = dict(out_bf16=out_bf16, other=other, params=params, scale=scale, eps=eps,
                     transpose=transpose, paired=paired)
        call = prepare_matmul(self, A, B, bias, out_dtype, relu, out, then,
                              **{k: v for k, v in given.items() if v is not None})
        if self._recording is not None:
            self._recording.calls.append(call)
            for out in call.outputs:
                out._pending = self._recording
            return call.out
        stats = self._execute([call], host_start=start)
        self.last_stats = stats
        if keep or out is not None:
            return call.out
        result = call.out.numpy()
        call.out.free()
        return result

    def vector(self, kind, x, **operands):
        """A transformer layer op on the vector unit (``ChipConfig(vpu=True)``),
        on fp32 device tensors, bit-exact to its VPU form in
        the golden VPU form with the chip's lane order (docs/vpu.md). `kind` and
        the operands are those of `mxu.sim.compiler.vector.VectorOp`
        (``out``, ``out_bf16``, ``out_t``, ``other``, ``params``, ``group``,
        ``scale``, ``eps``). Runs at once, or as part of the recording's
        program inside ``with chip.record():``; returns the output tensors."""
        start = time.perf_counter()
        call = prepare_vector(self, kind, x, **operands)
        if self._recording is not None:
            self._recording.calls.append(call)
            for out in call.outputs:
                out._pending = self._recording
        else:
            self._execute([call], host_start=start)
        return call.outputs[0] if len(call.outputs) == 1 else tuple(call.outputs)

    def _compile(self, ops):
        key = (self.handoffs,) + tuple(ops)
        if key in self._programs:
            self._programs.move_to_end(key)
            hit = self._programs[key]
            return hit, hit.program.to_bytes(), True
        with _no_cycle_collection():
            compiled = compile_matmuls(self.config, ops, handoffs=self.handoffs)
        # The fresh program runs with its own listing; the cache holds the image.
        frozen = compiled.program.frozen()
        self._programs[key] = dataclasses.replace(compiled, program=frozen)
        held = sum(len(p.program) for p in self._programs.values())
        while len(self._programs) > 1 and (len(self._programs) > PROGRAM_CACHE_SIZE
                                           or held > PROGRAM_CACHE_INSTRUCTIONS):
            held -= len(self._programs.popitem(last=False)[1].program)
        return compiled, frozen.to_bytes(), False

    def _execute(self, calls, host_start=None):
        """Compile (or fetch from the cache) and run the ops of `calls` as one
        program; returns and records its `RunStats`."""
        start = time.perf_counter() if host_start is None else host_start
        ops = [op for call in calls for op in call.ops]
        compiled, code, hit = self._compile(ops)
        block = self._allocator.alloc(len(code), "the program", top=True)
        ideal = compiled.macs / (self.config.rows * self.config.cols)
        ideal += sum(_vector_cycles(self.config, op) for op in ops)
        operand_bytes = sum(_operand_bytes(op) for op in ops)
        try:
            result = self.device.run(code, base=block.addr, expected_cycles=int(1.2 * ideal) + 10_000,
                                     max_cycles=int(10 * ideal + 20 * operand_bytes + 1_000_000))
        finally:
            block.free()
        if not result.ok:
            pc = result.error_pc
            text = compiled.program.text[pc] if pc < len(compiled.program) else "(end of program)"
            raise ChipError(f"the chip stopped with {result.error.name} at instruction {pc}: "
                            f"{text.strip()}; {RESET_NOTE}", result)
        for call in calls:
            for out in _outputs(call):
                out._block.spent = out._block.transient
        stats = RunStats(rows=self.config.rows, cols=self.config.cols,
                         macs=sum(call.macs for call in calls), program_bytes=len(code),
                         cache_hits=int(hit))
        stats.add_counters(result.counters, result.wall_s)
        if result.trace is not None:
            self.last_trace = Trace.from_run(result.trace, compiled.program, result.counters)
            for profile in self._profiles:
                profile._add(self.last_trace)
        stats.host_seconds = time.perf_counter() - start - result.wall_s
        self.last_stats = stats
        return stats

    def profile(self):
        """``with chip.profile() as prof:`` -- ``prof.trace`` is the `Trace` of every
        program run inside (the chip must be made with ``trace=True``)."""
        if not self.device.trace:
            raise ValueError("profiling needs the chip's trace port: make it with Chip(..., trace=True)")
        return Profile(self)
