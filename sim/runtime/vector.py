"""``Chip.vector``: the transformer's layer ops on the vector unit, on device
tensors (docs/vpu.md, "Layer programs"). Like a matmul, a vector op runs as a
program of its own, or inside ``with chip.record():`` as part of one program
with the matmuls around it.
"""

from dataclasses import dataclass, field

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..compiler.layerops import VECTOR_KINDS, layer_op
from ..compiler.vectorop import VectorOp
from .tensor import DeviceTensor

__all__ = ["VectorCall", "prepare_vector", "softmax_bias", "layer_norm_params", "rms_norm_params"]


@dataclass
class VectorCall:
    """One vector op as the compiler sees it, its outputs and the tensors it uses."""
    ops: list
    outputs: list
    keep: list = field(default_factory=list)
    macs: int = 0

    @property
    def out(self):
        return self.outputs[0]

    def check_alive(self):
        for tensor in self.keep:
            tensor._alive(rerun=True)


def _tensor(chip, x, name, dtype, shape=None):
    if not isinstance(x, DeviceTensor):
        raise TypeError(f"{name} must be a DeviceTensor, not {type(x).__name__}")
    if x.chip is not chip:
        raise ValueError(f"{name} is a device tensor of another chip")
    x._alive()
    if x.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must be a {np.dtype(dtype).name} device tensor, not {x.dtype.name}")
    if x.ndim != 2 or (shape is not None and x.shape != shape):
        raise ValueError(f"{name} must have shape {shape or '(rows, cols)'}, not {x.shape}")
    return x


def softmax_bias(chip, mask):
    """The bias rows of a softmax on this chip for a (G, n) boolean `mask`
    (True where attending is allowed): 0 or -inf, padded with -inf to whole
    tiles of ``cols`` lanes, as a float32 device tensor."""
    mask = np.asarray(mask, bool)
    cols = chip.config.cols
    width = -(-mask.shape[1] // cols) * cols
    bias = np.full((mask.shape[0], width), -np.inf, np.float32)
    bias[:, :mask.shape[1]] = np.where(mask, 0, -np.inf)
    return chip.upload(bias)


def layer_norm_params(chip, gamma, beta):
    """The (3, n) float32 device tensor of a LayerNorm on the vector unit:
    gamma, beta and a row of ones (whose last tile, loaded with the DMA's zero
    padding, masks the spare lanes of a partial tile)."""
    gamma, beta = np.asarray(gamma, np.float32), np.asarray(beta, np.float32)
    return chip.upload(np.stack([gamma, beta, np.ones_like(gamma)]))


def rms_norm_params(chip, gamma):
    """The (1, n) float32 device tensor of an RMSNorm on the vector unit: gamma."""
    return chip.upload(np.asarray(gamma, np.float32)[None, :])


def prepare_vector(chip, kind, x, *, out=None, out_bf16=None, out_t=None, other=None,
                   params=None, group=1, scale=1.0, eps=0.0):
    """Check the tensors of one vector op and build its `VectorCall` (see
    `mxu.sim.compiler.vectorop.VectorOp` for the kinds and their operands)."""
    if not chip.config.vpu:
        raise ValueError("this chip has no vector unit: make it with ChipConfig(vpu=True)")
    if kind not in VECTOR_KINDS:
        raise ValueError(f"kind must be one of {VECTOR_KINDS}, not {kind!r}")
    x = _tensor(chip, x, "x", np.float32)
    R, n = x.shape
    tensors = {"x": x}
    for name, t, dtype, shape in (("out", out, np.float32, (R, n)),
                                  ("out_bf16", out_bf16, bfloat16, (R, n)),
                                  ("out_t", out_t, bfloat16, (n, R))):
        if t is not None:
            tensors[name] = _tensor(chip, t, name, dtype, shape)
    given = {"other": other, "params": params}
    for name, (label, shape) in layer_op(kind).vector_operands(R, n, chip.config.cols,
                                                               group).items():
        tensors[name] = _tensor(chip, given[name], label, np.float32, shape)
    if out_t is not None and not layer_op(kind).vector_transpose:
        raise ValueError(f"out_t (a transpose) is for kind "
                         f"{[k for k in VECTOR_KINDS if layer_op(k).vector_transpose]}")
    operands = {name: t.operand() for name, t in tensors.items()}
    op = VectorOp(kind, group=group, scale=float(scale), eps=float(eps), **operands)
    op.check(chip.config)
    outputs = [tensors[k] for k in ("out", "out_bf16", "out_t") if k in tensors]
    return VectorCall([op], outputs, list(tensors.values()))
