"""The work a pod does (docs/pod.md): the ring collectives (`Collectives`:
``all_reduce``, ``reduce_scatter``, ``all_gather`` and what each cost, a
`PodStats`) and matmuls sharded over M or N (`sharded_matmul`) or K
(`k_partials`, then an all-reduce).
"""

from dataclasses import dataclass

import numpy as np

from ..compiler.collectives import chunks
from .matmul import check_matmul_fits
from .tensor import DeviceTensor

__all__ = ["Collectives", "PodStats", "sharded_matmul", "k_partials", "SHARDS", "busbw",
           "link_bandwidth"]

SHARDS = ("m", "n", "k")


@dataclass
class PodStats:
    """What a collective cost: the message's bytes per chip, the chips'
    whole programs (``cycles``: the LOAD of the message, the collective, the
    STORE of the result), the collective's own cycles on the links
    (``link_cycles``: from the first flit sent to the last one received),
    and the bus bandwidth as NCCL defines it (``busbw``, bytes a cycle:
    `busbw`) and as a fraction of a link's bandwidth (``busbw_fraction``:
    over `link_bandwidth`, what one link carries a cycle; a bidirectional
    ring sends on both of a chip's links, so it can pass 1)."""
    kind: str
    nbytes: int
    cycles: int
    link_cycles: int
    busbw: float
    busbw_fraction: float
    bidirectional: bool = False


class Collectives:
    """The ring collectives on a pod's chips (`mxu.sim.compiler.collectives`).

    Parameters
    ----------
    chips : PodChips
        The pod's actors.
    lockstep : Lockstep
        Runs the collective's programs (its link bandwidth is the chips').
    topology : str
        The pod's; the collectives run on a ring only.

    Interface: ``all_reduce(xs, bidirectional)``, ``reduce_scatter(xs)``,
    ``all_gather(xs)``: `xs` one float32 array per chip, all one shape; each
    returns (the result as `Pod`'s method of that name does, its `PodStats`).
    """

    def __init__(self, chips, lockstep, topology):
        self.chips, self.lockstep, self.topology = chips, lockstep, topology
        self.n_chips, self.config = chips.n_chips, chips.config

    def all_reduce(self, xs, bidirectional):
        message, shape, size = self._message(xs, "all_reduce")
        result, run = self._run("all_reduce", message, message.shape[1], bidirectional)
        stats = self._stats("all_reduce", run, 4 * size, bidirectional)
        return result.reshape(self.n_chips, -1)[:, :size].reshape(self.n_chips, *shape), stats

    def reduce_scatter(self, xs):
        message, shape, size = self._message(xs, "reduce_scatter")
        rows, cols = message.shape[1:]
        result, run = self._run("reduce_scatter", message, rows)
        stats = self._stats("reduce_scatter", run, 4 * size)
        parts = []
        for i, (lo, hi) in enumerate(chunks(rows, self.n_chips)):
            owner = (i - 1) % self.n_chips
            parts.append((owner, result[owner, lo:hi].ravel()[:max(0, size - lo * cols)]))
        return [flat for _, flat in sorted(parts)], stats

    def all_gather(self, xs):
        message, shape, size = self._message(xs, "all_gather")
        n, per = self.n_chips, message.shape[1]
        whole = np.zeros((n, n * per, self.config.cols), np.float32)
        for i in range(n):
            whole[i, i * per:(i + 1) * per] = message[i]
        result, run = self._run("all_gather", whole, n * per)
        stats = self._stats("all_gather", run, 4 * size * n)
        out = result.reshape(n, n, -1)[:, :, :size]
        return out.reshape(n, n, *shape), stats

    def _message(self, xs, what):
        """Each chip's array of `xs` as accumulator rows (zero-padded)."""
        xs = [np.asarray(x) for x in xs] if isinstance(xs, (list, tuple)) else list(xs)
        if len(xs) != self.n_chips:
            raise ValueError(f"{what} takes one array per chip ({self.n_chips}), not {len(xs)}")
        shape = xs[0].shape
        for i, x in enumerate(xs):
            if x.dtype != np.float32:
                raise TypeError(f"{what}: chip {i}'s array is {x.dtype}, not float32")
            if x.shape != shape:
                raise ValueError(f"{what}: chip {i}'s array is {x.shape}, chip 0's {shape}")
        cols = self.config.cols
        size = int(np.prod(shape))
        rows = max(1, -(-size // cols))
        flat = np.zeros((self.n_chips, rows * cols), np.float32)
        for i, x in enumerate(xs):
            flat[i, :size] = x.ravel()
        return flat.reshape(self.n_chips, rows, cols), shape, size

    def _run(self, kind, xs, rows, bidirectional=False):
        """Run the ring collective `kind` on message rows `xs` (n, rows, cols)
        fp32; returns (each chip's result rows, the `PodRun`)."""
        if self.topology != "ring":
            raise ValueError(f"the collectives run on a ring; this pod is a {self.topology}")
        self.chips.check_open()
        c, n = self.config, self.n_chips
        outs = self.chips.each(f"the start of {kind}", "begin_collective",
                               [(kind, n, i, np.ascontiguousarray(xs[i]),
                                 self.lockstep.link_bytes_per_cycle, bidirectional)
                                for i in range(n)])
        run = self.lockstep.windows([[outs[i]] for i in range(n)], 50_000_000)
        run.check()
        result = np.stack([np.frombuffer(d[0], np.float32).reshape(rows, c.cols)
                           for d in run.data])
        return result, run

    def _stats(self, kind, run, nbytes, bidirectional=False):
        bw = busbw(kind, nbytes, self.n_chips, run.link_cycles)
        link = link_bandwidth(self.config, self.lockstep.link_bytes_per_cycle)
        return PodStats(kind, nbytes, max(ctr["cycles"] for ctr in run.counters), run.link_cycles,
                        bw, bw / link, bidirectional)


def busbw(kind, nbytes, n_chips, link_cycles):
    """NCCL's bus bandwidth of a ring collective, bytes a cycle: the
    algorithm bandwidth (`nbytes` per chip over `link_cycles`) times ``2 (n-1)
    / n`` for an all-reduce, ``(n-1) / n`` for a reduce-scatter or an
    all-gather: the bytes each chip's link carries, over the time (docs/pod.md,
    "busbw")."""
    n = n_chips
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_gather": (n - 1) / n}[kind]
    return nbytes * factor / link_cycles if link_cycles else 0.0


def link_bandwidth(config, link_bytes_per_cycle):
    """The bytes one link carries a cycle: `link_bytes_per_cycle`, at most one
    flit (``config.link_flit_bytes``) a cycle."""
    return min(link_bytes_per_cycle, config.link_flit_bytes)


def sharded_matmul(chips, A, B, shard):
    """``A @ B`` with the rows of A (`shard` "m") or the columns of B ("n")
    split over the chips (`PodChips`) as evenly as possible, the first chips
    taking one more; the chips past the rows (or columns) are idle."""
    (M, K), (_, N) = _matmul_shapes(A, B)
    pieces = _split(M if shard == "m" else N, chips.n_chips)
    widest = max(hi - lo for lo, hi in pieces)
    check_matmul_fits(chips.config, *((widest, K, N) if shard == "m" else (M, K, widest)))
    import ray
    # The operand every chip needs whole goes into Ray's object store once.
    shared = ray.put(B if shard == "m" else A)
    refs = {}
    for chip, (lo, hi) in enumerate(pieces):
        if hi > lo:
            args = (A[lo:hi], shared) if shard == "m" else (shared, B[:, lo:hi])
            refs[chip] = chips.actors[chip].call.remote("matmul", *args)
    parts = chips.gather(refs, f"matmul shard={shard!r}")
    return np.concatenate([parts[chip] for chip in sorted(parts)], axis=0 if shard == "m" else 1)


def k_partials(chips, A, B):
    """Each chip's partial product ``A[:, K_i] @ B[K_i]`` over its share of K
    (zeros for a chip without one), and the slowest chip's matmul cycles."""
    (M, K), (_, N) = _matmul_shapes(A, B)
    pieces = _split(K, chips.n_chips)
    check_matmul_fits(chips.config, M, max(hi - lo for lo, hi in pieces), N)
    refs = {chip: chips.actors[chip].matmul_cycles.remote(A[:, lo:hi], B[lo:hi])
            for chip, (lo, hi) in enumerate(pieces) if hi > lo}
    parts = chips.gather(refs, "matmul shard='k'")
    slowest = max(cycles for _, cycles in parts.values())
    partials = [parts[chip][0] if chip in parts else np.zeros((M, N), np.float32)
                for chip in range(chips.n_chips)]
    return partials, slowest


def _matmul_shapes(A, B):
    """The shapes of A and B, checked as far as splitting them needs (the
    chips check the rest, dtypes included, with `Chip.matmul`'s messages)."""
    for name, x in (("A", A), ("B", B)):
        if isinstance(x, DeviceTensor):
            raise TypeError(f"{name} must be a numpy array: a device tensor lives on one chip, "
                            f"and a pod's chips do not share memory")
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, not {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, not {x.ndim}-D with shape {x.shape}")
        if 0 in x.shape:
            raise ValueError(f"{name} has an empty dimension: shape {x.shape}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"inner dimensions differ: A is {A.shape}, B is {B.shape}")
    return A.shape, B.shape


def _split(size, parts):
    """``[(lo, hi), ...]``: `size` split into `parts` ranges as even as
    possible, the longer ones first (empty ranges when parts > size)."""
    q, r = divmod(size, parts)
    bounds = np.cumsum([0] + [q + (i < r) for i in range(parts)])
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(parts)]
