"""`Trace`: where the cycles went, from the chip's own trace port
(docs/profiler.md).

A chip built with ``trace=True`` records, cycle by cycle, when each engine takes
an instruction from its queue (with its pc, opcode and the cycles it waited
for a dependency token) and when it completes it. `Trace` turns that into
events with the program's instruction text, per-engine busy, stall and idle
cycles (which equal the chip's counters), Chrome trace-event JSON for Perfetto,
a timeline plot, and the instructions the array waited on longest.
"""

import json
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from mxu.hdl import isa
from mxu.hdl.isa import Opcode

from ..driver.trace import ENGINES

__all__ = ["Trace", "TraceEvent", "TRACKS"]

# Display tracks: the compute engine's weight loader runs beside its array.
TRACKS = ("load", "compute: weights", "compute: array", "vector", "store")
_WAITED_FOR = {
    ("compute", "pop_prev"): "the load->compute token (its weights or activations were loading)",
    ("compute", "pop_next"): "the store->compute token (its output buffer was being stored)",
    ("load", "pop_next"): "the compute->load token (the buffer it refills was in use)",
    ("store", "pop_prev"): "the compute->store token (its results were being computed)",
    ("vector", "pop_prev"): "the compute->vector token (its operands were being computed)",
    ("vector", "pop_next"): "the store->vector token (its output rows were being stored)",
}


@dataclass(frozen=True)
class TraceEvent:
    """One instruction as an engine ran it: taken from its queue at `start`
    after waiting `waited` cycles for tokens, completed at `end` (cycles from the
    start of the call's first program)."""
    engine: str
    track: str
    pc: int
    opcode: str
    text: str
    start: int
    end: int
    waited: int
    program: int

    @property
    def cycles(self):
        return self.end - self.start


def _pairs(takes, ends, what):
    if len(takes) != len(ends):
        raise ValueError(f"the trace has {len(takes)} {what} started and {len(ends)} completed")
    return zip(takes, ends)


class Trace:
    """The events of one or more programs (see the module docstring).

    Attributes: ``events`` (a list of `TraceEvent`), ``cycles`` (chip cycles of
    all programs), ``counters`` (the chip's counters, summed), ``utilization``
    (activation rows the array accepted per ``bucket_cycles`` cycles, over
    ``bucket_cycles``: one value per bucket).
    """

    def __init__(self, events=(), cycles=0, counters=None, utilization=(), bucket_cycles=256):
        self.events = list(events)
        self.cycles = cycles
        self.counters = dict(counters or {})
        self.utilization = np.asarray(utilization, np.float64)
        self.bucket_cycles = bucket_cycles
        self.programs = len({e.program for e in self.events})
        self._deps = {}

    @classmethod
    def from_run(cls, data, program, counters, program_index=0, offset=0):
        """A `Trace` of one run: `data` (the driver's `ChipTraceData`), the
        `Program` it ran, its counters."""
        f, t = data.fields, data.cycle
        text = program.text
        events = []

        def event(engine, track, i, end):
            pc = int(f[f"{engine}.pc"][i])
            opcode = Opcode(int(f[f"{engine}.opcode"][i])).name
            label = text[pc].strip() if pc < len(text) else opcode
            events.append(TraceEvent(engine, track, pc, opcode, label, offset + int(t[i]),
                                     offset + int(end) + 1, int(f[f"{engine}.waited"][i]),
                                     program_index))

        for engine in ("load", "store", "vector"):
            takes = np.flatnonzero(f[f"{engine}.take"])
            ends = t[np.flatnonzero(f[f"{engine}.complete"])]
            for i, end in _pairs(takes, ends, f"{engine} instructions"):
                event(engine, engine, i, end)
        takes = np.flatnonzero(f["compute.take"])
        is_loadw = f["compute.opcode"][takes] == Opcode.LOADW.value
        loadws = _pairs(takes[is_loadw], t[np.flatnonzero(f["loadw_done"])], "LOADWs")
        others = _pairs(takes[~is_loadw], t[np.flatnonzero(f["compute.complete"])],
                        "MATMULs and SYNCs")
        for i, end in loadws:
            event("compute", "compute: weights", i, end)
        for i, end in others:
            event("compute", "compute: array", i, end)
        events.sort(key=lambda e: (e.start, TRACKS.index(e.track)))
        util = data.buckets / data.bucket_cycles
        trace = cls(events, counters["cycles"], counters, util, data.bucket_cycles)
        trace.programs = 1
        return trace.attach_deps(program, program_index)

    def extend(self, other):
        """Append `other` (the next programs) after these: its cycles are offset
        by ours."""
        base, programs = self.cycles, self.programs
        for e in other.events:
            self.events.append(TraceEvent(e.engine, e.track, e.pc, e.opcode, e.text,
                                          e.start + base, e.end + base, e.waited,
                                          e.program + programs))
        for k, v in other.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v
        # Each program's buckets start at its own first cycle: pad ours to a bucket.
        whole = -(-base // self.bucket_cycles)
        util = np.zeros(whole)
        util[:len(self.utilization)] = self.utilization[:whole]
        self.utilization = np.concatenate([util, other.utilization])
        self._deps.update({(p + programs, pc): w for (p, pc), w in other._deps.items()})
        self.cycles += other.cycles
        self.programs += other.programs
        return self

    @property
    def engines(self):
        """The engines shown: the vector engine only when it ran something (a
        chip without the vector unit has none)."""
        ran_vector = any(e.engine == "vector" for e in self.events)
        return tuple(e for e in ENGINES if e != "vector" or ran_vector)

    @property
    def tracks(self):
        return tuple(t for t in TRACKS if t != "vector" or "vector" in self.engines)

    # ---- where the cycles went ------------------------------------------------------
    def totals(self):
        """{engine: {"busy", "stall", "idle", "instructions"}}: busy is the union of
        the engine's instruction intervals, stall the cycles its queue's head
        waited for a token (the chip's ``<engine>_stall`` counter), idle the
        rest of the run."""
        out = {}
        for engine in self.engines:
            mine = [e for e in self.events if e.engine == engine]
            busy = _union([(e.start, e.end) for e in mine])
            waits = _union([(e.start - e.waited, e.start) for e in mine])
            either = _union([(e.start, e.end) for e in mine]
                            + [(e.start - e.waited, e.start) for e in mine])
            out[engine] = {"busy": busy, "stall": sum(e.waited for e in mine),
                           "idle": self.cycles - either, "instructions": len(mine),
                           "stall_span": waits}
        return out

    def top_stalls(self, n=5):
        """The compute-engine instructions (by pc: a loop body's instruction counts
        once) the array waited on longest: (total waited, issues, event, what)."""
        by_pc = defaultdict(list)
        for e in self.events:
            if e.engine == "compute" and e.waited:
                by_pc[(e.program, e.pc)].append(e)
        ranked = sorted(by_pc.values(), key=lambda es: -sum(e.waited for e in es))[:n]
        return [(sum(e.waited for e in es), len(es), es[0], self._waited_for(es[0]))
                for es in ranked]

    def _waited_for(self, event):
        return self._deps.get((event.program, event.pc), "a token")

    def attach_deps(self, program, program_index):
        """Remember which tokens each instruction of `program` pops, for
        `top_stalls` ("waited for what")."""
        deps = self._deps
        for pc, word in enumerate(program.words):
            try:
                opcode, fields = isa.decode(word)
            except ValueError:
                continue
            engine = isa.ENGINE_OF.get(opcode)
            if engine is None or "deps" not in fields:
                continue
            popped = [k for k in ("pop_prev", "pop_next") if fields["deps"][k]]
            what = " and ".join(_WAITED_FOR.get((engine.name.lower(), k), k) for k in popped)
            deps[(program_index, pc)] = what or "nothing (it was queued behind another)"
        return self

    # ---- output --------------------------------------------------------------------------
    def chrome_events(self):
        """Chrome trace-event dicts: one track per engine unit (timestamps in
        cycles, shown as microseconds), token waits on tracks of their own, and a
        counter track of array utilization. Slices on a track never overlap: a
        slice starts at its instruction's start or at the end of the track's
        previous slice, whichever is later (pipelined MATMULs overlap)."""
        out = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "mxu chip"}}]
        tracks = list(self.tracks) + [f"{e} waits" for e in self.engines]
        for tid, name in enumerate(tracks):
            out.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name",
                        "args": {"name": name}})
            out.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index",
                        "args": {"sort_index": tid}})
        last = defaultdict(int)
        for e in self.events:
            tid = tracks.index(e.track)
            start = max(e.start, last[tid])
            if e.end > start:
                out.append({"ph": "X", "pid": 0, "tid": tid, "name": e.opcode, "cat": e.engine,
                            "ts": start, "dur": e.end - start,
                            "args": {"pc": e.pc, "instruction": e.text, "waited": e.waited,
                                     "program": e.program}})
                last[tid] = e.end
            if e.waited:
                wid = tracks.index(f"{e.engine} waits")
                ws = max(e.start - e.waited, last[wid])
                if e.start > ws:
                    out.append({"ph": "X", "pid": 0, "tid": wid, "name": f"wait: {e.opcode}",
                                "cat": "wait", "ts": ws, "dur": e.start - ws,
                                "args": {"pc": e.pc, "instruction": e.text}})
                    last[wid] = e.start
        for i, u in enumerate(self.utilization):
            out.append({"ph": "C", "pid": 0, "name": "array utilization",
                        "ts": i * self.bucket_cycles, "args": {"utilization": round(float(u), 4)}})
        return out

    def save(self, path):
        """Write Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing)."""
        with open(path, "w") as f:
            json.dump({"traceEvents": self.chrome_events(), "displayTimeUnit": "ns",
                       "otherData": {"time unit": "1 us = 1 chip cycle",
                                     "cycles": self.cycles, "programs": self.programs}}, f)
        return path

    def plot(self, path, title=None):
        """A PNG timeline: one lane per engine unit, instructions coloured by opcode,
        array utilization underneath."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        colours = {"LOAD": "tab:blue", "LOADW": "tab:orange", "MATMUL": "tab:green",
                   "STORE": "tab:purple", "SYNC": "tab:gray", "VECTOR": "tab:red"}
        fig, (ax, au) = plt.subplots(2, 1, figsize=(12, 4.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 1]})
        for lane, track in enumerate(self.tracks):
            spans = defaultdict(list)
            for e in self.events:
                if e.track == track:
                    spans[e.opcode].append((e.start, max(e.end - e.start, 1)))
            for opcode, bars in spans.items():
                ax.broken_barh(bars, (lane - 0.4, 0.8), color=colours.get(opcode, "black"),
                               label=opcode)
        ax.set_yticks(range(len(self.tracks)), self.tracks)
        ax.invert_yaxis()
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), loc="upper right", ncol=len(unique), fontsize=8)
        ax.set_title(title or f"mxu engine timeline: {self.cycles:,} cycles, "
                              f"{self.programs} program(s)")
        x = np.arange(len(self.utilization)) * self.bucket_cycles
        au.step(x, 100 * self.utilization, where="post", color="tab:green")
        au.set_ylabel("array %")
        au.set_ylim(0, 105)
        au.set_xlabel("chip cycle")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def stall_table(self, n=5):
        """Rows for `top_stalls`, for printing: waited cycles, times, program, pc,
        instruction, waiting for what."""
        return [[f"{total:,}", f"{issues:,}", f"{e.program}", f"{e.pc}", e.text[:60], what]
                for total, issues, e, what in self.top_stalls(n)]


def _union(intervals):
    """Cycles covered by half-open intervals."""
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total
