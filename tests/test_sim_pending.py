"""The fast record of pending rows (`mxu.sim.backends.fast_pending`): the C++
model, called in a fast chip's library, must give the RTL `_PendingRows`'s
outputs in every cycle, under random traffic, probes and resets. The
whole-chip tests hold the fast builds to the all-RTL chip on programs."""

import ctypes

import numpy as np
import pytest
from amaranth.hdl import ResetInserter, Signal, unsigned
from amaranth.sim import Simulator

from mxu.hdl.compute import _PendingRows, pending_entry_layout
from mxu.sim import Chip

from chip_configs import TINY

SEED = 2911
# (depth, addr_bits): the 16x16 chip's record, a small one that fills and
# wraps often, and one of more than 64 entries (two mask words in the model).
CASES = [(64, 13), (8, 3), (128, 5)]


class _Model:
    """The C++ model behind ctypes."""

    def __init__(self, lib, depth, addr_bits):
        self._step = lib.mxu_pending_step
        self._step.restype = None
        self._step.argtypes = [ctypes.c_void_p, ctypes.c_ubyte, ctypes.c_ubyte, ctypes.c_int,
                               ctypes.c_ubyte, ctypes.c_int, ctypes.c_ubyte,
                               ctypes.POINTER(ctypes.c_int)] + [ctypes.POINTER(ctypes.c_ubyte)] * 3
        new = lib.mxu_pending_new
        new.restype, new.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_int]
        self._handle = new(depth, addr_bits)
        self._head, self._flags = ctypes.c_int(0), [ctypes.c_ubyte(v) for v in (1, 1, 0)]
        self.outputs = (1, 1, 0, 0)          # ready, empty, hit, head: the module's initial values

    def step(self, rst, add_valid, payload, retire, probe, probe_load):
        self._step(self._handle, rst, add_valid, payload, retire, probe, probe_load,
                   ctypes.byref(self._head), *(ctypes.byref(f) for f in self._flags))
        ready, empty, hit = (f.value for f in self._flags)
        self.outputs = (ready, empty, hit, self._head.value)


@pytest.fixture(scope="module")
def library():
    return Chip(TINY, fast_mac=True).device._lib


@pytest.mark.parametrize("depth, addr_bits", CASES, ids=[f"d{d}a{a}" for d, a in CASES])
def test_fast_pending_rows_match_the_rtl(library, depth, addr_bits):
    rng = np.random.default_rng(SEED + depth + addr_bits)
    rst = Signal()
    dut = _PendingRows(depth, unsigned(addr_bits))
    top = ResetInserter(rst)(dut)
    model = _Model(library, depth, addr_bits)
    entry_bits = pending_entry_layout(unsigned(addr_bits)).size
    # Few distinct rows, so that probes hit; bursts of adds and of retires,
    # so that the record fills and drains.
    rows = rng.integers(0, 1 << addr_bits, size=6)
    cycles, hits = 2500, 0

    async def bench(ctx):
        nonlocal hits
        add_rate, retire_rate = 0.6, 0.6
        for cycle in range(cycles):
            if cycle % 200 == 0:
                add_rate, retire_rate = rng.choice([(0.9, 0.3), (0.3, 0.9), (0.6, 0.6)])
            inputs = dict(
                rst=int(rng.random() < 0.004),
                add_valid=int(rng.random() < add_rate),
                payload=int(rng.integers(0, 1 << entry_bits) & ~((1 << addr_bits) - 1)
                            | rng.choice(rows)),
                retire=int(rng.random() < retire_rate and not ctx.get(dut.empty)),
                probe=int(rng.choice(rows)),
                probe_load=int(rng.random() < 0.7))
            for name, port in (("rst", rst), ("add_valid", dut.add.valid),
                               ("payload", dut.add.payload.as_value()), ("retire", dut.retire),
                               ("probe", dut.probe), ("probe_load", dut.probe_load)):
                ctx.set(port, inputs[name])
            rtl = (ctx.get(dut.add.ready), ctx.get(dut.empty), ctx.get(dut.hit),
                   ctx.get(dut.head.as_value()))
            assert model.outputs == rtl, (cycle, inputs, model.outputs, rtl)
            hits += rtl[2]
            model.step(**inputs)
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert 0.05 * cycles < hits < 0.95 * cycles, hits      # the traffic exercised the probe
