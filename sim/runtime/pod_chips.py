"""A pod's chips as Ray actors: their lifetime, and the faults of every call to
them (docs/pod.md).

`ChipActor` is one chip in a worker process of its own. `PodChips` starts the
actors (and Ray, when no Ray is running), puts a deadline on every remote call
and turns a dead or silent actor into `PodError` (`PodChips.gather`, the one
place results come back), and kills the actors on `close`.

Ray is imported only when a pod starts, so that ``import mxu.sim`` stays
fast for everyone who never builds one.
"""

import logging
import os
import time

from ..compiler.collectives import ring_collective_program
from ..driver.chip import build_model
from .chip import Chip

__all__ = ["ChipActor", "PodChips", "PodError", "DEFAULT_TIMEOUT", "START_TIMEOUT", "KILL_TIMEOUT"]

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


class ChipActor:
    """One chip of a pod, run by Ray in a worker process of its own.

    It holds a runtime `Chip(config, fast_mac=fast_mac)` and offers remote
    methods: ``call(method, *args, **kwargs)`` calls a public method of that
    chip and returns its result; ``pid()`` its process id; ``apply(fn,
    *args)`` runs a higher layer's work on it (`Pod.map`); ``begin``,
    ``begin_collective``, ``window``, ``end`` and ``abort`` run a program in
    the pod's lockstep windows (`mxu.sim.runtime.pod_lockstep`). The pod
    makes it a Ray actor with ``ray.remote(ChipActor)``; plain, it is an
    ordinary class (its module is importable in every worker, so Ray ships it
    by name).
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


class PodChips:
    """The actors of a pod's `n_chips` chips, from start to close, and the
    faults of the calls to them.

    Parameters
    ----------
    n_chips : int
        Chips (checked by `Pod`).
    config : ChipConfig
        Every chip's configuration, links included.
    fast_mac : bool
        Passed to every chip.

    Interface: ``start(address)`` builds (or finds) the chips' model here,
    starts Ray unless it runs (`address` as in `Pod`) and the actors;
    ``actors``; ``pids`` (the actors' process ids on their nodes);
    ``timeout``, the seconds each call may take (default `DEFAULT_TIMEOUT`);
    ``gather(refs, what)``, the one place results come back; ``each(what,
    method, args)``, one remote call per chip, gathered; ``check_open()``;
    ``close()``; ``closed``. An actor that dies or misses the deadline raises
    `PodError` naming the chip and closes the pod. Exceptions a chip raises
    itself come back as they are, with a note naming the chip, and the pod
    stays open.
    """

    def __init__(self, n_chips, config, fast_mac):
        self.n_chips, self.config, self.fast_mac = n_chips, config, fast_mac
        self.closed, self.actors, self.pids = False, [], []
        self.started_ray, self._counted, self._failure = False, False, None
        self.timeout = DEFAULT_TIMEOUT

    def start(self, address):
        """Build the chips' model here, then Ray (unless it runs) and the actors."""
        self._build_here()
        self.started_ray = _start_ray(self.n_chips, address)
        _ray_state["open_pods"] += 1
        self._counted = True
        self._start_actors()

    def _build_here(self):
        """Build (or find in ~/.cache/mxu) the chips' Verilated model in this
        process, so that a first build prints its progress here instead of in
        a worker's log, and local actors only load it."""
        build_model(self.config, self.fast_mac)

    def _start_actors(self):
        import ray
        # Each chip is a single-threaded simulation that the OS schedules; Ray's
        # CPU accounting would only refuse pods with more chips than cores (a
        # legitimate simulation), so the actors ask for none. SPREAD puts them
        # on as many nodes of a cluster as there are.
        remote = ray.remote(ChipActor).options(num_cpus=0, scheduling_strategy="SPREAD",
                                               max_restarts=0)
        self.actors = [remote.remote(self.config, self.fast_mac) for _ in range(self.n_chips)]
        self.pids = list(self.each("start-up", "pid", timeout=START_TIMEOUT).values())

    def close(self):
        """Kill the chips' actors and wait until Ray has seen them go; shut Ray
        down when a pod started it and no other pod is open. Idempotent."""
        if self.closed:
            return
        self.closed = True
        actors, self.actors = self.actors, []
        _kill(actors)
        if self._counted:
            self._counted = False
            _ray_state["open_pods"] -= 1
            _release_ray()

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

    def check_open(self):
        if self.closed:
            reason = f" after {self._failure}" if self._failure else ""
            raise PodError(f"the pod is closed{reason}; build a new Pod")

    def each(self, what, method, args=None, timeout=None):
        """``{i: actor_i.method(*args[i])}`` for every chip i, in chip order,
        gathered (`gather`); `args` None: no arguments."""
        args = args or [()] * self.n_chips
        out = self.gather({i: getattr(a, method).remote(*args[i]) for i, a in enumerate(self.actors)},
                          what, timeout)
        return {i: out[i] for i in range(self.n_chips)}

    def gather(self, refs, what, timeout=None):
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
