"""A pod's links and its lockstep windows (docs/pod.md): how the chips are
connected (`pod_config`, `ring_peers`), and `Lockstep`, which runs one program
per chip in windows of ``link_latency`` cycles and carries the links' flits and
credits between the chips after each window.
"""

from dataclasses import dataclass

import numpy as np

from mxu.hdl import ChipConfig

from ..driver.chip import ChipError, check_integer
from .pod_chips import PodError

__all__ = ["Lockstep", "PodRun", "pod_config", "ring_peers", "check_topology", "check_shape",
           "TOPOLOGIES"]

TOPOLOGIES = ("ring", "torus2d")


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


def check_topology(topology):
    if not isinstance(topology, str):
        raise TypeError(f"topology must be a string, one of {', '.join(map(repr, TOPOLOGIES))}, "
                        f"not {topology!r}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(map(repr, TOPOLOGIES))}, "
                         f"not {topology!r}")
    return topology


def check_shape(shape, topology, n_chips):
    """`shape` checked against the topology: ``(n_chips,)`` for a ring,
    ``(x, y)`` with ``x * y == n_chips`` for a 2-D torus."""
    if shape is None:
        if topology == "torus2d":
            raise ValueError(f"topology='torus2d' needs shape=(x, y) with x * y == n_chips "
                             f"({n_chips})")
        return (n_chips,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be a tuple of integers or None, not {shape!r}")
    dims = tuple(check_integer(d, f"shape[{i}]", 1) for i, d in enumerate(shape))
    rank = 1 if topology == "ring" else 2
    if len(dims) != rank:
        want = f"({n_chips},)" if rank == 1 else "(x, y)"
        raise ValueError(f"a {topology}'s shape is {want}, not {dims}")
    if int(np.prod(dims)) != n_chips:
        raise ValueError(f"shape {dims} holds {int(np.prod(dims))} chips, but n_chips is {n_chips}")
    return dims


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


class Lockstep:
    """Runs one program per chip of a pod in lockstep windows.

    Parameters
    ----------
    chips : PodChips
        The pod's actors (`mxu.sim.runtime.pod_chips`).
    peers : dict
        Where each link's flits go (`ring_peers`).
    link_latency, link_bytes_per_cycle : int
        Each link's latency in cycles (the window's length) and bandwidth.

    Interface: ``run(programs, images, reads, max_cycles)`` starts the
    programs and runs them (`Pod.run`); ``windows(reads, max_cycles)`` runs
    programs already started on the chips (``ChipActor.begin_collective``)
    to their end. Both return a `PodRun`.
    """

    def __init__(self, chips, peers, link_latency, link_bytes_per_cycle):
        self.chips, self.peers = chips, peers
        self.link_latency, self.link_bytes_per_cycle = link_latency, link_bytes_per_cycle

    def run(self, programs, images, reads, max_cycles):
        """`Pod.run`: one program per chip, started, then run to its end."""
        self.chips.check_open()
        n = self.chips.n_chips
        if len(programs) != n:
            raise ValueError(f"a pod of {n} chips runs {n} programs, not {len(programs)}")
        images = images or [None] * n
        reads = reads or [[] for _ in range(n)]
        code = [p.to_bytes() if hasattr(p, "to_bytes") else bytes(p) for p in programs]
        self.chips.each("the start of a run", "begin",
                        [(code[i], images[i], self.link_bytes_per_cycle) for i in range(n)])
        return self.windows(reads, max_cycles)

    def windows(self, reads, max_cycles):
        """Advance the started chips window by window until every one is done
        and no flit or credit is in flight; then end the run."""
        chips, n = self.chips, self.chips.n_chips
        links = _LinkTraffic(self.peers, self.link_latency)
        inbound = [{} for _ in range(n)]
        while True:
            out = chips.each("a run", "window", [(self.link_latency, inbound[i]) for i in range(n)])
            inbound = links.carry(out, n)
            if links.quiet and all(done and not waiting for _, done, waiting in out.values()):
                break
            if links.now > max_cycles:
                chips.each("a reset", "abort")
                raise PodError(f"the pod's run did not end within {max_cycles:,} cycles (chips "
                               f"done: {[i for i, o in out.items() if o[1]]}); every chip has "
                               f"been reset")
        ends = chips.each("the end of a run", "end", [(reads[i],) for i in range(n)])
        return PodRun([ends[i][0] for i in range(n)], [ends[i][1] for i in range(n)],
                      [ends[i][2] for i in range(n)], links.first_sent, links.last_arrival,
                      links.flits)


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
