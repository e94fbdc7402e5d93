"""`Pod`: several simulated chips, each a Ray actor in a process of its own
(docs/pod.md).

Here: the actors and their lifetime; the deadline on every remote call and
the faults it turns into `PodError` (`Pod._gather`, the one place results come
back); the chips' configuration with their links (`pod_config`); runs in
lockstep windows that carry the links' flits and credits between the chips
(`Pod.run`); the ring collectives (`all_reduce`, `reduce_scatter`,
`all_gather`); matmuls sharded over M, N or K; and `map`, with which the
models above the runtime run their shards on the chips
(`mxu.sim.models.parallel`, `SentenceEncoder(pod=...)`).

>>> with Pod(4) as pod:
...     C = pod.matmul(A, B, shard="k")        # == the golden pod form, bit for bit
...     pod.last_stats.busbw_fraction          # the all-reduce's busbw over a link's

Ray is imported only when a pod is built, so that ``import mxu.sim`` stays
fast for everyone who never builds one.
"""

import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from mxu.hdl import ChipConfig

from ..compiler.collectives import chunks, ring_collective_program
from ..driver.chip import ChipError, _integer, _library
from .chip import Chip
from .matmul import check_flag, check_matmul_fits
from .tensor import DeviceTensor

__all__ = ["Pod", "PodError", "PodRun", "PodStats", "ChipActor", "pod_config", "ring_peers", "TOPOLOGIES", "SHARDS",
           "DEFAULT_TIMEOUT", "START_TIMEOUT", "KILL_TIMEOUT"]

TOPOLOGIES = ("ring", "torus2d")
SHARDS = ("m", "n", "k")

# Seconds a chip has to answer one call before the pod gives up on it (the
# `Pod.timeout` attribute overrides it per pod). A call is a window, a matmul
# or one batch of a model: long enough for a 32-sentence MiniLM batch on one
# simulated chip (several minutes). A stuck chip is caught by the chip's own
# watchdog first and comes back as a ChipError; a dead actor is reported at
# once; only a process that stops answering waits for this.
DEFAULT_TIMEOUT = 600.0
# Starting a chip may build its Verilated model: minutes on a node whose
# ~/.cache/mxu has not seen the configuration (the pod builds it on this
# machine first, so local actors only load it).
START_TIMEOUT = 600.0
# How long close() waits for Ray to confirm that the killed actors are gone.
# Ray gives a process that does not answer (stopped, say) a few seconds of
# grace before its raylet kills it for good.
KILL_TIMEOUT = 15.0

# Whether a Pod called ray.init (then the last pod to close shuts Ray down;
# a Ray the user started is theirs), and how many pods are open.
_ray_state = {"owned": False, "open_pods": 0, "reaper": None}


class PodError(RuntimeError):
    """A chip of a pod died or did not answer in time. The pod has killed all
    its actors and is closed; build a new `Pod`. `chip` is the failed chip's
    index (0-based, as in "chip 1 of 2"), or None when the pod was used after
    it was closed."""

    def __init__(self, message, chip=None):
        super().__init__(message)
        self.chip = chip


def pod_config(config, topology, link_bytes_per_cycle=64, link_latency=500):
    """The `ChipConfig` every chip of a pod gets: `config` (default: the "pod"
    preset, a vpu chip with a 64-byte bus) with the links its topology needs
    (2 for a ring, 4 for a 2-D torus) and enough credits per link to keep
    it busy over a round trip of ``2 * link_latency`` cycles."""
    base = config if config is not None else ChipConfig.preset("pod")
    links = {"ring": 2, "torus2d": 4}[topology]
    flit = base.link_flit_bytes
    rate = min(link_bytes_per_cycle, flit) / flit        # flits a cycle
    needed = int(np.ceil(2 * link_latency * rate)) + 16     # and a few cycles inside the chips
    credits = max(base.link_credits, 1 << max(1, (needed - 1).bit_length()))
    return base.replace(links=links, link_credits=min(credits, 1 << 16))


def ring_peers(n, topology="ring", shape=None):
    """``{(chip, link): (chip, link)}``: where each link's flits go. A ring
    sends on link 0 to chip ``i + 1``'s link 1; a 2-D torus ``(x, y)``
    (chip ``a + x * b``) adds link 2 to ``(a, b + 1)``'s link 3."""
    peers = {}
    if topology == "ring":
        for i in range(n):
            j = (i + 1) % n
            peers[(i, 0)], peers[(j, 1)] = (j, 1), (i, 0)
        return peers
    x, y = shape
    for b in range(y):
        for a in range(x):
            i = a + x * b
            right, down = (a + 1) % x + x * b, a + x * ((b + 1) % y)
            peers[(i, 0)], peers[(right, 1)] = (right, 1), (i, 0)
            peers[(i, 2)], peers[(down, 3)] = (down, 3), (i, 2)
    return peers


class ChipActor:
    """One chip of a pod, run by Ray in a worker process of its own.

    It holds a runtime `Chip(config, fast_mac=fast_mac)` and offers remote
    methods: ``call(method, *args, **kwargs)`` calls a public method of that
    chip and returns its result; ``pid()`` its process id; ``apply(fn,
    *args)`` runs a higher layer's work on it (`Pod.map`); ``begin``,
    ``begin_collective``, ``window``, ``end`` and ``abort`` run a program in
    the pod's lockstep windows. The pod makes it a Ray actor with
    ``ray.remote(ChipActor)``; plain, it is an ordinary class (its module is
    importable in every worker, so Ray ships it by name).
    """

    def __init__(self, config, fast_mac):
        # One thread each: the pod's chips already run side by side.
        self.chip = Chip(config, fast_mac=fast_mac, threads=1)

    def pid(self):
        return os.getpid()

    def call(self, method, *args, **kwargs):
        if method.startswith("_"):
            raise ValueError(f"ChipActor.call reaches public Chip methods only, not {method!r}")
        return getattr(self.chip, method)(*args, **kwargs)

    # A run in lockstep windows (docs/pod.md). Cycles crossing the actor's
    # boundary are the pod's: counted from the run's start, which is this
    # chip's `base`.
    def apply(self, fn, *args):
        """``fn(actor, *args)``: work a higher layer ships to this chip (a
        model's shard, `Pod.map`); `fn` must be importable by name."""
        return fn(self, *args)

    def matmul_cycles(self, A, B):
        """``Chip.matmul(A, B)`` and its cycles."""
        C = self.chip.matmul(A, B)
        return C, self.chip.last_stats.cycles

    def begin(self, program, image, bytes_per_cycle):
        """Start `program` (addresses are the caller's business, as with
        ``Chip.run(base=...)``)."""
        device = self.chip.device
        device.set_link_bandwidth(bytes_per_cycle)
        self.blocks = []
        device.start(program, image)
        self.base = device.cycle

    def begin_collective(self, kind, n, index, message, bytes_per_cycle, bidirectional=False):
        """Start the ring collective `kind` on `message` (rows x cols fp32),
        in external memory the chip's allocator hands out, so that no tensor
        of the chip's runtime is overwritten. Returns the (address, bytes) of
        the result for `end`."""
        chip, rows = self.chip, len(message)
        nbytes = message.nbytes
        blocks = [chip._allocator.alloc(nbytes, f"a {kind}'s message") for _ in range(2)]
        program = ring_collective_program(chip.config, kind, n=n, index=index, rows=rows,
                                             ext_in=blocks[0].addr, ext_out=blocks[1].addr,
                                             bidirectional=bidirectional)
        code = program.to_bytes()
        blocks.append(chip._allocator.alloc(len(code), "a collective's program", top=True))
        try:
            chip.device.set_link_bandwidth(bytes_per_cycle)
            chip.device.start(code, {blocks[0].addr: message}, base=blocks[2].addr)
        except BaseException:
            for block in blocks:
                block.free()
            raise
        self.blocks, self.base = blocks, chip.device.cycle
        return blocks[1].addr, nbytes

    def window(self, cycles, inbound):
        """Present `inbound` ({link: (flit cycles, flits, credit cycles)}), clock
        `cycles`, and return (what each link sent, whether the run is done,
        flits and credits not yet presented)."""
        device = self.chip.device
        for link, (at, flits, credits) in inbound.items():
            device.link_give(link, at + self.base, flits, credits + self.base)
        device.clock(cycles)
        sent = {}
        for link in range(device.config.links):
            at, flits, credits = device.link_take(link)
            if len(at) or len(credits):
                sent[link] = (at - self.base, flits, credits - self.base)
        waiting = sum(device.link_arriving(link) for link in range(device.config.links))
        return sent, device.done, waiting

    def end(self, reads):
        """The run's `RunResult` (error name, counters) and the bytes at
        `reads` ([(address, bytes)]) of external memory."""
        try:
            result = self.chip.device.finish()
            data = [self.chip.device.read_memory(addr, n) for addr, n in reads]
        finally:
            self._free()
        return result.error.name, result.counters, data

    def abort(self):
        self._free()
        self.chip.device.reset()

    def _free(self):
        for block in getattr(self, "blocks", []):
            block.free()
        self.blocks = []


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
    `DEFAULT_TIMEOUT`). Every remote call goes through `_gather`: an actor
    that dies or misses the deadline raises `PodError` naming the chip and
    closes the pod. Exceptions a chip raises itself (a bad dtype, a
    `ChipError`) come back as they are, with a note naming the chip, and the
    pod stays open. The pod is driven from one thread.
    """

    def __init__(self, n_chips, config=None, topology="ring", shape=None, link_bytes_per_cycle=64,
                 link_latency=500, address=None, fast_mac=True):
        # Everything is checked before Ray is touched, so that a typo costs no
        # processes.
        self._closed, self._counted, self._actors, self._failure = False, False, [], None
        self.n_chips = _integer(n_chips, "n_chips", 1)
        if config is not None and not isinstance(config, ChipConfig):
            raise TypeError(f"config must be a ChipConfig or None, not {type(config).__name__}")
        self.topology = _check_topology(topology)
        self.shape = _check_shape(shape, self.topology, self.n_chips)
        self.link_bytes_per_cycle = _integer(link_bytes_per_cycle, "link_bytes_per_cycle", 1)
        self.link_latency = _integer(link_latency, "link_latency", 1)
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a Ray address such as 'auto' or "
                            f"'ray://head:10001', or None, not {address!r}")
        self.fast_mac = check_flag(fast_mac, "fast_mac")
        self.config = pod_config(config, self.topology, self.link_bytes_per_cycle,
                                 self.link_latency)
        self.peers = ring_peers(self.n_chips, self.topology, self.shape)
        self.last_stats = None
        self.timeout = DEFAULT_TIMEOUT
        self.pids = []
        self._build_here()
        self.started_ray = _start_ray(self.n_chips, address)
        _ray_state["open_pods"] += 1
        self._counted = True
        self._start_actors()

    # ---- lifetime -----------------------------------------------------------------------
    def _build_here(self):
        """Build (or find in ~/.cache/mxu) the chips' Verilated model in this
        process, so that a first build prints its progress here instead of in
        a worker's log, and local actors only load it. Only the library: a
        chip instance would allocate its whole external memory here."""
        _library(self.config, None, self.fast_mac, False, False)

    def _start_actors(self):
        import ray
        # Each chip is a single-threaded simulation that the OS schedules; Ray's
        # CPU accounting would only refuse pods with more chips than cores (a
        # legitimate simulation), so the actors ask for none. SPREAD puts them
        # on as many nodes of a cluster as there are.
        remote = ray.remote(ChipActor).options(num_cpus=0, scheduling_strategy="SPREAD",
                                               max_restarts=0)
        self._actors = [remote.remote(self.config, self.fast_mac) for _ in range(self.n_chips)]
        pids = self._gather({i: a.pid.remote() for i, a in enumerate(self._actors)},
                            "start-up", timeout=START_TIMEOUT)
        self.pids = [pids[i] for i in range(self.n_chips)]

    def close(self):
        """Kill the chips' actors and wait until Ray has seen them go; shut Ray
        down when a pod started it and no other pod is open. Idempotent."""
        if self._closed:
            return
        self._closed = True
        actors, self._actors = self._actors, []
        _kill(actors)
        if self._counted:
            self._counted = False
            _ray_state["open_pods"] -= 1
            _release_ray()

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
        where = "closed" if self._closed else "open"
        return (f"Pod({self.n_chips} chips, {self.topology} {'x'.join(map(str, self.shape))}, "
                f"{c.rows}x{c.cols}{' vpu' if c.vpu else ''} chips, "
                f"{'fast MAC' if self.fast_mac else 'RTL'}, {where})")

    # ---- remote calls -------------------------------------------------------------------
    @property
    def timeout(self):
        """Seconds each chip may take to answer one call (`DEFAULT_TIMEOUT`)."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {seconds!r}")
        if not seconds > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {seconds!r}")
        self._timeout = float(seconds)

    def _check_open(self):
        if self._closed:
            reason = f" after {self._failure}" if self._failure else ""
            raise PodError(f"the pod is closed{reason}; build a new Pod")

    def _gather(self, refs, what, timeout=None):
        """The results of `refs` (``{chip index: ObjectRef}``), as ``{chip
        index: result}``, within `timeout` seconds (default ``self.timeout``)
        from now. Refs are awaited one by one, so that a failure names its
        chip: an actor that died or missed the deadline closes the pod and
        raises `PodError`. Exceptions raised by the chips themselves are
        re-raised as they are (the lowest chip's) once all have answered."""
        import ray
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pending = {ref: chip for chip, ref in refs.items()}
        results, raised = {}, {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                late = sorted(pending.values())
                self._fail(late[0], f"{_chips(late, self.n_chips)} did not answer within "
                                    f"{timeout:g} s during {what}")
            chip = pending.pop(ready[0])
            try:
                results[chip] = ray.get(ready[0], timeout=0)
            except ray.exceptions.RayTaskError as err:
                raised[chip] = err
            except ray.exceptions.RayError as err:
                # RayActorError and its kin: the process is gone (or its
                # node is), whatever the chip was doing.
                self._fail(chip, f"chip {chip} of {self.n_chips} died during {what}: "
                                 f"{_death(err)}", err)
        if raised:
            chip = min(raised)
            _raise_chip_error(raised[chip], f"raised by chip {chip} of {self.n_chips} during {what}")
        return results

    def _fail(self, chip, message, cause=None):
        self._failure = message
        self.close()
        raise PodError(f"{message} [the pod is closed: all its actors are killed]",
                       chip) from cause

    def map(self, fn, args, what):
        """``[fn(actor_i, *args[i]) for each chip i]``, run on the chips' actors
        in parallel (`ChipActor.apply`): how a model layered above the
        runtime runs its shards. `fn` must be a module-level function."""
        self._check_open()
        if len(args) != self.n_chips:
            raise ValueError(f"map takes one argument tuple per chip ({self.n_chips}), "
                             f"not {len(args)}")
        out = self._gather({i: a.apply.remote(fn, *args[i]) for i, a in enumerate(self._actors)},
                           what)
        return [out[i] for i in range(self.n_chips)]

    # ---- programs in lockstep windows ----------------------------------------------------
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
        self._check_open()
        n = self.n_chips
        if len(programs) != n:
            raise ValueError(f"a pod of {n} chips runs {n} programs, not {len(programs)}")
        images = images or [None] * n
        reads = reads or [[] for _ in range(n)]
        code = [p.to_bytes() if hasattr(p, "to_bytes") else bytes(p) for p in programs]
        self._gather({i: a.begin.remote(code[i], images[i], self.link_bytes_per_cycle)
                      for i, a in enumerate(self._actors)}, "the start of a run")
        return self._windows(reads, max_cycles)

    def _windows(self, reads, max_cycles):
        """Advance the started chips window by window until every one is done
        and no flit or credit is in flight; then end the run."""
        n = self.n_chips
        links = _LinkTraffic(self.peers, self.link_latency)
        inbound = [{} for _ in range(n)]
        while True:
            out = self._gather({i: a.window.remote(self.link_latency, inbound[i])
                                for i, a in enumerate(self._actors)}, "a run")
            inbound = links.carry(out, n)
            if links.quiet and all(done and not waiting for _, done, waiting in out.values()):
                break
            if links.now > max_cycles:
                self._gather({i: a.abort.remote() for i, a in enumerate(self._actors)}, "a reset")
                raise PodError(f"the pod's run did not end within {max_cycles:,} cycles (chips "
                               f"done: {[i for i, o in out.items() if o[1]]}); every chip has "
                               f"been reset")
        ends = self._gather({i: a.end.remote(reads[i]) for i, a in enumerate(self._actors)},
                            "the end of a run")
        return PodRun([ends[i][0] for i in range(n)], [ends[i][1] for i in range(n)],
                      [ends[i][2] for i in range(n)], links.first_sent, links.last_arrival,
                      links.flits)

    def _collective(self, kind, xs, rows, bidirectional=False):
        """Run the ring collective `kind` on message rows `xs` (n, rows, cols)
        fp32; returns (each chip's result rows, the `PodRun`)."""
        if self.topology != "ring":
            raise ValueError(f"the collectives run on a ring; this pod is a {self.topology}")
        self._check_open()
        c, n = self.config, self.n_chips
        outs = self._gather({i: a.begin_collective.remote(kind, n, i, np.ascontiguousarray(xs[i]),
                                                          self.link_bytes_per_cycle,
                                                          bidirectional)
                             for i, a in enumerate(self._actors)}, f"the start of {kind}")
        run = self._windows([[outs[i]] for i in range(n)], 50_000_000)
        run.check()
        result = np.stack([np.frombuffer(d[0], np.float32).reshape(rows, c.cols)
                           for d in run.data])
        return result, run

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
        message, shape, size = self._message(xs, "all_reduce")
        result, run = self._collective("all_reduce", message, message.shape[1], bidirectional)
        self.last_stats = self._stats("all_reduce", run, 4 * size, bidirectional)
        return result.reshape(self.n_chips, -1)[:, :size].reshape(self.n_chips, *shape)

    def reduce_scatter(self, xs):
        """The ring reduce-scatter of the chips' arrays `xs` (as `all_reduce`):
        returns a list, chip i's part of the sum, which is chunk ``(i + 1) mod
        n`` of the flattened arrays (`mxu.sim.compiler.collectives.chunks` of
        its rows of ``config.cols``), flattened; zero padding dropped."""
        message, shape, size = self._message(xs, "reduce_scatter")
        rows, cols = message.shape[1:]
        result, run = self._collective("reduce_scatter", message, rows)
        self.last_stats = self._stats("reduce_scatter", run, 4 * size)
        parts = []
        for i, (lo, hi) in enumerate(chunks(rows, self.n_chips)):
            owner = (i - 1) % self.n_chips
            parts.append((owner, result[owner, lo:hi].ravel()[:max(0, size - lo * cols)]))
        return [flat for _, flat in sorted(parts)]

    def all_gather(self, xs):
        """Every chip's copy of all the chips' arrays `xs` (one float32 array
        per chip, all one shape), gathered by a ring all-gather on the chips:
        an array (n_chips, n_chips, *shape), ``[j, i]`` chip i's array as chip
        j holds it."""
        message, shape, size = self._message(xs, "all_gather")
        n, per = self.n_chips, message.shape[1]
        whole = np.zeros((n, n * per, self.config.cols), np.float32)
        for i in range(n):
            whole[i, i * per:(i + 1) * per] = message[i]
        result, run = self._collective("all_gather", whole, n * per)
        self.last_stats = self._stats("all_gather", run, 4 * size * n)
        out = result.reshape(n, n, -1)[:, :, :size]
        return out.reshape(n, n, *shape)

    def _stats(self, kind, run, nbytes, bidirectional=False):
        n = self.n_chips
        factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
                  "all_gather": (n - 1) / n}[kind]
        cycles = run.link_cycles
        busbw = nbytes * factor / cycles if cycles else 0.0
        return PodStats(kind, nbytes, max(ctr["cycles"] for ctr in run.counters), cycles,
                        busbw, busbw / self.link_bytes_per_cycle, bidirectional)

    # ---- work ---------------------------------------------------------------------------
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
        self._check_open()
        if shard not in SHARDS:
            raise ValueError(f"shard must be one of {', '.join(map(repr, SHARDS))}, not {shard!r}")
        if shard == "k":
            return self._matmul_k(A, B)
        (M, K), (_, N) = _matmul_shapes(A, B)
        pieces = _split(M if shard == "m" else N, self.n_chips)
        widest = max(hi - lo for lo, hi in pieces)
        check_matmul_fits(self.config, *((widest, K, N) if shard == "m" else (M, K, widest)))
        import ray
        # The operand every chip needs whole goes into Ray's object store once.
        shared = ray.put(B if shard == "m" else A)
        refs = {}
        for chip, (lo, hi) in enumerate(pieces):
            if hi > lo:
                args = (A[lo:hi], shared) if shard == "m" else (shared, B[:, lo:hi])
                refs[chip] = self._actors[chip].call.remote("matmul", *args)
        parts = self._gather(refs, f"matmul shard={shard!r}")
        return np.concatenate([parts[chip] for chip in sorted(parts)], axis=0 if shard == "m" else 1)


    def _matmul_k(self, A, B):
        (M, K), (_, N) = _matmul_shapes(A, B)
        pieces = _split(K, self.n_chips)
        check_matmul_fits(self.config, M, max(hi - lo for lo, hi in pieces), N)
        refs = {chip: self._actors[chip].matmul_cycles.remote(A[:, lo:hi], B[lo:hi])
                for chip, (lo, hi) in enumerate(pieces) if hi > lo}
        parts = self._gather(refs, "matmul shard='k'")
        self.last_matmul_cycles = max(cycles for _, cycles in parts.values())
        partials = [parts[chip][0] if chip in parts else np.zeros((M, N), np.float32)
                    for chip in range(self.n_chips)]
        return self.all_reduce(partials)[0]


@dataclass
class PodStats:
    """What a collective cost: the message's bytes per chip, the chips'
    whole programs (``cycles``: the LOAD of the message, the collective, the
    STORE of the result), the collective's own cycles on the links
    (``link_cycles``: from the first flit sent to the last one received),
    and the bus bandwidth as NCCL defines it (``busbw``, bytes a cycle: the
    algorithm's bytes over ``link_cycles``, times ``2 (n-1)/n`` for an
    all-reduce) and as a fraction of a link's bandwidth (``busbw_fraction``;
    a bidirectional ring sends on both of a chip's links, so it can pass 1)."""
    kind: str
    nbytes: int
    cycles: int
    link_cycles: int
    busbw: float
    busbw_fraction: float
    bidirectional: bool = False


@dataclass
class PodRun:
    """One run of a program per chip (`Pod.run`): each chip's error code
    name and counters, the bytes read back, and the link activity (global
    cycles of the first flit sent and the last received, flits moved)."""
    errors: list
    counters: list
    data: list
    first_sent: int
    last_arrival: int
    flits: int

    @property
    def link_cycles(self):
        return max(0, self.last_arrival - self.first_sent) if self.flits else 0

    def check(self):
        """Raise `ChipError` naming the chips that stopped with an error code."""
        bad = [(i, e) for i, e in enumerate(self.errors) if e != "NONE"]
        if bad:
            raise ChipError("chip error codes: " + ", ".join(f"chip {i}: {e}" for i, e in bad))


class _LinkTraffic:
    """Carries what the chips' links sent in one window to the chips they
    reach, due ``latency`` cycles later, and keeps the pod's clock."""

    def __init__(self, peers, latency):
        self.peers, self.latency = peers, latency
        self.now, self.quiet, self.flits = 0, True, 0
        self.first_sent, self.last_arrival = None, 0

    def carry(self, out, n):
        inbound = [{} for _ in range(n)]
        self.quiet = True
        for i, (sent, _, _) in out.items():
            for link, (at, flits, credits) in sent.items():
                chip, peer_link = self.peers[(i, link)]
                inbound[chip][peer_link] = (at + self.latency, flits, credits + self.latency)
                self.quiet = False
                if len(at):
                    self.flits += len(at)
                    first = int(at[0])
                    self.first_sent = first if self.first_sent is None else min(self.first_sent, first)
                    self.last_arrival = max(self.last_arrival, int(at[-1]) + self.latency)
        self.now += self.latency
        return inbound


# ---- helpers ------------------------------------------------------------------------------
def _check_topology(topology):
    if not isinstance(topology, str):
        raise TypeError(f"topology must be a string, one of {', '.join(map(repr, TOPOLOGIES))}, "
                        f"not {topology!r}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(map(repr, TOPOLOGIES))}, "
                         f"not {topology!r}")
    return topology


def _check_shape(shape, topology, n_chips):
    """`shape` checked against the topology: ``(n_chips,)`` for a ring,
    ``(x, y)`` with ``x * y == n_chips`` for a 2-D torus."""
    if shape is None:
        if topology == "torus2d":
            raise ValueError(f"topology='torus2d' needs shape=(x, y) with x * y == n_chips "
                             f"({n_chips})")
        return (n_chips,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be a tuple of integers or None, not {shape!r}")
    dims = tuple(_integer(d, f"shape[{i}]", 1) for i, d in enumerate(shape))
    rank = 1 if topology == "ring" else 2
    if len(dims) != rank:
        want = f"({n_chips},)" if rank == 1 else "(x, y)"
        raise ValueError(f"a {topology}'s shape is {want}, not {dims}")
    if int(np.prod(dims)) != n_chips:
        raise ValueError(f"shape {dims} holds {int(np.prod(dims))} chips, but n_chips is {n_chips}")
    return dims


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


def _chips(indices, n):
    names = ", ".join(str(i) for i in indices)
    return f"chip{'s' if len(indices) > 1 else ''} {names} of {n}"


def _death(err):
    """Ray's reason for an actor's death, in one line: the exception its
    constructor raised (the last line of Ray's text), or Ray's first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if getattr(err, "actor_init_failed", False) else lines[0]


def _raise_chip_error(err, note):
    """Re-raise the exception a chip raised (Ray's RayTaskError carries it as
    `cause`), with `note` naming the chip; Ray's own error if it has none."""
    cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
    if hasattr(cause, "add_note"):
        cause.add_note(note)
    raise cause from None


def _start_ray(n_chips, address):
    """Initialise Ray unless it is: join `address` (or ``RAY_ADDRESS``) when
    given, otherwise start it embedded here. Returns whether it started it."""
    import ray
    if ray.is_initialized():
        return False
    options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address is not None or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, **options)
    else:
        ray.init(num_cpus=n_chips, **options)
        _watch_session()
    _ray_state["owned"] = True
    return True


def _watch_session():
    """Start the watcher that kills this Ray session's processes if this
    process dies without shutting Ray down (`mxu.sim.runtime.reaper`)."""
    import ray
    from .reaper import start_reaper
    node = getattr(ray._private.worker.global_worker, "node", None)
    session_dir = getattr(node, "_session_dir", None) or getattr(node, "session_dir", None)
    if session_dir:
        _ray_state["reaper"] = start_reaper(session_dir)


def _release_ray():
    """Shut Ray down if a pod started it and no pod is open any more."""
    if _ray_state["owned"] and _ray_state["open_pods"] == 0:
        import ray
        _ray_state["owned"] = False
        ray.shutdown()
        reaper, _ray_state["reaper"] = _ray_state["reaper"], None
        if reaper is not None:
            reaper.stdin.close()          # it reaps what shutdown left, then exits
            reaper.wait()


def _kill(actors):
    """Kill `actors` and wait (up to `KILL_TIMEOUT`) until Ray reports them
    dead: a call to a dead actor fails at once, so each ping resolves when
    its actor is gone."""
    if not actors:
        return
    import ray
    if not ray.is_initialized():
        return
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass        # already gone
    pings = [actor.pid.remote() for actor in actors]
    ray.wait(pings, num_returns=len(pings), timeout=KILL_TIMEOUT)
