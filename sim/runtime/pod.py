"""`Pod`: several simulated chips, each a Ray actor in a process of its own
(docs/pod.md).

`Pod` is the face of three parts, each a module of its own:

- its lifetime and faults (`mxu.sim.runtime.pod_chips`): the actors, Ray,
  the deadline on every remote call and the faults it turns into `PodError`;
- its links and lockstep windows (`mxu.sim.runtime.pod_lockstep`): the
  chips' configuration with their links (`pod_config`), and runs in lockstep
  windows that carry the links' flits and credits between the chips
  (`Pod.run`);
- its work (`mxu.sim.runtime.pod_work`): the ring collectives
  (`all_reduce`, `reduce_scatter`, `all_gather`) and matmuls sharded over M,
  N or K; with `map`, the models above the runtime run their shards on the
  chips (`mxu.sim.models.parallel`, `SentenceEncoder(pod=...)`).

>>> with Pod(4) as pod:
...     C = pod.matmul(A, B, shard="k")        # == the golden pod form, bit for bit
...     pod.last_stats.busbw_fraction          # the all-reduce's busbw over a link's

Ray is imported only when a pod is built, so that ``import mxu.sim`` stays
fast for everyone who never builds one.
"""

from mxu.hdl import ChipConfig

from ..driver.chip import check_flag, check_integer
from .pod_chips import DEFAULT_TIMEOUT, KILL_TIMEOUT, START_TIMEOUT, ChipActor, PodChips, PodError
from .pod_lockstep import TOPOLOGIES, Lockstep, PodRun, check_shape, check_topology, pod_config, ring_peers
from .pod_work import (SHARDS, Collectives, PodStats, busbw, k_partials, link_bandwidth,
                       sharded_matmul)

__all__ = ["Pod", "PodError", "PodRun", "PodStats", "ChipActor", "pod_config", "ring_peers", "TOPOLOGIES", "SHARDS",
           "DEFAULT_TIMEOUT", "START_TIMEOUT", "KILL_TIMEOUT", "busbw", "link_bandwidth"]


class Pod:
    """`n_chips` simulated chips, each a Ray actor (`ChipActor`) in a process
    of its own, driven together.

    Parameters
    ----------
    n_chips : int
        Chips in the pod, >= 1. In messages a chip is named by its 0-based
        index: "chip 1 of 2" is the second.
    config : ChipConfig or None
        Every chip's configuration, to which `pod_config` adds the links;
        None: the "pod" preset (16x16 with the vector unit, a 64-byte bus).
    topology : str
        "ring" or "torus2d": how the chips' links connect them (`ring_peers`;
        the collectives run on a ring).
    shape : tuple or None
        A ring: None or ``(n_chips,)``. A 2-D torus: ``(x, y)`` with
        ``x * y == n_chips`` (required).
    link_bytes_per_cycle, link_latency : int
        Each link's bandwidth and latency in cycles (docs/pod.md); the chips
        advance in lockstep windows of `link_latency` cycles.
    address : str or None
        A Ray cluster to join (``"auto"``, ``"ray://head:10001"``, ...). None:
        ``RAY_ADDRESS`` when it is set, otherwise Ray starts embedded on this
        machine. A Ray that is already initialised is used as it is. Workers
        on other nodes need mxu installed.
    fast_mac : bool
        Passed to every `Chip`: the C++ model of the PE grid (same bits, same
        cycles).

    Interface: ``matmul(A, B, shard)``; ``all_reduce``, ``reduce_scatter``,
    ``all_gather`` (``last_stats``: a `PodStats`); ``run(programs, ...)``;
    ``map(fn, args, what)``; ``close()`` (also by ``with`` and,
    best effort, on garbage collection) kills the actors and shuts down a Ray
    that a pod started once no pod uses it; ``len(pod)``, ``n_chips``,
    ``config``, ``topology``, ``shape``, ``pids`` (the actors' process ids on
    their nodes); ``timeout``, the seconds each call may take (default
    `DEFAULT_TIMEOUT`). Every remote call goes through `PodChips.gather`: an
    actor that dies or misses the deadline raises `PodError` naming the chip
    and closes the pod. Exceptions a chip raises itself (a bad dtype, a
    `ChipError`) come back as they are, with a note naming the chip, and the
    pod stays open. The pod is driven from one thread.
    """

    def __init__(self, n_chips, config=None, topology="ring", shape=None, link_bytes_per_cycle=64,
                 link_latency=500, address=None, fast_mac=True):
        # Everything is checked before Ray is touched, so that a typo costs no
        # processes.
        self._chips = None
        self.n_chips = check_integer(n_chips, "n_chips", 1)
        if config is not None and not isinstance(config, ChipConfig):
            raise TypeError(f"config must be a ChipConfig or None, not {type(config).__name__}")
        self.topology = check_topology(topology)
        self.shape = check_shape(shape, self.topology, self.n_chips)
        self.link_bytes_per_cycle = check_integer(link_bytes_per_cycle, "link_bytes_per_cycle", 1)
        self.link_latency = check_integer(link_latency, "link_latency", 1)
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a Ray address such as 'auto' or "
                            f"'ray://head:10001', or None, not {address!r}")
        self.fast_mac = check_flag(fast_mac, "fast_mac")
        self.config = pod_config(config, self.topology, self.link_bytes_per_cycle,
                                 self.link_latency)
        self.peers = ring_peers(self.n_chips, self.topology, self.shape)
        self.last_stats = None
        self._chips = PodChips(self.n_chips, self.config, self.fast_mac)
        self._lockstep = Lockstep(self._chips, self.peers, self.link_latency,
                                  self.link_bytes_per_cycle)
        self._collectives = Collectives(self._chips, self._lockstep, self.topology)
        self._chips.start(address)

    # ---- lifetime (pod_chips) -----------------------------------------------------------
    def close(self):
        """Kill the chips' actors and wait until Ray has seen them go; shut Ray
        down when a pod started it and no other pod is open. Idempotent."""
        if self._chips is not None:
            self._chips.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Best effort: at interpreter exit Ray may already be gone (and
        # kills its workers itself).
        try:
            self.close()
        except Exception:
            pass

    def __len__(self):
        return self.n_chips

    def __repr__(self):
        c = self.config
        where = "closed" if self._chips.closed else "open"
        return (f"Pod({self.n_chips} chips, {self.topology} {'x'.join(map(str, self.shape))}, "
                f"{c.rows}x{c.cols}{' vpu' if c.vpu else ''} chips, "
                f"{'fast MAC' if self.fast_mac else 'RTL'}, {where})")

    @property
    def timeout(self):
        """Seconds each chip may take to answer one call (`DEFAULT_TIMEOUT`)."""
        return self._chips.timeout

    @timeout.setter
    def timeout(self, seconds):
        self._chips.timeout = seconds

    @property
    def pids(self):
        """The actors' process ids on their nodes."""
        return self._chips.pids

    @property
    def started_ray(self):
        """Whether this pod started Ray (then the last pod to close shuts it down)."""
        return self._chips.started_ray

    def map(self, fn, args, what):
        """``[fn(actor_i, *args[i]) for each chip i]``, run on the chips' actors
        in parallel (`ChipActor.apply`): how a model layered above the
        runtime runs its shards. `fn` must be a module-level function."""
        self._chips.check_open()
        if len(args) != self.n_chips:
            raise ValueError(f"map takes one argument tuple per chip ({self.n_chips}), "
                             f"not {len(args)}")
        return list(self._chips.each(what, "apply", [(fn, *a) for a in args]).values())

    # ---- programs in lockstep windows (pod_lockstep) ------------------------------------
    def run(self, programs, images=None, reads=None, *, max_cycles=50_000_000):
        """Run one program per chip (`programs[i]`, a `Program` or bytes, with
        memory image `images[i]`) together, carrying the links' traffic between
        lockstep windows of ``link_latency`` cycles (docs/pod.md). Returns a
        `PodRun`: each chip's error and counters, the bytes at ``reads[i]``
        ([(address, bytes)]) of its memory afterwards, and the link activity.

        Deterministic: the chips see every flit and credit at the cycle the
        link model gives it, however Ray schedules them. A run that has not
        ended after `max_cycles` is stopped: every chip is reset (links
        included) and `PodError` is raised; the pod stays usable."""
        return self._lockstep.run(programs, images, reads, max_cycles)

    # ---- collectives (pod_work) ---------------------------------------------------------
    def all_reduce(self, xs, bidirectional=False):
        """The element-wise sum of the chips' arrays `xs` (one float32 array
        per chip, all one shape), computed by a ring all-reduce on the chips
        (`mxu.sim.compiler.collectives`: chunk ``c`` summed in ring order
        from chip ``c``). Returns an array (n_chips, *shape): every chip's
        copy of the result. ``last_stats`` holds the run and its busbw.

        `bidirectional`: half the message goes each way round the ring, in its
        own fixed order (``golden.ring_reduce(..., bidirectional=True)``).
        It pays where a link is slower than a chip's DMA beat: a chip's SENDs
        share its store DMA, which one direction of links as fast as it
        already fills (docs/pod.md)."""
        bidirectional = check_flag(bidirectional, "bidirectional")
        result, self.last_stats = self._collectives.all_reduce(xs, bidirectional)
        return result

    def reduce_scatter(self, xs):
        """The ring reduce-scatter of the chips' arrays `xs` (as `all_reduce`):
        returns a list, chip i's part of the sum, which is chunk ``(i + 1) mod
        n`` of the flattened arrays (`mxu.sim.compiler.collectives.chunks` of
        its rows of ``config.cols``), flattened; zero padding dropped."""
        parts, self.last_stats = self._collectives.reduce_scatter(xs)
        return parts

    def all_gather(self, xs):
        """Every chip's copy of all the chips' arrays `xs` (one float32 array
        per chip, all one shape), gathered by a ring all-gather on the chips:
        an array (n_chips, n_chips, *shape), ``[j, i]`` chip i's array as chip
        j holds it."""
        result, self.last_stats = self._collectives.all_gather(xs)
        return result

    # ---- sharded matmuls (pod_work) -----------------------------------------------------
    def matmul(self, A, B, shard="m"):
        """``A @ B`` on the pod's chips, bit-exact to one chip's
        ``Chip.matmul(A, B)`` (and so to ``golden.matmul(A, B,
        rows=config.rows)``).

        A (M x K) and B (K x N) are float ndarrays (rounded to bf16 on the
        chips); device tensors belong to one chip and are not taken. `shard`:
        "m" splits the rows of A as evenly as possible (the first chips take
        one more), every chip gets all of B; "n" splits the columns of B and
        every chip gets all of A. Every output element is one chip's, summed
        over K in the same order, hence the same bits. With fewer rows (or
        columns) than chips, the chips past them are idle for this call.
        "k" splits K: chip i computes ``A[:, K_i] @ B[K_i]`` and a ring
        all-reduce on the chips sums the partial products in ring order
        (`all_reduce`): bit-exact to the golden pod form, ``ring_reduce`` of
        the chips' ``golden.matmul`` partials (a chip without a share of K
        contributes zeros). Returns an (M, N) float32 array; after "k",
        ``last_stats`` holds the all-reduce's cost and ``last_matmul_cycles``
        the slowest chip's matmul.
        """
        self._chips.check_open()
        if shard not in SHARDS:
            raise ValueError(f"shard must be one of {', '.join(map(repr, SHARDS))}, not {shard!r}")
        if shard == "k":
            partials, self.last_matmul_cycles = k_partials(self._chips, A, B)
            return self.all_reduce(partials)[0]
        return sharded_matmul(self._chips, A, B, shard)
