"""Program-level tests on the whole chip (fast native path): every instruction,
hazards through VMEM and the accumulator, every error code followed by a soft
reset and a good program, and random programs against the ISA's functional model."""

import numpy as np
import pytest

from chip_configs import TINY, run_cocotb_chip
from mxu.hdl.isa import ErrorCode
from mxu.sim import Chip
from mxu.sim import Program
from mxu.verif import golden, programs

SEED = 20261122
CFG = TINY


@pytest.fixture(scope="module")
def chip():
    return Chip(CFG)


_both = programs.run_both


def _fresh(chip):
    chip.clear_errors()
    chip.soft_reset()
    chip.memory[:] = 0


bf16_bits = programs.bf16_bits


def test_every_instruction_against_the_model(chip):
    _fresh(chip)
    p, image = programs.every_instruction(CFG, np.random.default_rng(SEED))
    result, model, expected = _both(chip, p, image)
    assert result.error is ErrorCode.NONE and expected.error is ErrorCode.NONE
    for lo, hi in programs.EVERY_INSTRUCTION_OUTPUTS:
        golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], f"bytes {lo:#x}")
    assert result.counters["instructions"] == len(p)
    assert result.counters["array_active"] == 14


def test_loops_against_the_model(chip):
    """LOOP bodies issued by the hardware loop expander, with strided addresses:
    loads, LOADW/MATMUL pairs (zero and accumulator seeds), stores, SYNCs."""
    _fresh(chip)
    p, image = programs.loop_program(CFG, np.random.default_rng(SEED + 2))
    result, model, expected = _both(chip, p, image)
    assert result.error is ErrorCode.NONE and expected.error is ErrorCode.NONE
    lo, hi = programs.LOOP_OUTPUTS
    golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], "loop program")
    assert np.any(model.ext[lo:hi])
    assert result.counters["instructions"] == 1 + 6 + 12 + 6 + 3 + 1
    assert result.counters["array_active"] == 24


def test_accumulator_raw_hazard_is_interlocked(chip):
    """Back-to-back MATMULs of 1-2 rows, each seeded from the previous one's output
    rows: far shorter than the array's latency, so only the interlock keeps them right."""
    _fresh(chip)
    rng = np.random.default_rng(SEED + 1)
    p = Program()
    p.load(vmem_row=0, ext_addr=0, rows=8, row_bytes=8, push_next=True)
    p.loadw(vmem_row=4, k_rows=4, pop_prev=True)
    p.matmul(act_row=0, m_rows=2, out_row=0, new_weights=True)
    for step in range(6):
        p.matmul(act_row=step % 3, m_rows=2 - step % 2, out_row=0, seed="acc", seed_row=0)
    p.matmul(act_row=1, m_rows=1, out_row=1, seed="bias", seed_row=0, push_next=True)
    p.store(acc_row=0, ext_addr=0x1000, rows=2, row_bytes=16, pop_prev=True)
    p.halt()
    result, model, expected = _both(chip, p, {0: bf16_bits(rng, (8, 4))})
    assert result.ok and expected.error is ErrorCode.NONE
    golden.assert_bits_equal(result.memory[0x1000:0x1020], model.ext[0x1000:0x1020], "acc RAW")


def test_vmem_raw_and_war_through_tokens(chip):
    """Reload the activation rows while the previous MATMUL may still read them:
    the compute->load token orders the reload after the MATMUL."""
    _fresh(chip)
    rng = np.random.default_rng(SEED + 2)
    p = Program()
    p.load(vmem_row=4, ext_addr=0x100, rows=4, row_bytes=8)
    p.load(vmem_row=0, ext_addr=0x000, rows=4, row_bytes=8, push_next=True)
    p.loadw(vmem_row=4, k_rows=4, pop_prev=True)
    p.matmul(act_row=0, m_rows=4, out_row=0, new_weights=True, push_prev=True)
    p.load(vmem_row=0, ext_addr=0x040, rows=4, row_bytes=8, pop_next=True, push_next=True)
    p.matmul(act_row=0, m_rows=4, out_row=4, pop_prev=True, push_next=True)
    p.store(acc_row=0, ext_addr=0x1000, rows=8, row_bytes=16, pop_prev=True)
    p.halt()
    image = {0: bf16_bits(rng, (8, 4)), 0x100: bf16_bits(rng, (4, 4))}
    result, model, _ = _both(chip, p, image)
    assert result.ok
    golden.assert_bits_equal(result.memory[0x1000:0x1080], model.ext[0x1000:0x1080], "VMEM RAW/WAR")


@pytest.mark.parametrize("case", list(programs.error_programs(CFG)))
def test_error_then_soft_reset_then_good_program(chip, case):
    program, code, pc = programs.error_programs(CFG)[case]
    _fresh(chip)
    result, _, expected = _both(chip, program, {})
    assert result.error is code, f"{case}: chip said {result.error.name}"
    assert expected.error is code, f"{case}: model said {expected.error.name}"
    if pc is not None:
        assert result.error_pc == pc == expected.pc
    _good_program_after_reset(chip)


def test_axi_error_then_recovery(chip):
    _fresh(chip)
    chip.inject_error(0x4000, 0x4100, "slverr")
    result = chip.run(Program().load(vmem_row=0, ext_addr=0x4000, rows=4, row_bytes=8).halt(),
                      base=0x80000)
    assert result.error is ErrorCode.AXI_ERROR and result.error_pc == 0
    chip.clear_errors()
    _good_program_after_reset(chip)


def test_fetch_errors(chip):
    _fresh(chip)
    result = chip.run(Program().halt(), base=0x80008)          # misaligned program
    assert result.error is ErrorCode.FETCH_ERROR
    chip.inject_error(0x90000, 0x90010, "decerr")
    result = chip.run(Program().halt(), base=0x90000)          # DECERR on fetch
    assert result.error is ErrorCode.FETCH_ERROR
    chip.clear_errors()
    _good_program_after_reset(chip)


def test_idle_gating_gives_the_same_results_and_cycles():
    """The fast build whose store engine and DMA (and vector unit, on a chip
    with one) run on a clock gated while idle (the default, docs/simulation.md)
    against the build that evaluates them every cycle: random programs under
    a stalling memory, then a store that meets an AXI error and a good program
    after it: the same errors, counters and memory."""
    timing = dict(mem_latency=(0, 12), mem_pause={ch: 30 for ch in ("aw", "w", "b", "ar", "r")},
                  seed=SEED)
    runs = []
    for gating in (True, False):
        chip = Chip(CFG, fast_mac=True, idle_gating=gating, **timing)
        runs.append(_programs_error_and_reset(chip, SEED + 300, chip.soft_reset))
    assert runs[0][4][0] is ErrorCode.AXI_ERROR
    assert all(r[2]["dma_write_bytes"] for r in runs[0][:4])
    assert runs[0] == runs[1]


def _programs_error_and_reset(chip, seed, reset):
    """Four random programs, a store that meets an AXI error, `reset` and a
    random program after it, on `chip`: (error, pc, counters, memory) of each."""
    results = []
    for case in range(4):
        rng = np.random.default_rng(seed + case)
        _fresh(chip)
        program = programs.random_program(CFG, rng)
        results.append(chip.run(program, programs.random_image(CFG, rng), base=0x80000))
    _fresh(chip)
    chip.inject_error(0x4000, 0x4100, "slverr")
    store = Program().store(vmem_row=0, ext_addr=0x4000, rows=4, row_bytes=8).halt()
    results.append(chip.run(store, base=0x80000))
    chip.clear_errors()
    reset()
    results.append(chip.run(programs.random_program(CFG, np.random.default_rng(seed + 4)),
                            base=0x80000))
    return [(r.error, r.error_pc, r.counters, bytes(r.memory)) for r in results]


def test_quiet_memory_cycles_give_the_same_results_and_cycles():
    """The memory model skips its step in the cycles where nothing is offered
    or in flight (docs/simulation.md): random programs with latency but no
    pauses (the skip's case), a store that meets an AXI error, a hard reset
    and a good program after it, against the model stepped in every cycle:
    the same errors, counters, cycles and memory."""
    runs = []
    for skip in (True, False):
        chip = Chip(CFG, mem_latency=(0, 12), seed=SEED)
        chip.device._lib.mxu_chip_skip_quiet_memory(chip.device._handle, skip)
        runs.append(_programs_error_and_reset(chip, SEED + 400, chip.reset))
    assert runs[0][4][0] is ErrorCode.AXI_ERROR
    assert all(r[2]["dma_read_bytes"] and r[2]["cycles"] for r in runs[0][:4])
    assert runs[0] == runs[1]


def _good_program_after_reset(chip):
    chip.soft_reset()
    rng = np.random.default_rng(SEED + 9)
    A = rng.standard_normal((5, 6)).astype(np.float32)
    B = rng.standard_normal((6, 3)).astype(np.float32)
    C = chip.matmul(A, B)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=CFG.rows), "after reset")


@pytest.mark.parametrize("case", range(8))
def test_random_programs_against_the_model(chip, case):
    rng = np.random.default_rng(SEED + 100 + case)
    _fresh(chip)
    program = programs.random_program(CFG, rng)
    image = programs.random_image(CFG, rng)
    result, model, expected = _both(chip, program, image)
    assert result.error is expected.error, f"seed {SEED + 100 + case}\n{program.listing()}"
    golden.assert_bits_equal(result.memory[:0x8000], model.ext[:0x8000],
                             f"random program (seed {SEED + 100 + case})")


@pytest.mark.parametrize("pause", [0, 50])
def test_cocotb_programs(pause, tmp_path):
    """The same programs through cocotb, with cocotbext-axi's AxiRam as memory
    (random pauses on every AXI channel at pause=50). On the 4x4 chip with the
    vector unit, whose Verilator build tests/test_sim_vector.py shares (a chip
    build costs two minutes; the programs here issue no VECTOR instruction, and
    the chip without it runs them natively above). Verilator only: under
    Icarus 11 the whole chip's handshakes read X in the first cycles
    (docs/testing.md); its units run on Icarus in their own regressions."""
    run_cocotb_chip("mxu.verif.tb_chip", pause, SEED, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("block", range(10))
def test_many_random_programs_against_the_model(chip, block):
    for case in range(10):
        seed = SEED + 1000 + 10 * block + case
        rng = np.random.default_rng(seed)
        _fresh(chip)
        program = programs.random_program(CFG, rng)
        result, model, expected = _both(chip, program, programs.random_image(CFG, rng))
        assert result.error is expected.error, f"seed {seed}"
        golden.assert_bits_equal(result.memory[:0x8000], model.ext[:0x8000],
                                 f"random program (seed {seed})")
