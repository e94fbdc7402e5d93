"""NumPy dtypes of the chip's number formats, for every layer above the HDL.

The bf16 dtype is `ml_dtypes.bfloat16`; its float32 -> bf16 cast rounds to
nearest even, keeps subnormals and overflows to infinity, as the chip's
conversion does (docs/numerics.md).
"""

import ml_dtypes
import numpy as np

__all__ = ["bfloat16", "as_bf16"]

bfloat16 = ml_dtypes.bfloat16


def as_bf16(x):
    """Any float array -> ml_dtypes.bfloat16 (float32 and wider rounded to nearest-even)."""
    x = np.asarray(x)
    if x.dtype == bfloat16:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"expected a floating-point array, not {x.dtype}")
    return x.astype(np.float32).astype(bfloat16)
