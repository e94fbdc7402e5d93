"""``Chip.matmul``: validate NumPy operands, place them in external memory, compile
and run one program, read the result back (docs/runtime.md)."""

import time

import numpy as np

from mxu.hdl.dtypes import bfloat16 as bf16

from ..compiler.matmul import compile_matmul, plan_matmul
from ..driver.chip import RESET_NOTE, ChipError
from .stats import RunStats

__all__ = ["run_matmul"]


def _ceil(a, b):
    return -(-a // b)


_FLOAT_OK = (np.float32, np.float64, np.float16)


def _operand(x, name):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, not {x.ndim}-D with shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name} has an empty dimension: shape {x.shape}")
    if x.dtype == bf16:
        return np.ascontiguousarray(x)
    if x.dtype.type not in _FLOAT_OK:
        raise TypeError(f"{name} must be bfloat16 or float32 (rounded to bf16), not {x.dtype}")
    return np.ascontiguousarray(x.astype(np.float32).astype(bf16))


def _bias(bias, M, N):
    if bias is None:
        return "none", None
    if not isinstance(bias, np.ndarray):
        raise TypeError(f"bias must be a numpy array or None, not {type(bias).__name__}")
    if bias.dtype != bf16 and bias.dtype.type not in _FLOAT_OK:
        raise TypeError(f"bias must be a float array, not {bias.dtype}")
    values = np.ascontiguousarray(bias.astype(np.float32))
    if values.shape == (N,):
        return "row", values
    if values.shape == (M, N):
        return "matrix", values
    raise ValueError(f"bias must have shape ({N},) or ({M}, {N}), not {bias.shape}")


def _align(x, a=64):
    return _ceil(x, a) * a


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def _out_dtype(out_dtype):
    try:
        dtype = np.dtype(out_dtype)
    except TypeError:
        dtype = None
    if dtype not in (np.dtype(np.float32), np.dtype(bf16)):
        raise TypeError(f"out_dtype must be np.float32 or ml_dtypes.bfloat16, not {out_dtype!r}")
    return dtype


def run_matmul(chip, A, B, *, bias=None, out_dtype=np.float32, relu=False):
    """Validate, lay out, compile and run ``relu?(A @ B + bias)`` on `chip`."""
    relu = _flag(relu, "relu")
    out_bf16 = _out_dtype(out_dtype) == np.dtype(bf16)
    A, B = _operand(A, "A"), _operand(B, "B")
    (M, K), (K2, N) = A.shape, B.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {A.shape}, B is {B.shape}")
    kind, bias_values = _bias(bias, M, N)
    cfg = chip.config
    start = time.perf_counter()
    a_addr = 0
    b_addr = _align(a_addr + A.nbytes)
    bias_addr = _align(b_addr + B.nbytes)
    c_addr = _align(bias_addr + (bias_values.nbytes if bias_values is not None else 0))
    c_bytes = M * N * (2 if out_bf16 else 4)
    if c_addr + c_bytes > cfg.ext_mem_bytes:
        raise ValueError(f"operands and result need {c_addr + c_bytes} bytes of external memory; "
                         f"the chip's has {cfg.ext_mem_bytes}")
    plan = plan_matmul(cfg, M, K, N, kind)
    program = compile_matmul(cfg, plan, a_addr=a_addr, b_addr=b_addr, c_addr=c_addr,
                             bias=kind, bias_addr=bias_addr, out_bf16=out_bf16, relu=relu)
    code = program.to_bytes()
    base = _align(c_addr + c_bytes, 0x10000)
    need = base + len(code)
    if need > cfg.ext_mem_bytes:
        raise ValueError(f"operands, result and program need {need} bytes of external memory; "
                         f"the chip's has {cfg.ext_mem_bytes}")
    image = {a_addr: A.view(np.uint8).ravel(), b_addr: B.view(np.uint8).ravel()}
    if bias_values is not None:
        image[bias_addr] = bias_values.view(np.uint8).ravel()
    ideal = M * K * N / (cfg.rows * cfg.cols)
    # Watchdog: ten times the ideal cycle count plus room for loads and stores.
    result = chip.run(program, image, base=base, expected_cycles=int(1.2 * ideal) + 10_000,
                      max_cycles=int(10 * ideal + 20 * (A.nbytes + B.nbytes + c_bytes) + 1_000_000))
    if not result.ok:
        pc = min(result.error_pc, len(program) - 1)
        raise ChipError(f"the chip stopped with {result.error.name} at instruction "
                        f"{result.error_pc}: {program.text[pc]}; {RESET_NOTE}", result)
    raw = chip.read_memory(c_addr, c_bytes)
    C = raw.view(bf16 if out_bf16 else np.float32).reshape(M, N).copy()
    stats = RunStats(rows=cfg.rows, cols=cfg.cols, macs=M * K * N, program_bytes=len(code))
    stats.add_counters(result.counters, result.wall_s)
    stats.host_seconds = time.perf_counter() - start - result.wall_s
    chip.last_stats = stats
    return C
