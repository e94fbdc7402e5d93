"""The inter-chip link port (docs/pod.md): SEND and RECV on a chip whose link 0
is wired back to its link 1 by the test, through the harness's link model.

The rows that come back equal what the ISA model (`IsaModel(loopback=...)`)
says, bit for bit, at every bandwidth; the sender never has more flits in
flight than the receiver's credits; bad link numbers and descriptors give
their error codes; a RECV that nothing feeds ends with the watchdog, and the
chip is right on the next run.
"""

import numpy as np
import pytest

from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.sim import ChipError, Program
from mxu.sim.driver.chip import SimulatedChip
from mxu.verif.isa_model import IsaModel

SEED = 20261126
LATENCY = 40
CONFIG = ChipConfig(rows=4, cols=4, vmem_bytes=64 << 10, acc_bytes=16 << 10, links=2,
                    link_credits=8)


@pytest.fixture(scope="module")
def chip():
    return SimulatedChip(CONFIG, fast_mac=True)


def _loopback(chip, program, image, window=LATENCY, limit=200_000):
    """Run `program` with link 0's flits and credits arriving on link 1
    `LATENCY` cycles later (and back); returns (RunResult, the most flits link
    0 ever had unanswered by a credit)."""
    chip.start(program, image)
    base, in_flight, worst = chip.cycle, 0, 0
    while True:
        chip.clock(window)
        moved = False
        for src, dst in ((0, 1), (1, 0)):
            at, flits, credits = chip.link_take(src)
            chip.link_give(dst, at + LATENCY, flits, credits + LATENCY)
            moved |= bool(len(at) or len(credits))
            if src == 0:
                in_flight += len(at)
            else:
                in_flight -= len(credits)
            worst = max(worst, in_flight)
        if chip.done and not moved and not chip.link_arriving(0) and not chip.link_arriving(1):
            return chip.finish(), worst
        assert chip.cycle - base < limit, "the loopback run did not end"


def _round_trip(rows, relu, to_vmem):
    """LOAD acc rows, SEND them (ReLU optional, bf16 into VMEM optional) on link
    0, RECV them from link 1, STORE what came back."""
    rb = CONFIG.acc_row_bytes
    back = dict(vmem_row=7) if to_vmem else dict(acc_row=200)
    out_bytes = rb // 2 if to_vmem else rb
    p = Program()
    p.load(ext_addr=0, rows=rows, row_bytes=rb, acc_row=3, push_next=1)
    p.sync("compute", pop_prev=1, push_next=1)
    p.send(link=0, rows=rows, row_bytes=out_bytes, acc_row=3, relu=relu, to_bf16=to_vmem,
           pop_prev=1)
    p.recv(link=1, rows=rows, row_bytes=out_bytes, push_next=1, **back)
    p.sync("compute", pop_prev=1, push_next=1)
    p.store(ext_addr=0x8000, rows=rows, row_bytes=out_bytes, pop_prev=1, **back)
    return p.halt(), out_bytes


@pytest.mark.parametrize("bytes_per_cycle", [1, 5, 64])
@pytest.mark.parametrize("rows,relu,to_vmem", [(1, False, False), (37, True, False),
                                               (19, False, True)])
def test_loopback_matches_the_isa_model(chip, bytes_per_cycle, rows, relu, to_vmem):
    rng = np.random.default_rng(SEED + rows)
    data = rng.standard_normal((rows, CONFIG.cols)).astype(np.float32)
    program, out_bytes = _round_trip(rows, relu, to_vmem)
    chip.set_link_bandwidth(bytes_per_cycle)
    result, worst = _loopback(chip, program, {0: data.tobytes()})
    assert result.error is ErrorCode.NONE
    assert worst <= CONFIG.link_credits
    got = chip.read_memory(0x8000, rows * out_bytes)

    model = IsaModel(CONFIG, ext_bytes=1 << 16, loopback={0: 1})
    model.ext[:data.nbytes] = np.frombuffer(data.tobytes(), np.uint8)
    assert model.run(program.to_bytes(), base=0xC000).error is ErrorCode.NONE
    assert bytes(got) == model.ext[0x8000:0x8000 + rows * out_bytes].tobytes()


def test_a_slower_link_takes_longer(chip):
    """The link model paces flits by the bandwidth: the same run at 1 byte a
    cycle takes more cycles than at a flit a cycle."""
    data = np.arange(37 * CONFIG.cols, dtype=np.float32)
    program, _ = _round_trip(37, False, False)
    cycles = {}
    for bpc in (1, CONFIG.link_flit_bytes):
        chip.set_link_bandwidth(bpc)
        result, _ = _loopback(chip, program, {0: data.tobytes()})
        cycles[bpc] = result.counters["cycles"]
    flits = 37 * CONFIG.acc_row_bytes // CONFIG.link_flit_bytes
    assert cycles[1] > cycles[CONFIG.link_flit_bytes]
    assert cycles[1] >= CONFIG.link_flit_bytes * (flits - 1)


@pytest.mark.parametrize("case", ["link index", "rows beyond the accumulator", "recv option",
                                  "recv vector flag"])
def test_bad_link_instructions_give_error_codes(chip, case):
    rb = CONFIG.acc_row_bytes
    program = {
        "link index": Program().send(link=CONFIG.links, rows=1, row_bytes=rb, acc_row=0),
        "rows beyond the accumulator": Program().send(link=0, rows=2, row_bytes=rb,
                                                      acc_row=CONFIG.acc_rows - 1),
        "recv option": Program().raw(Program().recv(link=1, rows=1, row_bytes=rb, acc_row=0)
                                     .words[0] | 1 << 9),     # to_bf16 on a RECV
        "recv vector flag": Program().raw(Program().recv(link=1, rows=1, row_bytes=rb,
                                                         acc_row=0).words[0] | 1 << 15),
    }[case].halt()
    expected = {"link index": ErrorCode.LINK_INDEX,
                "rows beyond the accumulator": ErrorCode.DMA_DESCRIPTOR,
                "recv option": ErrorCode.DMA_DESCRIPTOR,
                "recv vector flag": ErrorCode.ILLEGAL_INSTR}[case]
    result = chip.run(program, max_cycles=10_000)
    assert (result.error, result.error_pc) == (expected, 0)
    assert IsaModel(CONFIG, ext_bytes=1 << 16).run(program.to_bytes()).error is expected


def test_a_recv_that_nothing_feeds_ends_with_the_watchdog(chip):
    rb = CONFIG.acc_row_bytes
    starved = Program().recv(link=1, rows=4, row_bytes=rb, acc_row=0).halt()
    with pytest.raises(ChipError, match="watchdog"):
        chip.run(starved, max_cycles=5_000)
    # The reset cleared the links too: the next run is right.
    data = np.arange(5 * CONFIG.cols, dtype=np.float32)
    program, _ = _round_trip(5, False, False)
    chip.set_link_bandwidth(CONFIG.link_flit_bytes)
    result, _ = _loopback(chip, program, {0: data.tobytes()})
    assert result.error is ErrorCode.NONE
    assert bytes(chip.read_memory(0x8000, data.nbytes)) == data.tobytes()
