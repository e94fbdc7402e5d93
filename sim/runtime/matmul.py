"""``Chip.matmul``: operands checked and placed, K split where the chip cannot
hold it, ops for the compiler (docs/runtime.md)."""

from dataclasses import dataclass, field

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..compiler.operands import MatmulOp
from ..compiler.plan import max_k_tiles, plan_op
from ..compiler.epilogue import EPILOGUE_KINDS, Epilogue, epilogue_operands
from ..compiler.vector import VectorOp
from .tensor import DeviceTensor

__all__ = ["MatmulCall", "prepare_matmul", "check_flag", "check_matmul_fits"]

_FLOATS = (np.float16, np.float32, np.float64)


def check_matmul_fits(config, M, K, N):
    """ValueError naming the limit if a fresh chip's external memory cannot hold
    a ``M x K @ K x N`` matmul's operands (bf16 A and B, fp32 C, each region
    64-byte aligned): the check a caller makes before it builds anything."""
    def region(nbytes):
        return -(-nbytes // 64) * 64
    need = region(2 * M * K) + region(2 * K * N) + region(4 * M * N)
    if need > config.ext_mem_bytes:
        raise ValueError(f"a {M}x{K} @ {K}x{N} matmul needs {need:,} bytes of external memory "
                         f"(bf16 A and B, fp32 C); the chip has {config.ext_mem_bytes:,} "
                         f"(ChipConfig.ext_mem_bytes)")


def check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def _out_dtype(out_dtype):
    try:
        dtype = np.dtype(out_dtype)
    except TypeError:
        dtype = None
    if dtype not in (np.dtype(np.float32), np.dtype(bfloat16)):
        raise TypeError(f"out_dtype must be np.float32 or ml_dtypes.bfloat16, not {out_dtype!r}")
    return dtype


@dataclass
class MatmulCall:
    """One user matmul as the compiler will see it: its ops (several when K is
    split), the output tensor, and every device tensor its ops read or write
    (the caller's and the runtime's temporaries): they are kept alive until it
    has run, and checked before a recorded program runs again."""
    ops: list
    out: DeviceTensor
    macs: int
    keep: list = field(default_factory=list)
    extra: DeviceTensor = None       # the bf16 copy a fused epilogue writes besides out

    @property
    def outputs(self):
        return [self.out] + ([self.extra] if self.extra is not None else [])

    def check_alive(self):
        for tensor in self.keep:
            tensor._alive(rerun=True)


def _device_operand(chip, x, name, dtype):
    """`x` as a 2-D device tensor of `dtype`: ndarrays are uploaded (a
    temporary), device tensors are checked."""
    if isinstance(x, DeviceTensor):
        if x.chip is not chip:
            raise ValueError(f"{name} is a device tensor of another chip")
        x._alive()
        if x.dtype != np.dtype(dtype):
            hint = " (upload it with dtype=ml_dtypes.bfloat16)" if dtype == bfloat16 else ""
            raise TypeError(f"{name} must be a {np.dtype(dtype).name} device tensor, not "
                            f"{x.dtype.name}{hint}")
        return _as_row(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or a DeviceTensor, not {type(x).__name__}")
    if x.dtype != bfloat16 and x.dtype.type not in _FLOATS:
        raise TypeError(f"{name} must be a float array (bfloat16, float16/32/64), not {x.dtype}")
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, not {x.ndim}-D with shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name} has an empty dimension: shape {x.shape}")
    return _as_row(chip.upload(x, dtype=dtype))


def _as_row(t):
    """A 1-D tensor as its 2-D, one-row self."""
    if t.ndim == 2:
        return t
    return DeviceTensor(t.chip, t._block, t.addr, (1, t.cols), t.dtype, t.stride)


def prepare_matmul(chip, A, B, bias=None, out_dtype=np.float32, relu=False, out=None, then=None,
                   **then_operands):
    """Check everything and build the `MatmulCall` for ``relu?(A @ B + bias)``,
    or with `then` for that layer op on its fp32 result (`prepare_then`)."""
    relu = check_flag(relu, "relu")
    if then is None and then_operands:
        raise TypeError(f"{', '.join(sorted(then_operands))} go with then= (a layer op after "
                        f"the matmul)")
    dtype = _out_dtype(out_dtype)
    for name, x in (("A", A), ("B", B)):
        if isinstance(x, np.ndarray) and x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, not {x.ndim}-D with shape {x.shape}")
        if isinstance(x, DeviceTensor) and x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, not shape {x.shape}")
    a = _device_operand(chip, A, "A", bfloat16)
    b = _device_operand(chip, B, "B", bfloat16)
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {a.shape}, B is {b.shape}")
    temps = [a, b]
    bias_t = None
    if bias is not None:
        shape = bias.shape
        if shape not in ((N,), (1, N), (M, N)):
            raise ValueError(f"bias must have shape ({N},) or ({M}, {N}), not {shape}")
        bias_t = _device_operand(chip, bias, "bias", np.float32)
        temps.append(bias_t)
    if out is not None:
        if not isinstance(out, DeviceTensor):
            raise TypeError(f"out must be a DeviceTensor, not {type(out).__name__}")
        if out.chip is not chip:
            raise ValueError("out is a device tensor of another chip")
        out._alive()
        shape = (N, M) if then == "transpose" else (M, N)
        if out.shape != shape:
            raise ValueError(f"out must have shape {shape}, not {out.shape}")
        if np.dtype(out_dtype) != np.dtype(np.float32) and out.dtype != dtype:
            raise TypeError(f"out is {out.dtype.name} but out_dtype is {dtype.name}")
        dtype = out.dtype
        c = out
    else:
        c = chip.empty((N, M) if then == "transpose" else (M, N), dtype)
    if then is not None:
        return prepare_then(chip, a, b, bias_t, c, relu, temps, then, **then_operands)
    ops = _split_k(chip, a, b, bias_t, c, relu, temps)
    return MatmulCall(ops, c, M * K * N, temps + [c])


def _then_tensor(chip, x, name, shape):
    if not isinstance(x, DeviceTensor):
        raise TypeError(f"{name} must be a float32 DeviceTensor of shape {shape}, "
                        f"not {type(x).__name__}")
    if x.chip is not chip:
        raise ValueError(f"{name} is a device tensor of another chip")
    x._alive()
    if x.dtype != np.dtype(np.float32) or x.shape != shape:
        raise ValueError(f"{name} must be a float32 device tensor of shape {shape}, not "
                         f"{x.dtype.name} {x.shape}")
    return x


def prepare_then(chip, a, b, bias, c, relu, temps, then, out_bf16=None, other=None, params=None,
                 scale=1.0, eps=0.0):
    """A matmul followed by the layer op `then` on its fp32 result: one op
    with a fused `Epilogue` when the chip holds its buffers, else the matmul
    into an fp32 temporary and a `VectorOp` -- the same bits either way
    (docs/vpu.md, "Fused epilogues")."""
    config = chip.config
    if not config.vpu:
        raise ValueError("then= needs a chip with the vector unit: ChipConfig(vpu=True)")
    if then not in EPILOGUE_KINDS:
        raise ValueError(f"then must be one of {EPILOGUE_KINDS}, not {then!r}")
    if relu:
        raise ValueError("relu and then= do not combine")
    (M, K), N = a.shape, b.shape[1]
    width = -(-N // config.cols) * config.cols
    shapes = epilogue_operands(then, M, N, config.cols, bias=then != "softmax" or other is not None)
    if then == "transpose" and (c.dtype != np.dtype(bfloat16) or out_bf16 is not None):
        raise ValueError("then='transpose' writes the bf16 transpose: out_dtype=bfloat16 (or a "
                         "bfloat16 out of shape (N, M)) and no out_bf16")
    given = {"other": other, "params": params}
    tensors = {}
    for name, x in given.items():
        if name in shapes:
            tensors[name] = _then_tensor(chip, x, name, shapes[name])
        elif x is not None:
            raise ValueError(f"then={then!r} takes no {name}")
    if out_bf16 is not None:
        if not isinstance(out_bf16, DeviceTensor) or out_bf16.dtype != np.dtype(bfloat16) \
                or out_bf16.shape != (M, N):
            raise ValueError(f"out_bf16 must be a bfloat16 device tensor of shape ({M}, {N})")
        out_bf16._alive()
        if c.dtype != np.dtype(np.float32):
            raise ValueError("out_bf16 is the bf16 copy of an fp32 out; out is already bfloat16")
    operands = {k: t.operand() for k, t in tensors.items()}
    keep = temps + list(tensors.values()) + [c] + ([out_bf16] if out_bf16 is not None else [])
    ep = Epilogue(then, out_bf16.operand() if out_bf16 is not None else None, scale=float(scale),
                  eps=float(eps), **operands)
    op = MatmulOp(a.operand(), b.operand(), c.operand(), bias.operand() if bias else None,
                  False, ep)
    op.check(config)
    if plan_op(config, M, K, N, op.bias_kind, epilogue=then):
        return MatmulCall([op], c, M * K * N, keep, out_bf16)
    # Unfused: the same op sequence on the fp32 result in external memory.
    r = chip.empty((M, N), np.float32)
    ops = _split_k(chip, a, b, bias, r, False, keep)
    if then == "transpose":
        vector = VectorOp("copy", r.operand(), out_t=c.operand(), scale=float(scale))
        vector.check(config)
        return MatmulCall(ops + [vector], c, M * K * N, keep + [r])
    if then == "softmax" and other is None:
        # The unfused softmax takes a bias: a row of zeros masks nothing.
        zeros = chip.upload(np.zeros((1, width), np.float32))
        operands["other"] = zeros.operand()
        keep.append(zeros)
    fp32 = c.dtype == np.dtype(np.float32)
    bf = out_bf16 if fp32 else c
    vector = VectorOp(then, r.operand(), out=c.operand() if fp32 else None,
                      out_bf16=bf.operand() if bf is not None else None,
                      other=operands.get("params") if then == "layer_norm" else operands.get("other"),
                      params=operands.get("params") if then == "add_layer_norm" else None,
                      group=M, scale=float(scale), eps=float(eps))
    vector.check(config)
    return MatmulCall(ops + [vector], c, M * K * N, keep + [r], out_bf16)


def _split_k(chip, a, b, bias, c, relu, temps):
    """One op, or one per K chunk when the chip cannot hold a block's whole K:
    chunks of whole K tiles, each seeded with the previous one's fp32 partial
    sums (the order stays the sequential one of docs/numerics.md)."""
    config = chip.config
    (M, K), N = a.shape, b.shape[1]
    op = MatmulOp(a.operand(), b.operand(), c.operand(), bias.operand() if bias else None, relu)
    op.check(config)
    tiles = -(-K // config.rows)
    if plan_op(config, M, K, N, op.bias_kind):
        return [op]
    fit = min(max_k_tiles(config, M, N, op.bias_kind), max_k_tiles(config, M, N, "matrix"))
    if fit == 0:
        raise ValueError(f"a {M}x{K} @ {K}x{N} matmul does not fit the chip even with one "
                         f"K tile at a time (VMEM {config.vmem_rows} rows, accumulator "
                         f"{config.acc_rows} rows)")
    # Chunks of equal size (a short last chunk streams no better).
    chunks = -(-tiles // fit)
    step = -(-tiles // chunks) * config.rows
    # The partial sums: the output itself when it is fp32 without ReLU.
    if c.dtype == np.dtype(np.float32) and not relu:
        partial = c
    else:
        partial = chip.empty((M, N), np.float32)
        temps.append(partial)
    ops = []
    for k0 in range(0, K, step):
        k1 = min(K, k0 + step)
        last = k1 == K
        seed = bias if k0 == 0 else partial
        ops.append(MatmulOp(a[:, k0:k1].operand(), b[k0:k1].operand(),
                            (c if last else partial).operand(),
                            seed.operand() if seed is not None else None, relu and last))
    return ops
