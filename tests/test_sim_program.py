"""Program-level tests on the whole chip (fast native path): every instruction,
hazards through VMEM and the accumulator, every error code followed by a soft
reset and a good program, and random programs against the ISA's functional model."""

import numpy as np
import pytest

from chip_configs import TINY
from mxu.hdl.isa import ErrorCode, Opcode, encode
from mxu.sim.chip import Chip
from mxu.sim.program import Program
from mxu.verif import golden
from mxu.verif.isa_model import IsaModel

SEED = 20261122
CFG = TINY
ROW_B = CFG.vmem_row_bytes       # bytes in a VMEM row
ACC_B = CFG.acc_row_bytes        # bytes in an accumulator row


@pytest.fixture(scope="module")
def chip():
    return Chip(CFG)


def _both(chip, program, image, base=0x80000):
    """Run on the chip and on the functional model; return (chip result, model)."""
    model = IsaModel(CFG)
    for addr, data in image.items():
        data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
        model.ext[addr:addr + data.size] = data
    code = program.to_bytes()
    model.ext[base:base + len(code)] = np.frombuffer(code, np.uint8)
    expected = model.run(code, base)
    result = chip.run(program, image, base=base)
    return result, model, expected


def _fresh(chip):
    chip.clear_errors()
    chip.soft_reset()
    chip.memory[:] = 0


def _bf16_bits(rng, shape):
    return rng.standard_normal(shape).astype(golden.bf16).view(np.uint16)


def test_every_instruction_against_the_model(chip):
    _fresh(chip)
    rng = np.random.default_rng(SEED)
    acts = _bf16_bits(rng, (6, 4))
    weights = _bf16_bits(rng, (3, 4))
    bias = rng.standard_normal((2, 4)).astype(np.float32)
    p = Program()
    p.load(vmem_row=0, ext_addr=0x000, rows=6, row_bytes=8)                  # activations
    p.load(vmem_row=8, ext_addr=0x100, rows=3, row_bytes=8)                  # 3 of 4 weight rows
    p.load(acc_row=20, ext_addr=0x200, rows=2, row_bytes=16, push_next=True)  # bias rows
    p.loadw(vmem_row=8, k_rows=3, pop_prev=True)
    p.matmul(act_row=0, m_rows=6, out_row=0, seed="bias", seed_row=20, new_weights=True)
    p.matmul(act_row=0, m_rows=6, out_row=8, seed="acc", seed_row=0)          # same weights
    p.matmul(act_row=2, m_rows=2, out_row=16, seed="zero", push_next=True)
    p.store(acc_row=0, ext_addr=0x1000, rows=16, row_bytes=16, pop_prev=True)
    p.store(acc_row=8, ext_addr=0x2000, rows=6, row_bytes=8, to_bf16=True, relu=True)
    p.store(vmem_row=0, ext_addr=0x3000, rows=6, row_bytes=8, relu=True, push_prev=True)
    p.sync("compute", pop_next=True, push_prev=True)
    p.sync("load", pop_next=True)
    p.halt()
    image = {0x000: acts, 0x100: weights, 0x200: bias}
    result, model, expected = _both(chip, p, image)
    assert result.error is ErrorCode.NONE and expected.error is ErrorCode.NONE
    for lo, hi in [(0x1000, 0x1100), (0x2000, 0x2030), (0x3000, 0x3030)]:
        golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], f"bytes {lo:#x}")
    assert result.counters["instructions"] == len(p)
    assert result.counters["array_active"] == 14


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
    result, model, expected = _both(chip, p, {0: _bf16_bits(rng, (8, 4))})
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
    image = {0: _bf16_bits(rng, (8, 4)), 0x100: _bf16_bits(rng, (4, 4))}
    result, model, _ = _both(chip, p, image)
    assert result.ok
    golden.assert_bits_equal(result.memory[0x1000:0x1080], model.ext[0x1000:0x1080], "VMEM RAW/WAR")


def _error_programs():
    ok_load = dict(vmem_row=0, ext_addr=0, rows=1, row_bytes=8)
    cases = {}
    cases["illegal opcode"] = (Program().raw(encode(Opcode.HALT) & ~0xF | 7).halt(),
                               ErrorCode.ILLEGAL_INSTR, 0)
    cases["reserved bits"] = (Program().load(**ok_load).raw(encode(Opcode.HALT) | 1 << 100),
                              ErrorCode.ILLEGAL_INSTR, 1)
    cases["no halt"] = (Program().load(**ok_load), ErrorCode.ILLEGAL_INSTR, 1)
    cases["flag the engine lacks"] = (Program().load(**ok_load, pop_prev=True).halt(),
                                      ErrorCode.ILLEGAL_INSTR, 0)
    cases["vmem range"] = (Program().loadw(vmem_row=CFG.vmem_rows - 2, k_rows=4).halt(),
                           ErrorCode.VMEM_RANGE, 0)
    cases["acc range"] = (Program().matmul(act_row=0, m_rows=4, out_row=CFG.acc_rows - 2).halt(),
                          ErrorCode.ACC_RANGE, 0)
    cases["no weights"] = (Program().matmul(act_row=0, m_rows=1, out_row=0, new_weights=True).halt(),
                           ErrorCode.NO_WEIGHTS, 0)
    cases["misaligned dma"] = (Program().load(vmem_row=0, ext_addr=1, rows=1, row_bytes=8).halt(),
                               ErrorCode.DMA_DESCRIPTOR, 0)
    cases["dma chip range"] = (Program().load(vmem_row=CFG.vmem_rows - 1, ext_addr=0, rows=2,
                                              row_bytes=8).halt(), ErrorCode.DMA_DESCRIPTOR, 0)
    cases["weight overflow"] = (Program().loadw(vmem_row=0, k_rows=4).loadw(vmem_row=0, k_rows=4)
                                .halt(), ErrorCode.WEIGHT_OVERFLOW, 1)
    cases["deadlock"] = (Program().loadw(vmem_row=0, k_rows=4, pop_prev=True).halt(),
                         ErrorCode.DEADLOCK, None)
    return cases


@pytest.mark.parametrize("case", list(_error_programs()))
def test_error_then_soft_reset_then_good_program(chip, case):
    program, code, pc = _error_programs()[case]
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


def _good_program_after_reset(chip):
    chip.soft_reset()
    rng = np.random.default_rng(SEED + 9)
    A = rng.standard_normal((5, 6)).astype(np.float32)
    B = rng.standard_normal((6, 3)).astype(np.float32)
    C = chip.matmul(A, B)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=CFG.rows), "after reset")


def _random_program(rng):
    """Random instructions with random fields, fenced with tokens so that every
    instruction that shares data with another is ordered after it (a race-free
    program has exactly one outcome, the model's)."""
    p = Program()
    # Define every on-chip row the program may read: memories keep their contents
    # across runs, and the model starts from this image.
    p.load(vmem_row=0, ext_addr=0, rows=32, row_bytes=ROW_B)
    p.load(acc_row=0, ext_addr=0x200, rows=32, row_bytes=ACC_B, push_next=True)
    p.sync("compute", pop_prev=True)
    staged = 0
    for _ in range(int(rng.integers(8, 20))):
        kind = rng.choice(["load_v", "load_a", "loadw", "matmul", "store_a", "store_v"])
        if kind == "loadw" and staged:
            kind = "matmul"           # a second unused tile is WEIGHT_OVERFLOW
        if kind in ("load_v", "load_a"):
            acc = kind == "load_a"
            rows = int(rng.integers(1, 9))
            row_bytes = int(rng.integers(1, (ACC_B if acc else ROW_B) // 2 + 1)) * 2
            row_bytes -= row_bytes % (4 if acc else 2)
            row_bytes = max(row_bytes, 4 if acc else 2)
            where = {"acc_row": int(rng.integers(0, 24))} if acc else {"vmem_row": int(rng.integers(0, 24))}
            p.sync("compute", push_prev=True)      # earlier compute work is done
            p.load(**where, ext_addr=int(rng.integers(0, 64)) * 4, rows=rows, row_bytes=row_bytes,
                   ext_stride=row_bytes + 4 * int(rng.integers(0, 3)), pop_next=True,
                   push_next=True)
            p.sync("compute", pop_prev=True, push_prev=True)
            p.sync("load", pop_next=True)
        elif kind == "loadw":
            p.loadw(vmem_row=int(rng.integers(0, 28)), k_rows=int(rng.integers(0, 5)))
            staged += 1
        elif kind == "matmul":
            mode = rng.choice(["zero", "acc", "bias"])
            switch = staged == 1 and bool(rng.integers(0, 2))
            p.matmul(act_row=int(rng.integers(0, 28)), m_rows=int(rng.integers(1, 6)),
                     out_row=int(rng.integers(0, 26)), seed=mode, seed_row=int(rng.integers(0, 26)),
                     new_weights=switch)
            staged -= switch
        else:
            acc = kind == "store_a"
            where = {"acc_row": int(rng.integers(0, 28))} if acc else {"vmem_row": int(rng.integers(0, 28))}
            to_bf16 = acc and bool(rng.integers(0, 2))
            width = (ACC_B // 2 if to_bf16 else ACC_B) if acc else ROW_B
            p.sync("compute", push_next=True)
            p.store(**where, ext_addr=0x4000 + int(rng.integers(0, 64)) * 4,
                    rows=int(rng.integers(1, 5)), row_bytes=width, ext_stride=width + 8,
                    to_bf16=to_bf16, relu=bool(rng.integers(0, 2)), pop_prev=True, push_prev=True)
            p.sync("compute", pop_next=True)
    p.sync("compute", push_next=True)
    p.store(acc_row=0, ext_addr=0x6000, rows=32, row_bytes=ACC_B, pop_prev=True)
    return p.halt()


@pytest.mark.parametrize("case", range(8))
def test_random_programs_against_the_model(chip, case):
    rng = np.random.default_rng(SEED + 100 + case)
    _fresh(chip)
    program = _random_program(rng)
    finite = rng.standard_normal(1024).astype(golden.bf16).view(np.uint16)
    image = {0: finite, 0x200: rng.standard_normal(32 * ACC_B // 4).astype(np.float32)}
    result, model, expected = _both(chip, program, image)
    assert result.error is expected.error, f"seed {SEED + 100 + case}\n{program.listing()}"
    golden.assert_bits_equal(result.memory[:0x8000], model.ext[:0x8000],
                             f"random program (seed {SEED + 100 + case})")
