"""The matmul compiler, checked without a Verilator build (docs/compiler.md):
every compiled program runs on the ISA functional model and must equal the
golden model bit for bit; programs with loops must issue exactly the
instructions of their fully spelled-out twins; programs stay small."""

import re

import numpy as np
import pytest

from chip_configs import SHAPES
from mxu.hdl import ChipConfig
from mxu.hdl.isa import Opcode, decode
from mxu.sim.compiler.matmul import compile_matmuls
from mxu.sim.compiler.operands import MatmulOp, Operand
from mxu.sim.compiler.plan import max_k_tiles, plan_op
from mxu.verif import golden
from mxu.verif.hazards import races
from mxu.verif.isa_model import IsaModel, expand_loops

SEED = 20261124


class Memory:
    """A bump allocator over an `IsaModel`'s external memory, for test operands."""

    def __init__(self, config):
        self.model = IsaModel(config)
        self.top = 0

    def put(self, array, dtype):
        data = np.ascontiguousarray(array.astype(golden.bf16 if dtype == "bf16" else np.float32))
        addr = self.top
        self.model.ext[addr:addr + data.nbytes] = data.view(np.uint8).ravel()
        self.top += -(-data.nbytes // 64) * 64
        return Operand(addr, data.shape[0], data.shape[1], data.shape[1] * data.itemsize, dtype)

    def empty(self, rows, cols, dtype):
        return self.put(np.zeros((rows, cols), np.float32), dtype)

    def get(self, op):
        dt = golden.bf16 if op.dtype == "bf16" else np.float32
        rows = [self.model.ext[op.addr + i * op.stride: op.addr + i * op.stride + op.row_bytes]
                for i in range(op.rows)]
        return np.stack(rows).view(dt).reshape(op.rows, op.cols)

    def run(self, ops, loops=True, handoffs=True):
        compiled = compile_matmuls(self.model.config, ops, loops=loops, handoffs=handoffs)
        assert races(self.model.config, compiled.program) == []
        code = compiled.program.to_bytes()
        base = -(-self.top // 0x10000) * 0x10000
        self.model.ext[base:base + len(code)] = np.frombuffer(code, np.uint8)
        result = self.model.run(code, base)
        assert result.error.name == "NONE", (result, compiled.program.listing()[:4000])
        return compiled


def _issued(config, program):
    b = program.to_bytes()
    words = [int.from_bytes(b[i:i + 16], "little") for i in range(0, len(b), 16)]
    out = []
    for _, word in expand_loops(config, words):
        if word is None:
            return out
        out.append(word)


def _want(A, B, bias=None, relu=False, bf16_out=False, rows=1):
    M, N = A.shape[0], B.shape[1]
    seed = None if bias is None else np.broadcast_to(bias.astype(np.float32), (M, N))
    C = golden.matmul(A, B, seed=seed, rows=rows)
    if relu:
        C = np.where(np.isnan(C) | (C > 0), C, np.float32(0)).astype(np.float32)
    if bf16_out:
        C = golden.fp32_to_bf16(golden.f32_bits(C)).view(golden.bf16)
    return C


def _check(config, M, K, N, bias=None, relu=False, bf16_out=False, seed=SEED):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(golden.bf16)
    B = rng.standard_normal((K, N)).astype(golden.bf16)
    mem = Memory(config)
    bias_values = None
    if bias == "row":
        bias_values = rng.standard_normal((1, N)).astype(np.float32)
    elif bias == "matrix":
        bias_values = rng.standard_normal((M, N)).astype(np.float32)
    op = MatmulOp(mem.put(A, "bf16"), mem.put(B, "bf16"),
                  mem.empty(M, N, "bf16" if bf16_out else "fp32"),
                  None if bias_values is None else mem.put(bias_values, "fp32"), relu)
    compiled = mem.run([op])
    literal = compile_matmuls(config, [op], loops=False)
    assert _issued(config, compiled.program) == _issued(config, literal.program)
    got = mem.get(op.c)
    want = _want(A, B, bias_values, relu, bf16_out, config.rows)
    golden.assert_bits_equal(got.view(np.uint16 if bf16_out else np.uint32),
                             want.view(np.uint16 if bf16_out else np.uint32),
                             f"{M}x{K}x{N} bias={bias}", seed=seed)
    return compiled


@pytest.mark.parametrize("shape", ["1x1", "4x4", "3x5", "8x8"])
@pytest.mark.parametrize("M, K, N", [(1, 1, 1), (9, 13, 11), (40, 70, 33), (64, 64, 64)])
def test_matmuls_on_the_model(shape, M, K, N):
    _check(SHAPES[shape], M, K, N)


@pytest.mark.parametrize("bias, relu, bf16_out", [("row", False, False), ("matrix", True, False),
                                                  ("row", True, True), (None, False, True)])
def test_bias_relu_and_bf16_output(bias, relu, bf16_out):
    _check(SHAPES["4x4"], 37, 50, 29, bias, relu, bf16_out)


@pytest.mark.parametrize("M", [3, 5])
def test_short_ops_load_further_ahead(M):
    """bf16 weights of an op of at most `SHORT_ROWS` rows (a decode step's
    attention heads) have a weight ring of `SHORT_RING_SLOTS` steps, others
    `RING_SLOTS` (docs/compiler.md, "Tiling"): two ops of each in one
    program, race-free on the ISA model, bit-exact, the same instructions
    with loops or spelled out, each step's loads waiting for the MATMUL a
    lead earlier."""
    from mxu.sim.compiler.plan import RING_SLOTS, SHORT_RING_SLOTS, SHORT_ROWS, lead
    config, rng = SHAPES["4x4"], np.random.default_rng(SEED + M)
    mem, ops, want = Memory(config), [], []
    for _ in range(2):
        A = rng.standard_normal((M, 5 * config.rows)).astype(golden.bf16)
        B = rng.standard_normal((5 * config.rows, 3 * config.cols + 1)).astype(golden.bf16)
        ops.append(MatmulOp(mem.put(A, "bf16"), mem.put(B, "bf16"),
                            mem.empty(M, B.shape[1], "fp32"), None, False))
        want.append(_want(A, B, rows=config.rows))
    W = SHORT_RING_SLOTS if M <= SHORT_ROWS else RING_SLOTS
    assert [lead(op, config) for op in ops] == [W, W]
    compiled, literal = mem.run(ops), compile_matmuls(config, ops, loops=False).program
    assert _issued(config, compiled.program) == _issued(config, literal)
    # The weight tiles loaded before the first MATMUL: the ring's lead.
    first = next(i for i, t in enumerate(literal.text) if t.startswith("MATMUL"))
    b = ops[0].b
    ahead = [t for t in literal.text[:first] if t.startswith("LOAD ")
             and b.addr <= int(re.search(r"ext_addr=(\d+)", t).group(1)) < b.addr + b.rows * b.stride]
    assert len(ahead) == W, ahead
    for op, w in zip(ops, want):
        golden.assert_bits_equal(mem.get(op.c).view(np.uint32), w.view(np.uint32), f"M={M}")


def test_the_default_chip_loops_its_tiles():
    compiled = _check(ChipConfig(), 128, 384, 384)
    literal = compile_matmuls(ChipConfig(), [_op(128, 384, 384)], loops=False)
    assert len(compiled.program) < len(literal.program) / 3


def test_a_frozen_program_is_its_image_and_lists_the_same_values():
    """`Program.frozen` (the runtime cache's form) keeps the image, the words
    and the length; each listing line names the same opcode, flags set and
    field values as the program's own, LOOP bodies included."""
    from mxu.sim.compiler.program import FrozenProgram, _Nested
    program = compile_matmuls(ChipConfig(), [_op(128, 384, 384)]).program
    frozen = program.frozen()
    assert isinstance(frozen, FrozenProgram) and len(frozen) == len(program)
    assert frozen.to_bytes() == program.to_bytes()
    assert list(frozen.words) == [int(w) for w in program.words]
    assert frozen.words[-1] == program.words[-1] and frozen.text[-1] == list(frozen.text)[-1]
    def number(v):
        return int(getattr(v, "value", v))
    opcodes = set()
    for i, line in enumerate(frozen.text):
        own = program.text[i]
        assert len(line) - len(line.lstrip()) == len(own) - len(own.lstrip()), (line, own)
        if own.strip() == "(delta)":
            assert line == own
            continue
        entry = program.text.entry(i)
        while isinstance(entry, _Nested):
            entry = entry.entry
        opcode, fields, deps = entry
        line = line.strip()
        opcodes.add(opcode.name)
        assert line.startswith(opcode.name + " "), (line, entry)
        for name, value in fields.items():
            if isinstance(value, dict):
                for flag, v in value.items():
                    assert (f"'{flag}': {number(v)}" in line) == bool(number(v)), (line, entry)
            else:
                assert f"{name}={number(value)}" in line, (line, entry)
        assert line.endswith("]") == any(deps.values()), (line, entry)
    assert {"LOOP", "LOAD", "LOADW", "MATMUL", "STORE"} <= opcodes
    with pytest.raises(ValueError, match="whole 16-byte instructions, not 17 bytes"):
        FrozenProgram(bytes(17))


def _op(M, K, N, base=0):
    a = Operand(base, M, K, 2 * K, "bf16")
    b = Operand(base + 2 * M * K, K, N, 2 * N, "bf16")
    c = Operand(base + 2 * M * K + 2 * K * N, M, N, 4 * N, "fp32")
    return MatmulOp(a, b, c)


def test_program_bytes_stay_under_one_percent_of_the_operands():
    op = _op(1024, 1024, 1024)
    compiled = compile_matmuls(ChipConfig(), [op])
    operand_bytes = 2 * 1024 * 1024 * 2 + 4 * 1024 * 1024
    assert len(compiled.program.to_bytes()) <= 0.01 * operand_bytes


def test_the_plan_respects_field_widths():
    config = ChipConfig(rows=1, cols=1, vmem_bytes=1 << 20)
    plan = plan_op(config, 65536, 1, 1)
    assert plan.Mb <= 65535


def test_a_k_that_cannot_fit_is_refused_by_the_compiler_and_split_by_the_runtime():
    config = SHAPES["4x4"]
    K = 4 * (config.vmem_rows + 10)
    with pytest.raises(ValueError, match="does not fit the chip"):
        compile_matmuls(config, [_op(2, K, 3)])
    assert 0 < max_k_tiles(config, 2, 3, "matrix") < K // 4


def test_k_chunks_seeded_from_partial_sums_equal_the_whole():
    """What the runtime does when K does not fit: chunks of whole K tiles, each
    seeded (as a matrix bias) with the previous chunk's fp32 result."""
    config, rng = SHAPES["3x5"], np.random.default_rng(SEED + 1)
    M, K, N = 7, 40, 12
    A = rng.standard_normal((M, K)).astype(golden.bf16)
    B = rng.standard_normal((K, N)).astype(golden.bf16)
    mem = Memory(config)
    a, b, c = mem.put(A, "bf16"), mem.put(B, "bf16"), mem.empty(M, N, "fp32")
    ops, seed = [], None
    for k0 in range(0, K, 9):                    # 9 = 3 K tiles of the 3-row array
        k1 = min(K, k0 + 9)
        a_k = Operand(a.addr + 2 * k0, M, k1 - k0, a.stride, "bf16")
        b_k = Operand(b.addr + k0 * b.stride, k1 - k0, N, b.stride, "bf16")
        ops.append(MatmulOp(a_k, b_k, c, seed))
        seed = c
    compiled = mem.run(ops)
    assert len(compiled.segments) == len(ops)            # each chunk waits for the last
    golden.assert_bits_equal(mem.get(c), golden.matmul(A, B, rows=config.rows), "K chunks")


def test_independent_matmuls_share_one_segment_and_dependent_ones_wait():
    config, rng = SHAPES["4x4"], np.random.default_rng(SEED + 2)
    mem = Memory(config)
    heads = []
    for _ in range(6):
        Q = rng.standard_normal((16, 8)).astype(golden.bf16)
        Kt = rng.standard_normal((8, 16)).astype(golden.bf16)
        heads.append((Q, Kt, MatmulOp(mem.put(Q, "bf16"), mem.put(Kt, "bf16"),
                                      mem.empty(16, 16, "bf16"))))
    V = rng.standard_normal((16, 8)).astype(golden.bf16)
    v = mem.put(V, "bf16")
    follow = MatmulOp(heads[0][2].c, v, mem.empty(16, 8, "fp32"))      # reads head 0's output
    compiled = mem.run([h[2] for h in heads] + [follow])
    assert [len(s) for s in compiled.segments] == [6, 1]
    for Q, Kt, op in heads:
        want = _want(Q, Kt, bf16_out=True, rows=4)
        golden.assert_bits_equal(mem.get(op.c).view(np.uint16), want.view(np.uint16), "head")
    P = _want(heads[0][0], heads[0][1], bf16_out=True, rows=4)
    golden.assert_bits_equal(mem.get(follow.c), golden.matmul(P, V, rows=4), "dependent")


def test_strided_views_as_operands():
    """Column and row slices of larger matrices, as device tensor views give."""
    config, rng = SHAPES["4x4"], np.random.default_rng(SEED + 3)
    big_a = rng.standard_normal((20, 30)).astype(golden.bf16)
    big_b = rng.standard_normal((40, 24)).astype(golden.bf16)
    mem = Memory(config)
    a, b = mem.put(big_a, "bf16"), mem.put(big_b, "bf16")
    a_view = Operand(a.addr + 3 * a.stride + 2 * 5, 12, 17, a.stride, "bf16")     # [3:15, 5:22]
    b_view = Operand(b.addr + 10 * b.stride + 2 * 4, 17, 9, b.stride, "bf16")     # [10:27, 4:13]
    op = MatmulOp(a_view, b_view, mem.empty(12, 9, "fp32"))
    mem.run([op])
    want = golden.matmul(big_a[3:15, 5:22], big_b[10:27, 4:13], rows=4)
    golden.assert_bits_equal(mem.get(op.c), want, "views")


@pytest.mark.parametrize("field, value, message", [
    ("a", Operand(1, 2, 2, 4, "bf16"), "multiples of the 2-byte element"),
    ("c", Operand(0, 2, 3, 12, "fp32"), "overlaps the input a"),
    ("b", Operand(0, 3, 3, 6, "bf16"), "inner dimensions differ"),
    ("a", Operand(0, 2, 2, 8, "fp32"), "a and b must be bf16")])
def test_bad_operands_are_refused(field, value, message):
    ops = dict(a=Operand(0, 2, 2, 4, "bf16"), b=Operand(64, 2, 3, 6, "bf16"),
               c=Operand(128, 2, 3, 12, "fp32"))
    ops[field] = value
    with pytest.raises(ValueError, match=message):
        compile_matmuls(SHAPES["4x4"], [MatmulOp(**ops)])


def test_the_hazard_checker_sees_a_missing_token(monkeypatch):
    """Every program above is checked race-free; this one must not be: without
    the store->compute pop, a MATMUL may overwrite an output buffer that is still
    being stored (the model alone often gets the numbers right by luck)."""
    from mxu.sim.compiler.program import Program
    matmul = Program.matmul

    def without_pop(self, **kw):
        kw["pop_next"] = False
        return matmul(self, **kw)

    config = SHAPES["4x4"]
    program = compile_matmuls(config, [_op(40, 20, 64)]).program
    assert races(config, program) == []
    monkeypatch.setattr(Program, "matmul", without_pop)
    program = compile_matmuls(config, [_op(40, 20, 64)]).program
    found = races(config, program)
    assert found and found[0][0][0] == "acc", found


def test_small_k_with_a_matrix_bias_and_one_row_plans():
    """A one-row Linear (its bias is then a 1 x N matrix) with K of one tile
    needs wide groups so that bias buffers are not refilled too early."""
    _check(ChipConfig(), 1, 16, 80, "matrix")
    _check(SHAPES["4x4"], 2, 4, 40, "matrix")


def test_blocks_shorter_than_the_ring_get_more_activation_buffers():
    """M far beyond one accumulator block with one K tile and one N tile: each
    block is a single step, so its activation buffer is reused only after more
    blocks than two (M = 20000, K = N = 16 on the default chip is this case)."""
    config = SHAPES["4x4"]
    compiled = _check(config, 1500, 4, 4)
    (_, plan), = compiled.segments[0]
    assert plan.blocks > 2 and plan.a_buffers > 2


# ---- hand-offs in VMEM (docs/compiler.md) ------------------------------------------------

def _layer_ops(mem, rng, M, K, F, N, kind, transient):
    """x @ W1 + b1 with a fused `kind` epilogue into h (bf16), then h @ W2: the
    FFN pattern whose h can stay in VMEM. h starts as NaNs, to show whether it
    was written."""
    from dataclasses import replace
    from mxu.sim.compiler.epilogue import Epilogue
    a = mem.put(rng.standard_normal((M, K)), "bf16")
    w1 = mem.put(rng.standard_normal((K, F)) * 0.3, "bf16")
    b1 = mem.put(rng.standard_normal((1, F)), "fp32")
    w2 = mem.put(rng.standard_normal((F, N)) * 0.3, "bf16")
    ep = dict(gelu=Epilogue("gelu"), softmax=Epilogue("softmax", scale=0.5))[kind]
    h = replace(mem.put(np.full((M, F), np.nan), "bf16"), transient=transient)
    return [MatmulOp(a, w1, h, b1, epilogue=ep), MatmulOp(h, w2, mem.empty(M, N, "fp32"))]


def _dma_count(config, program, operand):
    """LOADs and STOREs issued whose external address lies in `operand`."""
    from mxu.hdl.isa import Opcode, decode
    lo, hi = operand.span
    count = 0
    for word in _issued(config, program):
        op, f = decode(word)
        if op in (Opcode.LOAD, Opcode.STORE) and lo <= f["ext_addr"] < hi:
            count += 1
    return count


@pytest.mark.parametrize("kind, M, K, F, N, acc", [
    ("gelu", 8, 8, 16, 8, None), ("gelu", 37, 12, 24, 9, None), ("gelu", 64, 16, 64, 12, 1 << 10),
    ("softmax", 8, 8, 16, 8, None), ("softmax", 37, 12, 24, 9, None)])
def test_an_epilogue_hands_its_result_to_the_next_matmul_in_vmem(kind, M, K, F, N, acc):
    """The consumer reads h from VMEM, not external memory: the same bits as
    the program that stores and loads it; a transient h is never written (its
    NaNs stay), a kept one is written as before. An accumulator small enough
    (`acc` bytes) cuts the consumer into M blocks, each its own region."""
    from mxu.sim.compiler.handoff import plan_handoffs
    config = SHAPES["4x4"].replace(vpu=True, **({} if acc is None else {"acc_bytes": acc}))
    results = {}
    for name, transient, handoffs in [("stored", False, False), ("kept", False, True),
                                      ("transient", True, True)]:
        mem = Memory(config)
        ops = _layer_ops(mem, np.random.default_rng(SEED + 9), M, K, F, N, kind, transient)
        compiled = mem.run(ops, handoffs=handoffs)
        results[name] = mem.get(ops[1].c), mem.get(ops[0].c), compiled, ops
    ho = plan_handoffs(config, results["transient"][3])
    assert [(h.consumer, [s.producer for s in h.sources]) for h in ho.items] == [(1, [0])]
    assert ho.keeps(0, results["transient"][3][0].c)
    assert not plan_handoffs(config, results["kept"][3]).keeps(0, results["kept"][3][0].c)
    if acc is not None:
        assert ho.items[0].plan.blocks > 1
    out, h, _, ops = results["stored"]
    for name in ("kept", "transient"):
        golden.assert_bits_equal(results[name][0], out, name)
    golden.assert_bits_equal(results["kept"][1].view(np.uint16), h.view(np.uint16), "kept h")
    assert np.isnan(results["transient"][1].astype(np.float32)).all()
    stored, kept, transient = (_dma_count(config, results[n][2].program, ops[0].c)
                               for n in ("stored", "kept", "transient"))
    assert transient == 0 < kept < stored


@pytest.mark.parametrize("kind, M, K, F", [("gelu", 37, 12, 24), ("softmax", 8, 40, 16),
                                           ("gelu", 40, 4, 4)])
def test_a_groups_last_matmul_hands_its_epilogue_the_token(kind, M, K, F):
    """The epilogue of a fused group waits for its last MATMUL's own token,
    not for a SYNC on compute, which would hold the compute queue until the
    array had drained (docs/compiler.md, "Schedule and tokens"). Only a last
    MATMUL that also pops a store token (a group of one step) keeps the
    SYNC. The results are the golden model's, bit for bit."""
    config = SHAPES["4x4"].replace(vpu=True)
    mem = Memory(config)
    ops = _layer_ops(mem, np.random.default_rng(SEED + 10), M, K, F, 4, kind, False)
    compiled = mem.run(ops, handoffs=False)
    pushes, syncs, last = 0, 0, None
    for word in _issued(config, compiled.program):
        op, f = decode(word)
        to_vector = f["deps"]["push_next"] and f["flags"].get("vector")
        if op is Opcode.MATMUL:
            last = f
            pushes += bool(to_vector)
        elif op is Opcode.SYNC and f["flags"]["engine"] == 1 and to_vector:
            assert last["deps"]["pop_next"], "a SYNC drains the array after a MATMUL that could push"
            syncs += 1
    plan = compiled.segments[0][0][1]
    groups = sum(len(plan.groups_of_block(last=b == plan.blocks - 1)) for b in range(plan.blocks))
    assert pushes > 0 and pushes + syncs == groups
    golden.assert_bits_equal(mem.get(ops[0].c).view(np.uint16), _golden_h(config, kind, M, K, F),
                             kind)


def _golden_h(config, kind, M, K, F):
    """h of `_layer_ops` (drawn from the same generator) by the golden model:
    ``bf16(kind(x @ W1 + b1))`` in the VPU form."""
    from mxu.verif import vpu
    rng = np.random.default_rng(SEED + 10)
    a, w1, b1 = (rng.standard_normal((M, K)), rng.standard_normal((K, F)) * 0.3,
                 rng.standard_normal((1, F)).astype(np.float32))
    r = golden.matmul(a.astype(golden.bf16), w1.astype(golden.bf16),
                      seed=np.broadcast_to(b1, (M, F)), rows=config.rows)
    out = (vpu.gelu(r) if kind == "gelu" else
           vpu.softmax(vpu.scale(r, 0.5), np.ones((1, F), bool), lanes=config.cols))
    return golden.fp32_to_bf16(golden.f32_bits(out))


def test_a_layer_norm_hands_its_bf16_copy_and_keeps_the_fp32_result():
    """add_layer_norm with an fp32 result and a transient bf16 copy that the
    next matmul reads: the copy stays in VMEM, the fp32 result is stored."""
    from dataclasses import replace
    from mxu.sim.compiler.epilogue import Epilogue
    config, rng = SHAPES["4x4"].replace(vpu=True), np.random.default_rng(SEED + 10)
    M, K, N, F = 16, 8, 12, 8
    mem = Memory(config)
    a, w1 = mem.put(rng.standard_normal((M, K)), "bf16"), mem.put(rng.standard_normal((K, N)), "bf16")
    res = mem.put(rng.standard_normal((M, N)), "fp32")
    params = mem.put(np.stack([rng.standard_normal(N), rng.standard_normal(N), np.ones(N)]), "fp32")
    x1, x1b = mem.empty(M, N, "fp32"), replace(mem.put(np.full((M, N), np.nan), "bf16"),
                                               transient=True)
    w2 = mem.put(rng.standard_normal((N, F)), "bf16")
    ep = Epilogue("add_layer_norm", extra=x1b, other=res, params=params, eps=1e-5)
    ops = [MatmulOp(a, w1, x1, epilogue=ep), MatmulOp(x1b, w2, mem.empty(M, F, "fp32"))]
    compiled = mem.run(ops)
    assert _dma_count(config, compiled.program, x1b) == 0
    assert np.isnan(mem.get(x1b).astype(np.float32)).all()
    want_b = golden.fp32_to_bf16(golden.f32_bits(mem.get(x1))).view(golden.bf16)
    golden.assert_bits_equal(mem.get(ops[1].c), golden.matmul(want_b, mem.get(w2), rows=4),
                             "from the bf16 copy")


@pytest.mark.parametrize("consumer", [True, False])
def test_an_add_rms_norm_hands_its_norm_or_stores_it_tile_by_tile(consumer):
    """add_rms_norm (a decoder's output projection): its fp32 sum is stored;
    its transient bf16 norm, read by the next matmul, stays in VMEM (never
    written; the norm's last pass writes it there itself); without a reader
    it is stored, each tile's STORE after that tile's last VECTOR. Race-free,
    and the bits of the golden VPU form."""
    from dataclasses import replace
    from mxu.sim.compiler.epilogue import Epilogue
    from mxu.verif import vpu
    config, rng = SHAPES["4x4"].replace(vpu=True), np.random.default_rng(SEED + 12)
    M, K, N, F = 8, 8, 16, 8
    mem = Memory(config)
    A = rng.standard_normal((M, K)).astype(golden.bf16)
    W1 = rng.standard_normal((K, N)).astype(golden.bf16)
    R = rng.standard_normal((M, N)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal((1, N))).astype(np.float32)
    a, w1, res, params = (mem.put(A, "bf16"), mem.put(W1, "bf16"), mem.put(R, "fp32"),
                          mem.put(gamma, "fp32"))
    x1 = mem.empty(M, N, "fp32")
    x1b = replace(mem.put(np.full((M, N), np.nan), "bf16"), transient=consumer)
    ep = Epilogue("add_rms_norm", extra=x1b, other=res, params=params, eps=1e-5)
    ops = [MatmulOp(a, w1, x1, epilogue=ep)]
    if consumer:
        W2 = rng.standard_normal((N, F)).astype(golden.bf16)
        ops.append(MatmulOp(x1b, mem.put(W2, "bf16"), mem.empty(M, F, "fp32")))
    compiled = mem.run(ops)
    x = golden.matmul(A, W1, rows=config.rows) + R
    golden.assert_bits_equal(mem.get(x1), x, "the sum")
    norm = golden.fp32_to_bf16(golden.f32_bits(vpu.rms_norm(x, gamma[0], 1e-5, lanes=config.cols)))
    if consumer:
        assert _dma_count(config, compiled.program, x1b) == 0
        assert np.isnan(mem.get(x1b).astype(np.float32)).all()
        golden.assert_bits_equal(mem.get(ops[1].c),
                                 golden.matmul(norm.view(golden.bf16), W2, rows=config.rows),
                                 "from the norm in VMEM")
    else:
        golden.assert_bits_equal(mem.get(x1b).view(np.uint16), norm, "the stored norm")
        assert _each_sum_store_follows_its_add(config, compiled.program, x1) == M * N // config.cols


def _each_sum_store_follows_its_add(config, program, out):
    """How many rows the STOREs into `out` move, after checking that each
    one takes its own vector token and comes after the ADD that last wrote
    its rows (add_rms_norm's sum, tile by tile, when its STOREs bound the
    tail: docs/compiler.md, "Norm tails")."""
    from mxu.hdl.isa import Opcode, VpuOp, decode
    lo, hi = out.span
    written, rows = {}, 0
    for word in _issued(config, program):
        op, f = decode(word)
        if op == Opcode.VECTOR and not f["flags"]["to_vmem"]:
            written[f["dst_row"]] = (f["op"], f["rows"], f["deps"]["push_next"])
        elif op == Opcode.STORE and lo <= f["ext_addr"] < hi:
            assert f["deps"]["pop_prev"] and f["flags"]["vector"], "a STORE without its own token"
            assert written.get(f["chip_row"]) == (VpuOp.ADD.value, f["rows"], 1), \
                "a STORE of the sum before the add of its tile"
            rows += f["rows"]
    return rows


def test_a_transient_result_another_op_reads_is_still_stored():
    from mxu.sim.compiler.handoff import plan_handoffs
    config, rng = SHAPES["4x4"].replace(vpu=True), np.random.default_rng(SEED + 11)
    mem = Memory(config)
    ops = _layer_ops(mem, rng, 8, 8, 16, 8, "gelu", True)
    X = rng.standard_normal((4, 8)).astype(golden.bf16)
    h = ops[0].c
    h_cols = Operand(h.addr + 4, 8, 8, h.stride, "bf16", True)     # not whole tiles of h
    again = MatmulOp(mem.put(X, "bf16"), h_cols, mem.empty(4, 8, "fp32"))
    mem.run(ops + [again])
    ho = plan_handoffs(config, ops + [again])
    assert [h.consumer for h in ho.items] == [1] and not ho.keeps(0, ops[0].c)
    golden.assert_bits_equal(mem.get(again.c), golden.matmul(X, mem.get(h)[:, 2:10], rows=4),
                             "the second reader")


def test_no_hand_off_where_tiles_do_not_line_up():
    """rows != cols: a result tile is not a K tile, so h goes through memory."""
    from mxu.sim.compiler.handoff import plan_handoffs
    mem = Memory(SHAPES["3x5"].replace(vpu=True))
    ops = _layer_ops(mem, np.random.default_rng(SEED), 8, 6, 15, 4, "gelu", True)
    assert plan_handoffs(mem.model.config, ops).items == ()
    mem.run(ops)
    assert not np.isnan(mem.get(ops[0].c).astype(np.float32)).any()


def _attention_ops(mem, rng, L, H, d, transient):
    """Q = x @ Wq (plain, bf16), each head's q_h @ K^T_h (its two column
    tiles of Q), then P_h @ V_h into the head's columns of a context, and
    context @ Wo: Q is one producer for several consumers, the context
    several producers for one."""
    from dataclasses import replace

    def put(shape, scale=1.0, dtype="bf16"):
        return mem.put(rng.standard_normal(shape) * scale, dtype)

    def temp(rows, cols):
        return replace(mem.put(np.full((rows, cols), np.nan), "bf16"), transient=transient)

    x, wq, kt, v, wo = put((L, H)), put((H, H), 0.3), put((H, L)), put((L, H)), put((H, H), 0.3)
    q, ctx, out = temp(L, H), temp(L, H), mem.empty(L, H, "fp32")
    ops = [MatmulOp(x, wq, q, put((1, H), dtype="fp32"))]
    probs = []
    for h in range(H // d):
        cols = lambda o: Operand(o.addr + 2 * h * d, o.rows, d, o.stride, "bf16")      # noqa: E731
        kt_h = Operand(kt.addr + h * d * kt.stride, d, L, kt.stride, "bf16")
        s = mem.empty(L, L, "bf16")
        probs.append(s)
        ops.append(MatmulOp(cols(q), kt_h, s))
    for h, s in enumerate(probs):
        v_h = Operand(v.addr + 2 * h * d, L, d, v.stride, "bf16")
        ops.append(MatmulOp(s, v_h, Operand(ctx.addr + 2 * h * d, L, d, ctx.stride, "bf16",
                                            transient)))
    ops.append(MatmulOp(ctx, wo, out))
    return ops, q, ctx


@pytest.mark.parametrize("L, H, d", [(8, 16, 8), (20, 24, 8)])
def test_plain_matmuls_hand_off_parts_of_a_result_and_pieces_of_one(L, H, d):
    """Plain producers get a copy epilogue: each head's scores read their
    columns of Q from VMEM, the output projection reads the context that the
    heads' P.V wrote into VMEM piece by piece. Same bits as through memory;
    the transient Q and context are never written."""
    from mxu.sim.compiler.handoff import plan_handoffs
    config = SHAPES["4x4"].replace(vpu=True)
    got = {}
    for handoffs in (False, True):
        mem = Memory(config)
        ops, q, ctx = _attention_ops(mem, np.random.default_rng(SEED + 12), L, H, d, handoffs)
        compiled = mem.run(ops, handoffs=handoffs)
        got[handoffs] = mem.get(ops[-1].c), mem.get(q), mem.get(ctx), compiled
    heads = H // d
    ho = plan_handoffs(config, ops)
    by_consumer = {h.consumer: sorted(s.producer for s in h.sources) for h in ho.items}
    assert by_consumer == {**{1 + h: [0] for h in range(heads)},                 # Q
                           **{1 + heads + h: [1 + h] for h in range(heads)},      # the scores
                           1 + 2 * heads: list(range(1 + heads, 1 + 2 * heads))}  # the context
    golden.assert_bits_equal(got[True][0], got[False][0], "through VMEM")
    assert np.isnan(got[True][1].astype(np.float32)).all()
    assert np.isnan(got[True][2].astype(np.float32)).all()
    assert _dma_count(config, got[True][3].program, q) == 0
    assert _dma_count(config, got[True][3].program, ctx) == 0


def _whole_attention(mem, rng, L, H, d, transient):
    """Attention as the encoder layer records it: Q and V plain, K^T through
    the transpose epilogue (scaled), each head's softmax(q_h @ K^T_h) and
    P_h @ V_h into its columns of the context, then context @ Wo. Every
    intermediate transient (when `transient`) and NaN to begin with."""
    from dataclasses import replace
    from mxu.sim.compiler.epilogue import Epilogue

    def put(shape, scale=1.0, dtype="bf16"):
        return mem.put(rng.standard_normal(shape) * scale, dtype)

    def temp(rows, cols):
        return replace(mem.put(np.full((rows, cols), np.nan), "bf16"), transient=transient)

    def view(o, r0, rows, c0, cols):
        return Operand(o.addr + r0 * o.stride + 2 * c0, rows, cols, o.stride, "bf16", o.transient)

    x, wq, wk, wv, wo = put((L, H)), put((H, H), 0.3), put((H, H), 0.3), put((H, H), 0.3), \
        put((H, H), 0.3)
    q, kt, v, ctx, probs = temp(L, H), temp(H, L), temp(L, H), temp(L, H), temp(H // d * L, L)
    ops = [MatmulOp(x, wq, q), MatmulOp(x, wk, kt, epilogue=Epilogue("transpose", scale=0.5)),
           MatmulOp(x, wv, v)]
    heads = H // d
    for h in range(heads):
        ops.append(MatmulOp(view(q, 0, L, h * d, d), view(kt, h * d, d, 0, L),
                            view(probs, h * L, L, 0, L), epilogue=Epilogue("softmax")))
    for h in range(heads):
        ops.append(MatmulOp(view(probs, h * L, L, 0, L), view(v, 0, L, h * d, d),
                            view(ctx, 0, L, h * d, d)))
    ops.append(MatmulOp(ctx, wo, mem.empty(L, H, "fp32")))
    return ops, (q, kt, v, ctx, probs)


@pytest.mark.parametrize("L, H, d", [(8, 16, 8), (20, 24, 8)])
def test_weights_are_handed_off_too_so_attention_touches_memory_only_for_its_weights(L, H, d):
    """K^T (transposed blocks straight into weight tiles) and V (rows into
    weight tiles) are read by LOADW from VMEM; with Q, the probabilities and
    the context handed off as activations, no intermediate is loaded or
    stored. Same bits as the program through memory."""
    from mxu.sim.compiler.handoff import plan_handoffs
    config = SHAPES["4x4"].replace(vpu=True)
    got = {}
    for handoffs in (False, True):
        mem = Memory(config)
        ops, temps = _whole_attention(mem, np.random.default_rng(SEED + 13), L, H, d, handoffs)
        compiled = mem.run(ops, handoffs=handoffs)
        got[handoffs] = mem.get(ops[-1].c), [mem.get(t) for t in temps], compiled
    heads = H // d
    ho = plan_handoffs(config, ops)
    edges = sorted((h.consumer, h.operand, tuple(s.producer for s in h.sources)) for h in ho.items)
    want = ([(3 + h, "a", (0,)) for h in range(heads)] + [(3 + h, "b", (1,)) for h in range(heads)]
            + [(3 + heads + h, "a", (3 + h,)) for h in range(heads)]
            + [(3 + heads + h, "b", (2,)) for h in range(heads)]
            + [(3 + 2 * heads, "a", tuple(range(3 + heads, 3 + 2 * heads)))])
    assert edges == sorted(want)
    golden.assert_bits_equal(got[True][0], got[False][0], "through VMEM")
    for t, data in zip(temps, got[True][1]):
        assert np.isnan(data.astype(np.float32)).all()
        assert _dma_count(config, got[True][2].program, t) == 0


@pytest.mark.parametrize("M, producer", [(16, "layer_norm"), (24, "layer_norm"), (16, "plain")])
def test_the_ffn_keeps_its_residual_in_the_accumulator(M, producer):
    """x1 = LN(x @ Wo + r) in fp32 with a bf16 copy, h = GELU(x1b @ W1),
    LN(h @ W2 + x1): x1b and h are handed off in VMEM, the residual x1 stays
    in the LayerNorm's output buffers (in place), which the last LayerNorm
    reads instead of its residual buffers. A plain producer of x1 (x1 = x @
    Wo, FFN up on an input) copies it into accumulator rows instead. Nothing
    but the inputs, weights and the output touches memory; the same bits as
    through memory."""
    from dataclasses import replace
    from mxu.sim.compiler.epilogue import Epilogue
    from mxu.sim.compiler.handoff import plan_handoffs
    config, H, F = SHAPES["4x4"].replace(vpu=True), 12, 16
    got = {}
    for handoffs in (False, True):
        mem, rng = Memory(config), np.random.default_rng(SEED + 14)

        def put(shape, scale=1.0, dtype="bf16"):
            return mem.put(rng.standard_normal(shape) * scale, dtype)

        def temp(cols, dtype="bf16"):
            return replace(mem.put(np.full((M, cols), np.nan), dtype), transient=handoffs)

        ctx, wo, w1, w2 = put((M, H)), put((H, H), 0.3), put((H, F), 0.3), put((F, H), 0.3)
        r = put((M, H), dtype="fp32")
        ln = [mem.put(np.stack([rng.standard_normal(H), rng.standard_normal(H), np.ones(H)]),
                      "fp32") for _ in range(2)]
        x1, x1b, h, out = temp(H, "fp32"), temp(H), temp(F), mem.empty(M, H, "fp32")
        first = MatmulOp(ctx, wo, x1, epilogue=Epilogue("add_layer_norm", extra=x1b, other=r,
                                                        params=ln[0], eps=1e-5))
        if producer == "plain":
            first, x1b = MatmulOp(ctx, wo, x1), put((M, H))
        ops = [first,
               MatmulOp(x1b, w1, h, put((1, F), dtype="fp32"), epilogue=Epilogue("gelu")),
               MatmulOp(h, w2, out, epilogue=Epilogue("add_layer_norm", other=x1, params=ln[1],
                                                      eps=1e-5))]
        compiled = mem.run(ops, handoffs=handoffs)
        temps = (x1, h) if producer == "plain" else (x1, x1b, h)
        got[handoffs] = mem.get(out), [mem.get(t) for t in temps], compiled, temps
    ho = plan_handoffs(config, ops)
    want = [(2, "a", False), (2, "other", False)] if producer == "plain" else \
        [(1, "a", False), (2, "a", False), (2, "other", True)]
    assert sorted((h.consumer, h.operand, h.in_place) for h in ho.items) == want
    golden.assert_bits_equal(got[True][0], got[False][0], "residual in the accumulator")
    for t, data in zip(got[True][3], got[True][1]):
        assert np.isnan(data.astype(np.float32)).all()
        assert _dma_count(config, got[True][2].program, t) == 0


def test_scatter_pieces_that_are_column_blocks_of_one_matrix_do_not_overlap():
    """A ring's K^T pieces are column blocks of one matrix: their spans
    interleave but they share no byte, so a Scatter takes them; blocks that
    do share bytes are still refused."""
    from mxu.sim.compiler.operands import Scatter
    stride = 2 * 16                                     # a 4 x 16 bf16 matrix
    left, right = Operand(0x1000, 4, 6, stride, "bf16"), Operand(0x1000 + 12, 4, 10, stride, "bf16")
    assert left.overlaps(right) and not left.shares_bytes(right)
    Scatter(((0, right), (10, left)), transposed=True).check("out", 1 << 20)
    wider = Operand(0x1000 + 10, 4, 3, stride, "bf16")
    assert left.shares_bytes(wider)
    with pytest.raises(ValueError, match="pieces overlap"):
        Scatter(((0, left), (6, wider)), transposed=True).check("out", 1 << 20)


def test_short_quantized_chunks_share_ring_slots():
    """The last group's quarter chunks pack into the quantized ring's slots
    (`_Segment._ring_places`): four 9-tile units to a 36-tile slot, one after
    the other; whole and over-half chunks take a slot each, in turn."""
    from types import SimpleNamespace

    from mxu.sim.compiler.matmul import _Segment
    config = ChipConfig()
    seg = SimpleNamespace(config=config)
    r, most, U = config.rows, 36, 5
    unit = lambda n: ((0, 0, 0, n), 0, 0, n)
    rows = _Segment._ring_places(seg, [unit(36), unit(20)] + [unit(9)] * 6 + [unit(36)] * 2,
                                 U, most)
    assert rows == [0, most * r,
                    2 * most * r, 2 * most * r + 9 * r, 2 * most * r + 18 * r, 2 * most * r + 27 * r,
                    3 * most * r, 3 * most * r + 9 * r,
                    4 * most * r, 0]


def test_compress_loops_any_repeating_run_and_issues_the_same_words():
    """`_compress` makes a LOOP of a run of repeated groups of instructions
    whose words move by a constant step (here LOADW, MATMUL, LOAD: a t row
    whose steps each carry a quantized LOAD), leaves irregular words as
    they are, and the expanded program is the original word for word."""
    from mxu.sim.compiler.matmul import _compress
    from mxu.sim.compiler.program import Program
    config = ChipConfig()
    prog = Program()
    prog.load(vmem_row=7, ext_addr=4096, rows=1, row_bytes=32)          # alone
    for j in range(6):
        prog.loadw(vmem_row=100 + 16 * j, k_rows=16)
        prog.matmul(act_row=3, m_rows=1, out_row=j, seed="acc", seed_row=j, new_weights=True)
        prog.load(vmem_row=500 + 32 * j, ext_addr=8192 + 320 * j, rows=32, row_bytes=320)
    prog.loadw(vmem_row=9, k_rows=16, pop_prev=True)                     # breaks the run
    packed = _compress(prog, 16)
    assert len(packed) == 1 + (1 + 2 * 3) + 1
    issued = expand_loops(config, packed.words)
    assert [next(issued)[1] for _ in range(len(prog) + 1)] == prog.words + [None]
    assert len(_compress(prog, 2)) == len(prog)        # a body of 3 is wider than allowed


@pytest.mark.parametrize("KT, NT, least, paired, G", [
    (36, 96, 8, False, 9),      # SmolLM2's K = 576: a strip's LOAD every 4 t rows
    (36, 3072, 4, False, 12),   # the vocabulary: 9 would leave a last group of 3
    (36, 64, 4, False, 12),
    (36, 192, 8, True, 12),     # paired: an even size
    (40, 128, 8, False, 8),
    (96, 36, 8, False, 8),
    (7, 4, 8, False, 4),        # fewer N tiles than the least
    (37, 100, 8, False, 8),     # no divisor in range
])
def test_quantized_groups_divide_their_k_tiles(KT, NT, least, paired, G):
    from mxu.sim.compiler.plan import _quant_group_size
    assert _quant_group_size(KT, NT, least, paired) == G


@pytest.mark.parametrize("kind, w_beats, Mb", [
    ("norm_add_rms_norm", 11, 16),  # Q5_0's tiles: a 16-row step outlasts their beats
    ("norm_add_rms_norm", 14, 32),  # Q6_K's: not by a fifth
    ("add_rms_norm", 17, 32),       # Q8_0's
    ("head_rms_norm_rope", 11, 16),
    ("add_rms_norm", None, 64),     # bf16 weights: blocks as large as fit
    ("masked_softmax", 11, 64),     # a softmax: not cut (its passes wait on latency)
])
def test_row_wise_epilogues_on_quantized_weights_take_short_blocks(kind, w_beats, Mb):
    """A row-wise epilogue's last block is the op's tail (docs/compiler.md,
    "Quantized weights"): with quantized weights whose beats leave the bus
    room, a 64-token prefill's blocks are cut to 16 or 32 rows."""
    config = ChipConfig.preset("llm")
    N = 1024 if kind == "head_rms_norm_rope" else 640
    extra = {"w_beats": w_beats} if w_beats else {}
    plan = plan_op(config, 64, 640, N, epilogue=kind, **extra)
    assert plan.Mb == Mb and plan.blocks == 64 // Mb
    assert plan_op(config, 16, 640, N, epilogue=kind, **extra).Mb == 16


@pytest.mark.parametrize("M, G", [(64, 16), (16, 64), (1, 64)])
def test_head_wise_epilogues_take_a_head_a_group_in_a_prefill(M, G):
    """QK-norm with RoPE (`head_wise`) on Gemma 3's Q (four heads of 256): a
    prefill's groups are one head each, so that the last group's passes
    cover one head; a decode block keeps the whole row."""
    config = ChipConfig.preset("llm")
    plan = plan_op(config, M, 640, 1024, epilogue="head_rms_norm_rope", w_beats=11, head=256)
    assert plan.G == G
    # A third output buffer only for groups of a head (a decode step's whole
    # rows keep two: a batch-16 K projection's transposed pieces fit then).
    assert plan.out_buffers == (3 if G < plan.NT else 2)
    assert plan_op(config, M, 640, 1024, epilogue="head_rms_norm_rope", w_beats=11).G == 64
    # bf16 weights keep the whole row.
    assert plan_op(config, M, 640, 1024, epilogue="head_rms_norm_rope", head=256).G == 64


def _loads_from(config, program, operand):
    """The LOADs (loops expanded) that read bytes of `operand`."""
    lo, hi = operand.span
    out = []
    for word in _issued(config, program):
        opcode, f = decode(word)
        if opcode is Opcode.LOAD and lo <= f["ext_addr"] < hi:
            out.append(f)
    return out


@pytest.mark.parametrize("M", [1, 4, 12])
def test_matmuls_of_one_segment_share_the_activations_they_all_read(M):
    """A decode step's K, V and Q projections read one normalized x: in one
    segment, the first loads it and the others read its buffer (docs/
    compiler.md, "Shared activations"); each result is still the golden
    model's, and the program is race-free (`Memory.run`)."""
    config, rng = SHAPES["4x4"], np.random.default_rng(SEED + 7)
    mem = Memory(config)
    A = rng.standard_normal((M, 24)).astype(golden.bf16)
    a = mem.put(A, "bf16")
    Ws = [rng.standard_normal((24, n)).astype(golden.bf16) for n in (8, 12, 4)]
    ops = [MatmulOp(a, mem.put(W, "bf16"), mem.empty(M, W.shape[1], "fp32")) for W in Ws]
    compiled = mem.run(ops)
    assert [len(s) for s in compiled.segments] == [3]
    for W, op in zip(Ws, ops):
        golden.assert_bits_equal(mem.get(op.c), golden.matmul(A, W, rows=config.rows), "shared")
    alone = compile_matmuls(config, ops[:1]).program
    assert len(_loads_from(config, compiled.program, a)) == len(_loads_from(config, alone, a)) > 0
