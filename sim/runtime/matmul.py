"""``Chip.matmul``: operands checked, the compiler's lowering allocated
(docs/runtime.md). Every choice between programs (a K split, a fused or an
unfused layer op) is the compiler's (`mxu.sim.compiler.lower`); the runtime
turns arrays and tensors into operands and allocates what the lowering asks
for."""

from dataclasses import dataclass, field

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..compiler.epilogue import Epilogue
from ..compiler.layerops import EPILOGUE_KINDS, layer_op
from ..compiler.lower import lower_matmul
from ..compiler.operands import Scatter
from ..driver.chip import check_flag        # the runtime's callers check flags with it too
from .quant import QuantizedTensor
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
    out: object
    macs: int
    keep: list = field(default_factory=list)
    extra: DeviceTensor = None       # the bf16 output a fused epilogue writes besides out

    @property
    def outputs(self):
        outs = self.out if isinstance(self.out, list) else [self.out]
        return outs + ([self.extra] if self.extra is not None else [])

    def check_alive(self):
        for tensor in self.keep:
            tensor._alive(rerun=True)


def _device_operand(chip, x, name, dtype):
    """`x` as a 2-D device tensor of `dtype`: ndarrays are uploaded (a
    temporary), device tensors are checked."""
    _not_quantized(x, name)
    if isinstance(x, DeviceTensor):
        _own(chip, x, name)
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


def _not_quantized(x, name):
    """TypeError naming `x` if it is a `QuantizedTensor`: weights, never
    another operand of a matmul."""
    if isinstance(x, QuantizedTensor):
        role = "the activations A" if name == "A" else name
        raise TypeError(f"{x.name}: a quantized tensor holds weights; it cannot be {role} of a "
                        f"matmul (only its weights B)")


def _own(chip, x, name):
    if x.chip is not chip:
        raise ValueError(f"{name} is a device tensor of another chip")
    x._alive()


def _as_row(t):
    """A 1-D tensor as its 2-D, one-row self."""
    if t.ndim == 2:
        return t
    return DeviceTensor(t.chip, t._block, t.addr, (1, t.cols), t.dtype, t.stride)


def _output(chip, out, shape, dtype, out_dtype_given, transposed):
    """The output: a new tensor, the caller's `out`, or a `Scatter` of the
    caller's pieces ``[(first result row, tensor), ...]``; returns (what the
    call returns, the compiler's operand, tensors to keep)."""
    if out is None:
        c = chip.empty(shape, dtype)
        return c, c.operand(), [c]
    if isinstance(out, DeviceTensor):
        _own(chip, out, "out")
        if out.shape != shape:
            raise ValueError(f"out must have shape {shape}, not {out.shape}")
        if out_dtype_given and out.dtype != dtype:
            raise TypeError(f"out is {out.dtype.name} but out_dtype is {dtype.name}")
        return out, out.operand(), [out]
    if not isinstance(out, (list, tuple)) or not out:
        raise TypeError(f"out must be a DeviceTensor or a list of (row, DeviceTensor) pieces, "
                        f"not {type(out).__name__}")
    pieces, tensors = [], []
    for k, piece in enumerate(out):
        if not (isinstance(piece, tuple) and len(piece) == 2 and isinstance(piece[1], DeviceTensor)):
            raise TypeError(f"out[{k}] must be a (first row, DeviceTensor) pair")
        row, t = piece
        _own(chip, t, f"out[{k}]")
        pieces.append((int(row), t.operand()))
        tensors.append(t)
    scatter = Scatter(tuple(pieces), transposed=transposed)
    scatter.check("out", chip.config.ext_mem_bytes)
    if (scatter.rows, scatter.cols) != shape:
        raise ValueError(f"the pieces of out make a {scatter.rows}x{scatter.cols} result, not "
                         f"{shape[0]}x{shape[1]}")
    return tensors, scatter, tensors


def prepare_matmul(chip, A, B, bias=None, out_dtype=np.float32, relu=False, out=None, then=None,
                   **then_operands):
    """Check everything and build the `MatmulCall` for ``relu?(A @ B + bias)``,
    or with `then` for that layer op on its fp32 result."""
    relu = check_flag(relu, "relu")
    if then is None and then_operands:
        raise TypeError(f"{', '.join(sorted(then_operands))} go with then= (a layer op after "
                        f"the matmul)")
    dtype = _out_dtype(out_dtype)
    for name, x in (("A", A), ("bias", bias), ("out", out), *then_operands.items()):
        _not_quantized(x, name)
    for name, x in (("A", A), ("B", B)):
        if isinstance(x, np.ndarray) and x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, not {x.ndim}-D with shape {x.shape}")
        if isinstance(x, DeviceTensor) and x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, not shape {x.shape}")
    a = _device_operand(chip, A, "A", bfloat16)
    if isinstance(B, QuantizedTensor):
        _own(chip, B, B.name)
        b = B
    else:
        b = _device_operand(chip, B, "B", bfloat16)
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {a.shape}, B is {b.shape}"
                         + (f" ({B.name})" if b is B else ""))
    keep = [a, b]
    bias_t = None
    if bias is not None:
        if bias.shape not in ((N,), (1, N), (M, N)):
            raise ValueError(f"bias must have shape ({N},) or ({M}, {N}), not {bias.shape}")
        bias_t = _device_operand(chip, bias, "bias", np.float32)
        keep.append(bias_t)
    if isinstance(out, DeviceTensor):
        _own(chip, out, "out")
        if np.dtype(out_dtype) != np.dtype(np.float32) and out.dtype != dtype:
            raise TypeError(f"out is {out.dtype.name} but out_dtype is {dtype.name}")
        dtype = out.dtype
    elif isinstance(out, (list, tuple)) and out and isinstance(out[0], tuple) \
            and isinstance(out[0][-1], DeviceTensor):
        dtype = out[0][-1].dtype
    ep, extra, more = None, None, []
    width = N
    if then is not None:
        ep, extra, more = _epilogue(chip, then, relu, M, N, dtype, out, **then_operands)
        width = _paired_width(ep, N, out) if ep.is_paired else N
        keep += more
    transposed = ep is not None and ep.transposed
    shape = (width, M) if transposed else (M, width)
    if transposed and dtype != np.dtype(bfloat16):
        raise ValueError(f"then={then!r} with a transposed result writes bf16: "
                         f"out_dtype=bfloat16 (or a bfloat16 out of shape {shape})")
    result, c, outs = _output(chip, out, shape, dtype, False, transposed)
    lowering = lower_matmul(chip.config, a.operand(), b.operand(), c,
                            bias_t.operand() if bias_t is not None else None, relu, ep)
    scratch = []
    for rows, cols, sdtype, fill in lowering.scratch:
        np_dtype = np.float32 if sdtype == "fp32" else bfloat16
        t = chip.empty((rows, cols), np_dtype) if fill is None else \
            chip.upload(np.full((rows, cols), fill, np_dtype))
        scratch.append(t)
    ops = lowering.build([t.operand() for t in scratch])
    return MatmulCall(ops, result, M * K * N, keep + outs + scratch, extra)


def _paired_width(ep, N, out):
    """A paired epilogue's result width: the caller's out's (its tiles may be
    padded), or half of N."""
    if isinstance(out, DeviceTensor):
        return out.shape[0] if ep.transposed else out.shape[-1]
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], tuple):
        t = out[0][-1]
        return t.shape[0] if ep.transposed else t.shape[-1]
    return N // 2


def _then_tensor(chip, x, name, shape):
    if not isinstance(x, DeviceTensor):
        raise TypeError(f"{name} must be a float32 DeviceTensor of shape {shape}, "
                        f"not {type(x).__name__}")
    _own(chip, x, name)
    if x.dtype != np.dtype(np.float32) or x.shape != shape:
        raise ValueError(f"{name} must be a float32 device tensor of shape {shape}, not "
                         f"{x.dtype.name} {x.shape}")
    return x


def _epilogue(chip, then, relu, M, N, dtype, out, out_bf16=None, other=None, params=None,
              scale=1.0, eps=0.0, transpose=False, paired=False):
    """The `Epilogue` of ``then=`` and its operands, checked: (epilogue, the
    extra output tensor or None, tensors to keep)."""
    config = chip.config
    if not config.vpu:
        raise ValueError("then= needs a chip with the vector unit: ChipConfig(vpu=True)")
    if then not in EPILOGUE_KINDS:
        raise ValueError(f"then must be one of {EPILOGUE_KINDS}, not {then!r}")
    if relu:
        raise ValueError("relu and then= do not combine")
    desc = layer_op(then)
    transpose, paired = check_flag(transpose, "transpose"), check_flag(paired, "paired")
    width = _paired_width(Epilogue(then, paired=paired and desc.may_pair), N, out) \
        if desc.paired or paired else N
    # The shapes of the operands given (None for one that is not a 2-D
    # device tensor: `_then_tensor` names the mistake).
    given = {name: x.shape if isinstance(x, DeviceTensor) and x.ndim == 2 else None
             for name, x in (("other", other), ("params", params)) if x is not None}
    shapes = desc.operands(M, width, config.cols, given)
    if desc.transposes and (dtype != np.dtype(bfloat16) or out_bf16 is not None):
        raise ValueError("then='transpose' writes the bf16 transpose: out_dtype=bfloat16 (or a "
                         "bfloat16 out of shape (N, M)) and no out_bf16")
    tensors = {}
    for name, x in (("other", other), ("params", params)):
        if name in shapes:
            tensors[name] = _then_tensor(chip, x, name, shapes[name])
        elif x is not None:
            raise ValueError(f"then={then!r} takes no {name}")
    if out_bf16 is not None:
        if not isinstance(out_bf16, DeviceTensor) or out_bf16.dtype != np.dtype(bfloat16) \
                or out_bf16.shape != (M, width):
            raise ValueError(f"out_bf16 must be a bfloat16 device tensor of shape ({M}, {width})")
        out_bf16._alive()
        if dtype != np.dtype(np.float32):
            raise ValueError("out_bf16 is the bf16 copy of an fp32 out; out is already bfloat16")
    ep = Epilogue(then, out_bf16.operand() if out_bf16 is not None else None,
                  scale=float(scale), eps=float(eps), transpose=transpose, paired=paired,
                  **{k: t.operand() for k, t in tensors.items()})
    return ep, out_bf16, list(tensors.values()) + ([out_bf16] if out_bf16 is not None else [])
