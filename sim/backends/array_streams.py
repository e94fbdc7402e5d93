"""The four streams of a systolic-array run (activations, seeds, weights,
results) as bit patterns, checked and packed from the user's tiles: what every
array backend feeds in (docs/array.md)."""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["ArrayStreams", "pack_streams"]


@dataclass(frozen=True)
class ArrayStreams:
    """The four streams of one run, as bit patterns.

    act : uint16 (N, rows)     activation beats (bf16)
    first : bool (N,)          ``first`` flag of each activation beat
    seed : uint32 (N, cols)    seed beats (fp32), in lockstep with `act`
    weight : uint16 (T*rows, cols)  weight rows, tile after tile, k = 0 first
    tile_rows : tuple of int   M_t, the activation rows of each tile
    """
    rows: int
    cols: int
    act: np.ndarray
    first: np.ndarray
    seed: np.ndarray
    weight: np.ndarray
    tile_rows: tuple

    @property
    def n(self):
        return self.act.shape[0]

    def split(self, result):
        """Cut an (N, cols) result into one array per tile."""
        bounds = np.cumsum((0,) + self.tile_rows)
        return [result[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    # Packed words, laid out as the Verilog ports (bit 0 = bit 0 of word 0).
    def act_words(self):
        words = -(-(16 * self.rows + 1) // 32)
        packed = np.zeros((self.n, 2 * words), np.uint16)
        packed[:, :self.rows] = self.act
        packed[:, self.rows] = self.first
        return np.ascontiguousarray(packed).view(np.uint32)

    def weight_words(self, weight_rows=1):
        """Weight beats of `weight_rows` rows each (`mxu.hdl.array.WeightBeat`):
        ``ceil(rows / weight_rows)`` beats a tile, its last beat zero-padded."""
        per_beat = weight_rows * self.cols
        words = -(-per_beat // 2)
        beats = -(-self.rows // weight_rows)
        tiles = self.weight.reshape(-1, self.rows, self.cols)
        padded = np.zeros((tiles.shape[0], beats * weight_rows, self.cols), np.uint16)
        padded[:, :self.rows] = tiles
        packed = np.zeros((tiles.shape[0] * beats, 2 * words), np.uint16)
        packed[:, :per_beat] = padded.reshape(-1, per_beat)
        return np.ascontiguousarray(packed).view(np.uint32)

    def seed_words(self):
        return np.ascontiguousarray(self.seed, dtype=np.uint32)


def _bf16_bits(x, what):
    """bf16 bit patterns (uint16) of an ml_dtypes.bfloat16 array, or of a float32
    array whose every value is a bf16 value."""
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return x.view(np.uint16)
    if x.dtype == np.float32:
        bits = x.view(np.uint32)
        bad = np.flatnonzero(bits & 0xFFFF)
        if bad.size:
            i = np.unravel_index(bad[0], x.shape)
            raise ValueError(f"{what} holds float32 values that are not bf16 values "
                             f"(first at index {tuple(map(int, i))}: {x[i]!r}); "
                             f"round them with ml_dtypes.bfloat16 first")
        return (bits >> 16).astype(np.uint16)
    raise TypeError(f"{what} must be an ml_dtypes.bfloat16 or float32 array, not {x.dtype}")


def _tiles(x, name):
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of arrays, one per weight tile, "
                        f"not {type(x).__name__}")
    return list(x)


def pack_streams(A, W, seeds=None, *, rows, cols):
    """Check the operands of `simulate_array` and turn them into `ArrayStreams`."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    A, W = _tiles(A, "A"), _tiles(W, "W")
    if not A:
        raise ValueError("A and W must hold at least one weight tile")
    if len(W) != len(A):
        raise ValueError(f"A has {len(A)} tiles but W has {len(W)}")
    if seeds is not None:
        seeds = _tiles(seeds, "seeds")
        if len(seeds) != len(A):
            raise ValueError(f"A has {len(A)} tiles but seeds has {len(seeds)}")
    acts, firsts, seed_bits, weights, tile_rows = [], [], [], [], []
    for t, (a, w) in enumerate(zip(A, W)):
        a, w = np.asarray(a), np.asarray(w)
        if a.ndim != 2 or a.shape[1] != rows or a.shape[0] < 1:
            raise ValueError(f"A[{t}] must have shape (M, {rows}) with M >= 1, not {a.shape}")
        if w.shape != (rows, cols):
            raise ValueError(f"W[{t}] must have shape {(rows, cols)}, not {w.shape}")
        m = a.shape[0]
        acts.append(_bf16_bits(a, f"A[{t}]"))
        weights.append(_bf16_bits(w, f"W[{t}]"))
        first = np.zeros(m, bool)
        first[0] = True
        firsts.append(first)
        if seeds is None:
            seed_bits.append(np.zeros((m, cols), np.uint32))
        else:
            s = np.asarray(seeds[t])
            if s.dtype != np.float32:
                raise TypeError(f"seeds[{t}] must be a float32 array, not {s.dtype}")
            if s.shape != (m, cols):
                raise ValueError(f"seeds[{t}] must have shape {(m, cols)}, not {s.shape}")
            seed_bits.append(s.view(np.uint32))
        tile_rows.append(m)
    return ArrayStreams(rows=rows, cols=cols, act=np.concatenate(acts), first=np.concatenate(firsts),
                        seed=np.concatenate(seed_bits), weight=np.concatenate(weights),
                        tile_rows=tuple(tile_rows))
