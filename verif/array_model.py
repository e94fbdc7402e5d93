"""Golden model of the systolic array: what every tile's results must be, bit for bit.

The array computes, for every tile t and activation row i,
``C[t][i, j] = seed[t][i, j] + A[t][i, 0]*W[t][0, j] + ... + A[t][i, rows-1]*W[t][rows-1, j]``
as the sequential fp32 dot product of docs/numerics.md (PE row k adds the k-th
product). That is exactly `mxu.verif.golden.matmul` with ``K == rows`` (no zero
padding), so this module only applies it tile by tile and checks the operands.
"""

import numpy as np

from . import golden

__all__ = ["array_reference", "array_reference_bits"]


def array_reference(A, W, seeds=None, *, rows, cols):
    """``[S_t + A_t @ W_t for each tile t]`` in the order of docs/numerics.md.

    A : list of T arrays (M_t, rows); W : list of T arrays (rows, cols);
    seeds : None (+0.0 seeds) or list of T float32 arrays (M_t, cols).
    Operands are rounded to bf16 as `golden.matmul` does (callers pass bf16
    values). Returns a list of float32 arrays with canonical NaNs.
    """
    if len(A) != len(W):
        raise ValueError(f"A has {len(A)} tiles but W has {len(W)}")
    if seeds is not None and len(seeds) != len(A):
        raise ValueError(f"A has {len(A)} tiles but seeds has {len(seeds)}")
    out = []
    for t, (a, w) in enumerate(zip(A, W)):
        a, w = np.asarray(a), np.asarray(w)
        if a.ndim != 2 or a.shape[1] != rows:
            raise ValueError(f"A[{t}] must have shape (M, {rows}), not {a.shape}")
        if w.shape != (rows, cols):
            raise ValueError(f"W[{t}] must have shape {(rows, cols)}, not {w.shape}")
        seed = None if seeds is None else np.asarray(seeds[t], np.float32)
        out.append(golden.matmul(a, w, seed, rows=rows))
    return out


def array_reference_bits(act, weight, seed, tile_rows, *, rows, cols):
    """The same on bit patterns: act uint16 (N, rows), weight uint16 (T*rows, cols),
    seed uint32 (N, cols), tile_rows the M_t. Returns uint32 (N, cols)."""
    bounds = np.cumsum((0,) + tuple(tile_rows))
    A = [golden.bf16_to_f32(act[a:b]).astype(golden.bf16) for a, b in zip(bounds[:-1], bounds[1:])]
    W = [golden.bf16_to_f32(weight[t * rows:(t + 1) * rows]).astype(golden.bf16)
         for t in range(len(tile_rows))]
    S = [golden.f32_from_bits(seed[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return np.concatenate(array_reference(A, W, S, rows=rows, cols=cols)).view(np.uint32)
