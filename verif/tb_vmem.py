"""Amaranth-simulator testbench for banked row memories (`mxu.hdl.vmem.BankedRowMemory`,
`Vmem`, `AccMem`): random or sequential traffic on every port, checked cycle by
cycle against a Python model of the rows and of the priority rules."""

import numpy as np
from amaranth.sim import Simulator

__all__ = ["check_banked"]


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def check_banked(dut, reads, writes, depth, banks, width, cycles, seed, pattern="random"):
    """Random (or sequential) traffic on `reads` / `writes` (lists of ports in
    priority order, (port, always_ready)) of a memory of `depth` rows."""
    rng = np.random.default_rng(seed)
    model = [0] * depth
    pending = [None] * len(reads)      # row data expected next cycle per read port
    stats = {"dma_grants": 0}

    async def bench(ctx):
        seq = [int(rng.integers(depth)) for _ in reads]
        for cycle in range(cycles):
            req = []
            for i, (port, _) in enumerate(reads):
                if pattern == "sequential":
                    valid, addr = True, seq[i] % depth
                else:
                    valid, addr = bool(rng.integers(3)), int(rng.integers(depth))
                ctx.set(port.req.valid, valid)
                ctx.set(port.req.payload, addr)
                req.append((valid, addr))
            wr = []
            for port, _ in writes:
                valid, addr = bool(rng.integers(2)), int(rng.integers(depth))
                value = int(rng.integers(1 << 62)) & ((1 << width) - 1)
                ctx.set(port.valid, valid)
                ctx.set(port.payload.addr, addr)
                ctx.set(port.payload.data.as_value() if hasattr(port.payload.data, "as_value")
                        else port.payload.data, value)
                wr.append((valid, addr, value))
            # responses for last cycle's requests
            for i, (port, _) in enumerate(reads):
                got_valid = ctx.get(port.resp.valid)
                assert got_valid == (pending[i] is not None), (cycle, i, seed)
                if pending[i] is not None:
                    data = port.resp.payload
                    got = ctx.get(data.as_value() if hasattr(data, "as_value") else data)
                    assert got == pending[i], f"cycle {cycle} port {i}: read {got:x} want " \
                                              f"{pending[i]:x} (seed={seed})"
            # readiness: refused iff a higher-priority port is on the same bank
            for kind, ports, reqs in (("read", reads, req), ("write", writes, wr)):
                for i, (port, always) in enumerate(ports):
                    ready_sig = port.req.ready if kind == "read" else port.ready
                    ready = 1 if always else ctx.get(ready_sig)
                    blocked = any(r[0] and r[1] % banks == reqs[i][1] % banks
                                  for r in reqs[:i])
                    assert ready == (not blocked), (kind, i, cycle, seed)
            # fire
            for i, (port, always) in enumerate(reads):
                ok = req[i][0] and (always or ctx.get(port.req.ready))
                pending[i] = model[req[i][1]] if ok else None
                if ok:
                    if i == len(reads) - 1:
                        stats["dma_grants"] += 1
                    seq[i] += 1
            for i, (port, always) in enumerate(writes):
                if wr[i][0] and (always or ctx.get(port.ready)):
                    model[wr[i][1]] = wr[i][2]
            await ctx.tick()

    _run(dut, bench)
    return stats
