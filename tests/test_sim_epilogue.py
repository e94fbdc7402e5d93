"""Fused epilogues (``Chip.matmul(..., then=kind)``, docs/vpu.md "Fused
epilogues"): the vector unit's layer op on each group of a matmul's output
tiles while the array computes the next. Every kind, on a square and a
non-square chip (fast lanes, held to the RTL ones in tests/test_sim_vector.py),
over several M blocks and N groups: bit-exact to the golden VPU form, equal to the unfused program
(the matmul into an fp32 tensor, then `Chip.vector`), race-free, and with
clear errors for bad input."""

import math

import numpy as np
import pytest

from chip_configs import TINY, VPU_SHAPES
from mxu.hdl.dtypes import bfloat16
from mxu.sim import Chip
from mxu.sim.compiler.handoff import plan_handoffs
from mxu.sim.compiler.matmul import (_SOFTMAX_BUNDLE, _Segment, _interleave, compile_matmuls,
                                     plan_segments)
from mxu.sim.runtime.vector import layer_norm_params, softmax_bias
from mxu.verif import golden, vpu
from mxu.verif.hazards import races

SEED = 20261123
KINDS = ("softmax", "gelu", "layer_norm", "add_layer_norm", "transpose")


@pytest.fixture(scope="module", params=sorted(VPU_SHAPES))
def chip(request):
    # The fast lanes (the builds test_sim_vector uses too).
    return Chip(VPU_SHAPES[request.param], fast_mac=True)


class Case:
    """Random operands of an M x K @ K x N matmul with a bias row, and each
    kind's other operands, on `chip`."""

    def __init__(self, chip, M, K, N, seed):
        rng = np.random.default_rng(seed)
        self.chip, self.M, self.N = chip, M, N
        self.a = golden.as_bf16(rng.standard_normal((M, K)).astype(np.float32))
        self.b = golden.as_bf16((rng.standard_normal((K, N)) / math.sqrt(K)).astype(np.float32))
        self.bias = rng.standard_normal(N).astype(np.float32)
        self.res = rng.standard_normal((M, N)).astype(np.float32)
        self.gamma = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
        self.beta = (0.1 * rng.standard_normal(N)).astype(np.float32)
        self.mask = rng.random(N) < 0.7
        self.mask[0] = True
        self.A, self.B = chip.upload(self.a), chip.upload(self.b)
        self.Bias = chip.upload(self.bias)
        self.operands = {
            "softmax": dict(other=softmax_bias(chip, self.mask[None]), scale=0.3),
            "gelu": {},
            "layer_norm": dict(params=layer_norm_params(chip, self.gamma, self.beta), eps=1e-5),
            "add_layer_norm": dict(other=chip.upload(self.res),
                                   params=layer_norm_params(chip, self.gamma, self.beta), eps=1e-5),
            "transpose": dict(scale=0.25),
        }

    def golden(self, kind):
        cols = self.chip.config.cols
        r = golden.matmul(self.a, self.b, seed=np.broadcast_to(self.bias, (self.M, self.N)),
                          rows=self.chip.config.rows)
        if kind == "softmax":
            return vpu.softmax(vpu.scale(r, 0.3), self.mask[None], lanes=cols)
        if kind == "gelu":
            return vpu.gelu(r)
        if kind == "layer_norm":
            return vpu.layer_norm(r, self.gamma, self.beta, 1e-5, lanes=cols)
        if kind == "add_layer_norm":
            return vpu.layer_norm(vpu.add(r, self.res), self.gamma, self.beta, 1e-5, lanes=cols)
        return np.ascontiguousarray(vpu.scale(r, 0.25).T)

    def out(self, kind, dtype=np.float32):
        shape = (self.N, self.M) if kind == "transpose" else (self.M, self.N)
        return self.chip.empty(shape, bfloat16 if kind == "transpose" else dtype)

    def fused(self, kind):
        """(out, its bf16 copy or None, the recording's ops)."""
        chip = self.chip
        out = self.out(kind)
        extra = None if kind == "transpose" else chip.empty((self.M, self.N), bfloat16)
        with chip.record() as rec:
            chip.matmul(self.A, self.B, bias=self.Bias, out=out, then=kind, out_bf16=extra,
                        **self.operands[kind])
        return out, extra, rec.calls[0].ops

    def unfused(self, kind):
        chip = self.chip
        r = chip.empty((self.M, self.N))
        ops = dict(self.operands[kind])
        if kind == "transpose":
            out, extra = self.out(kind), None
            vector = dict(out_t=out, scale=ops["scale"])
        else:
            out, extra = self.out(kind), chip.empty((self.M, self.N), bfloat16)
            vector = dict(out=out, out_bf16=extra, **ops)
            if kind == "layer_norm":
                vector["other"] = vector.pop("params")
            if kind == "softmax":
                vector["group"] = self.M
        with chip.record():
            chip.matmul(self.A, self.B, bias=self.Bias, out=r)
            chip.vector("copy" if kind == "transpose" else kind, r, **vector)
        return out, extra


def _bits(t):
    a = t.numpy()
    return a.view(np.uint16) if a.dtype == bfloat16 else a.view(np.uint32)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_epilogue_is_bit_exact_and_equals_the_unfused_program(chip, kind):
    """Several M blocks (for the row-wise kinds, whose groups hold every N
    tile) and several N groups with a partial last tile."""
    cfg = chip.config
    case = Case(chip, 2 * cfg.acc_rows // 25 + 3, 6 * cfg.rows + 1, 9 * cfg.cols - 2,
                SEED + KINDS.index(kind))
    out, extra, ops = case.fused(kind)
    assert len(ops) == 1 and ops[0].epilogue is not None and ops[0].epilogue.kind == kind
    plan = compile_matmuls(cfg, ops).segments[0][0][1]
    assert plan.blocks > 1 or plan.NT > plan.G, plan           # more than one group
    want = case.golden(kind)
    if kind == "transpose":
        golden.assert_bits_equal(_bits(out), golden.fp32_to_bf16(golden.f32_bits(want)), kind)
    else:
        golden.assert_bits_equal(out.numpy(), want, kind)
        golden.assert_bits_equal(_bits(extra), golden.fp32_to_bf16(golden.f32_bits(want)),
                                 kind + " bf16")
    ref, ref_extra = case.unfused(kind)
    assert np.array_equal(_bits(out), _bits(ref))
    if extra is not None:
        assert np.array_equal(_bits(extra), _bits(ref_extra))


def test_fused_programs_are_race_free(chip):
    """Every kind, and several fused ops in one segment (as the encoder's
    per-head scores run), checked by the hazard model."""
    cfg = chip.config
    case = Case(chip, 3 * cfg.rows + 1, 4 * cfg.rows, 5 * cfg.cols + 1, SEED)
    mixed = []
    for kind in KINDS:
        _, _, ops = case.fused(kind)
        assert races(cfg, compile_matmuls(cfg, ops * 3).program) == [], kind
        mixed += ops
    compiled = compile_matmuls(cfg, mixed)
    assert len(compiled.segments) < len(KINDS)          # kinds share segments
    assert races(cfg, compiled.program) == []


def test_every_kind_in_one_program(chip):
    """One recording with every kind (independent ops: they share fused
    segments and their buffer rings): each output bit-exact."""
    cfg = chip.config
    case = Case(chip, 2 * cfg.rows + 3, 3 * cfg.rows, 4 * cfg.cols + 1, SEED + 9)
    outs = {}
    with chip.record() as rec:
        for kind in KINDS:
            outs[kind] = case.out(kind)
            chip.matmul(case.A, case.B, bias=case.Bias, out=outs[kind], then=kind,
                        **case.operands[kind])
    assert rec.stats.programs == 1
    for kind, out in outs.items():
        want = case.golden(kind)
        if kind == "transpose":
            want = golden.fp32_to_bf16(golden.f32_bits(want))
        golden.assert_bits_equal(_bits(out) if kind == "transpose" else out.numpy(), want, kind)


def test_several_fused_heads_in_one_program(chip):
    """Softmax epilogues of several matmuls (the attention heads) share one
    segment's buffer ring: each head's rows bit-exact."""
    cfg = chip.config
    rng = np.random.default_rng(SEED + 7)
    L, d, heads = 2 * cfg.cols + 1, cfg.rows + 2, 4
    q = golden.as_bf16(rng.standard_normal((heads * L, d)).astype(np.float32))
    kt = golden.as_bf16(rng.standard_normal((heads * d, L)).astype(np.float32))
    mask = rng.random((1, L)) < 0.8
    mask[0, 0] = True
    Q, KT, bias = chip.upload(q), chip.upload(kt), softmax_bias(chip, mask)
    probs = chip.empty((heads * L, L), bfloat16)
    with chip.record() as rec:
        for h in range(heads):
            chip.matmul(Q[h * L:(h + 1) * L], KT[h * d:(h + 1) * d], out=probs[h * L:(h + 1) * L],
                        then="softmax", other=bias)
    assert rec.stats.programs == 1
    for h in range(heads):
        s = golden.matmul(q[h * L:(h + 1) * L], kt[h * d:(h + 1) * d], rows=cfg.rows)
        want = golden.fp32_to_bf16(golden.f32_bits(vpu.softmax(s, mask, lanes=cfg.cols)))
        golden.assert_bits_equal(_bits(probs[h * L:(h + 1) * L]), want, f"head {h}")


@pytest.mark.parametrize("spread", [3, 0], ids=["lengths", "one_length"])
def test_short_softmax_heads_interleave_their_epilogues(chip, spread):
    """A decode step's scores: heads of 3 query rows, each with its own keys
    and length (or all of one length, as a batch's sequences). Their
    softmaxes are latency-bound, so the compiler runs `_SOFTMAX_BUNDLE`
    heads' epilogues interleaved, and the steps of heads of one shape t row
    by t row (`_Segment._bundle`): each head's rows bit-exact, the program
    race-free."""
    cfg = chip.config
    rng = np.random.default_rng(SEED + 11)
    rows, d, heads = 3, cfg.rows + 2, 9
    lengths = [cfg.cols + 1 + spread * h for h in range(heads)]
    q = golden.as_bf16(rng.standard_normal((heads * rows, d)).astype(np.float32))
    kts = [golden.as_bf16(rng.standard_normal((d, L)).astype(np.float32)) for L in lengths]
    masks = [rng.random((1, L)) < 0.8 for L in lengths]
    for mask in masks:
        mask[0, 0] = True
    Q, KT = chip.upload(q), [chip.upload(kt) for kt in kts]
    biases = [softmax_bias(chip, mask) for mask in masks]
    probs = [chip.empty((rows, L), bfloat16) for L in lengths]
    with chip.record() as rec:
        for h in range(heads):
            chip.matmul(Q[h * rows:(h + 1) * rows], KT[h], out=probs[h], then="softmax",
                        other=biases[h])
        ops = [op for call in rec.calls for op in call.ops]
    assert rec.stats.programs == 1
    plans = [plan for segment in compile_matmuls(cfg, ops).segments for _, plan in segment]
    assert _interleave(plans) == _SOFTMAX_BUNDLE
    (placed,) = plan_segments(cfg, ops, plan_handoffs(cfg, ops))
    bundles = _Segment(cfg, [p for _, p in placed], last=True).bundles
    if spread == 0:         # one group a head, in bundles of _SOFTMAX_BUNDLE
        assert sorted(bundles) == list(range(0, heads, _SOFTMAX_BUNDLE))
    program = compile_matmuls(cfg, ops).program
    assert races(cfg, program) == []
    _stores_wait_behind_matmuls(program)
    for h, (kt, mask) in enumerate(zip(kts, masks)):
        s = golden.matmul(q[h * rows:(h + 1) * rows], kt, rows=cfg.rows)
        want = golden.fp32_to_bf16(golden.f32_bits(vpu.softmax(s, mask, lanes=cfg.cols)))
        golden.assert_bits_equal(_bits(probs[h]), want, f"head {h}")


def _stores_wait_behind_matmuls(program):
    """A STORE that waits for the vector unit's token (the k-th such STORE
    takes the k-th token a VECTOR pushes) comes MATMULs after that VECTOR
    (`_defer_stores`), or after the last MATMUL: not right behind it, where
    its wait would fill the store engine's queue and hold the array's next
    instructions up."""
    from mxu.hdl.isa import Opcode, decode
    kinds = [decode(w) for w in program.words]
    matmuls = np.cumsum([op is Opcode.MATMUL for op, _ in kinds])
    pushes = [i for i, (op, f) in enumerate(kinds) if op is Opcode.VECTOR and f["deps"]["push_next"]]
    stores = [i for i, (op, f) in enumerate(kinds) if op is Opcode.STORE
              and f["deps"]["pop_prev"] and f["flags"]["vector"]]
    assert len(stores) == len(pushes) > 0
    for push, store in zip(pushes, stores):
        assert matmuls[store] > matmuls[push] or matmuls[store] == matmuls[-1], (push, store)


def test_an_epilogue_that_does_not_fit_runs_unfused():
    """add_layer_norm needs more than the weight ring's steps per group; a
    one-tile matmul falls back to the matmul and `Chip.vector`, same bits."""
    chip = Chip(VPU_SHAPES["3x5"], fast_mac=True)
    cfg = chip.config
    case = Case(chip, 3 * cfg.rows, cfg.rows, cfg.cols, SEED + 3)
    out, extra, ops = case.fused("add_layer_norm")
    assert [type(op).__name__ for op in ops] == ["MatmulOp", "VectorOp"]
    golden.assert_bits_equal(out.numpy(), case.golden("add_layer_norm"), "fallback")


def test_then_rejects_bad_input(chip):
    cfg = chip.config
    case = Case(chip, 8, 2 * cfg.rows, 3 * cfg.cols, SEED)   # M != N
    A, B, M, N = case.A, case.B, case.M, case.N
    with pytest.raises(ValueError, match="then must be one of"):
        chip.matmul(A, B, then="tanh")
    with pytest.raises(TypeError, match="go with then="):
        chip.matmul(A, B, other=case.operands["softmax"]["other"])
    with pytest.raises(ValueError, match="relu and then= do not combine"):
        chip.matmul(A, B, then="gelu", relu=True)
    with pytest.raises(ValueError, match="other must be a float32 device tensor of shape"):
        chip.matmul(A, B, then="softmax", other=chip.upload(np.zeros((2, N), np.float32)))
    with pytest.raises(TypeError, match="params must be a float32 DeviceTensor"):
        chip.matmul(A, B, then="layer_norm", params=np.zeros((3, N), np.float32))
    with pytest.raises(ValueError, match="takes no other"):
        chip.matmul(A, B, then="gelu", other=chip.upload(np.zeros((M, N), np.float32)))
    with pytest.raises(ValueError, match="out must have shape"):
        chip.matmul(A, B, then="transpose", out=chip.empty((M, N), bfloat16))
    with pytest.raises(ValueError, match="writes the bf16 transpose"):
        chip.matmul(A, B, then="transpose", out=chip.empty((N, M)))
    with pytest.raises(ValueError, match="out is already bfloat16"):
        chip.matmul(A, B, then="gelu", out_dtype=bfloat16, out_bf16=chip.empty((M, N), bfloat16))
    with pytest.raises(ValueError, match="needs a chip with the vector unit"):
        Chip(TINY).matmul(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), then="gelu")


def test_a_fault_inside_a_fused_program_then_the_next_call_is_right(chip):
    """A bus error on the residual's rows stops the fused program with a clear
    error; the driver resets the chip and the same call then runs bit-exact."""
    from mxu.sim import ChipError
    cfg = chip.config
    case = Case(chip, 3 * cfg.rows, 4 * cfg.rows, 3 * cfg.cols, SEED + 5)
    residual = case.operands["add_layer_norm"]["other"]
    chip.inject_error(residual.addr, residual.addr + 64, "slverr")
    try:
        with pytest.raises(ChipError, match="the chip stopped with"):
            case.fused("add_layer_norm")
    finally:
        chip.clear_errors()
    out, _, _ = case.fused("add_layer_norm")
    golden.assert_bits_equal(out.numpy(), case.golden("add_layer_norm"), "after the fault")


def test_softmax_without_a_bias_row_equals_an_all_zero_bias(chip):
    """Nothing masked and N a multiple of cols: the epilogue skips the bias
    add, bit-identical to adding a row of zeros (x + 0 only turns -0 into +0,
    and exp(-0) = exp(+0)); with a partial tile it is an error."""
    cfg = chip.config
    case = Case(chip, 2 * cfg.rows + 1, 3 * cfg.rows, 4 * cfg.cols, SEED + 11)
    zeros = softmax_bias(chip, np.ones((1, case.N), bool))
    outs = []
    for other in (None, zeros):
        out = case.out("softmax")
        with chip.record() as rec:
            chip.matmul(case.A, case.B, bias=case.Bias, out=out, then="softmax", other=other,
                        scale=0.3)
        outs.append(out)
    assert rec.calls[0].ops[0].epilogue is not None
    want = vpu.softmax(vpu.scale(golden.matmul(
        case.a, case.b, seed=np.broadcast_to(case.bias, (case.M, case.N)), rows=cfg.rows), 0.3),
        np.ones((1, case.N), bool), lanes=cfg.cols)
    golden.assert_bits_equal(outs[0].numpy(), want, "no bias row")
    assert np.array_equal(_bits(outs[0]), _bits(outs[1]))
    with pytest.raises(ValueError, match="multiple of the chip's cols"):
        chip.matmul(case.A, case.B[:, :case.N - 1], then="softmax")


@pytest.mark.parametrize("M", [1, 5])
def test_fused_segments_loop_their_middle_k_tiles(chip, M):
    """A decode-shaped fused segment (few rows, deep K, several groups) loops
    each group's middle K tiles, with the previous group's epilogue between
    LOOPs (docs/compiler.md, "Loops"): a program a fraction of the literal
    one, race-free, and bit-exact."""
    cfg = chip.config
    case = Case(chip, M, 24 * cfg.rows, 40 * cfg.cols - 3, SEED + M)
    outs = {kind: case.out(kind) for kind in ("gelu", "add_layer_norm")}
    with chip.record() as rec:
        for kind, out in outs.items():
            chip.matmul(case.A, case.B, bias=case.Bias, out=out, then=kind, **case.operands[kind])
    ops = [op for call in rec.calls for op in call.ops]
    looped, literal = compile_matmuls(cfg, ops), compile_matmuls(cfg, ops, loops=False)
    # One row: the epilogues are short, whole groups loop; five rows of
    # gelu on a tiny array: more batches of them between LOOPs (the last
    # groups keep `hide` tiles, so their epilogues are long: 1.43x-1.48x,
    # against 1.54x-1.58x when they shrank to one tile and the array waited).
    assert len(looped.program) < len(literal.program) / (3 if M == 1 else 1.4)
    assert races(cfg, looped.program) == []
    for kind, out in outs.items():
        golden.assert_bits_equal(out.numpy(), case.golden(kind), f"{kind}, M={M}")


def _rope_problem(chip, rng, M, N, P):
    """A RoPE'd matmul on `chip`: bf16 a (M x 3 tiles of K) and b (.. x N),
    the cos|sin table of P-wide heads on the chip, and the golden fp32
    result."""
    cfg = chip.config
    a = golden.as_bf16(rng.standard_normal((M, 3 * cfg.rows)).astype(np.float32))
    b = golden.as_bf16(rng.standard_normal((3 * cfg.rows, N)).astype(np.float32))
    angles = rng.uniform(0, 6.3, (M, P // 2)).astype(np.float32)
    cos, sin = (np.repeat(f(angles), 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    table = chip.upload(np.concatenate([cos, sin], axis=1))
    want = vpu.rope(golden.matmul(a, b, rows=cfg.rows), np.tile(cos, (1, N // P)),
                    np.tile(sin, (1, N // P)))
    return a, b, table, want


def test_rope_loads_its_table_once():
    """RoPE's cos|sin table is the same for every group of an M block: an
    op of one block loads it once, into rows of its own (docs/compiler.md),
    and every group's rows stay bit-exact."""
    chip = Chip(VPU_SHAPES["4x4"], fast_mac=True)
    cfg, P, M, N = chip.config, 8, 7, 80 * VPU_SHAPES["4x4"].cols
    rng = np.random.default_rng(SEED + 11)
    a, b, table, want = _rope_problem(chip, rng, M, N, P)
    out = chip.empty((M, N))
    with chip.record() as rec:
        chip.matmul(chip.upload(a), chip.upload(b), out=out, then="rope", other=table)
    ops = rec.calls[0].ops
    compiled = compile_matmuls(cfg, ops)
    groups = compiled.segments[0][0][1].NT // compiled.segments[0][0][1].G
    table_loads = sum(f"ext_addr={table.addr}," in text for text in compiled.program.text)
    assert groups > 3 and table_loads == 1, (groups, table_loads)
    assert races(cfg, compiled.program) == []
    golden.assert_bits_equal(out.numpy(), want, "rope")


@pytest.mark.parametrize("kind", ["silu_mul", "gelu_tanh_mul"])
def test_paired_gated_epilogues_are_bit_exact(chip, kind):
    """The paired ``f(gate) * up`` ops (SwiGLU's, GeGLU's with the tanh GELU):
    the matmul's N tiles alternate gate and up, output tile j is f(tile 2j)
    * tile 2j+1; several M blocks and groups, bit-exact to the golden VPU
    form, with the fp32 result and its bf16 copy, race-free."""
    cfg = chip.config
    rng = np.random.default_rng(SEED + 13)
    M, K, T = 2 * cfg.rows + 3, 3 * cfg.rows, 6
    a = golden.as_bf16(rng.standard_normal((M, K)).astype(np.float32))
    b = golden.as_bf16((3 * rng.standard_normal((K, 2 * T * cfg.cols)) / math.sqrt(K))
                       .astype(np.float32))
    out, extra = chip.empty((M, T * cfg.cols)), chip.empty((M, T * cfg.cols), bfloat16)
    with chip.record() as rec:
        chip.matmul(chip.upload(a), chip.upload(b), out=out, out_bf16=extra, then=kind)
    ops = rec.calls[0].ops
    assert len(ops) == 1 and ops[0].epilogue.kind == kind
    assert races(cfg, compile_matmuls(cfg, ops).program) == []
    r = golden.matmul(a, b, rows=cfg.rows).reshape(M, T, 2, cfg.cols)
    gate, up = r[:, :, 0].reshape(M, -1), r[:, :, 1].reshape(M, -1)
    want = getattr(vpu, kind)(gate, up)
    golden.assert_bits_equal(out.numpy(), want, kind)
    golden.assert_bits_equal(_bits(extra), golden.fp32_to_bf16(golden.f32_bits(want)), kind)


def test_descriptor_flags_reject_bad_input(chip):
    """What a kind may do is its descriptor's: a paired op needs N to be a
    multiple of 2 * cols, only RoPE may ask to be paired, only RoPE and the
    transpose write a transposed result."""
    cfg = chip.config
    case = Case(chip, 8, 2 * cfg.rows, 3 * cfg.cols, SEED)
    with pytest.raises(ValueError, match=r"paired silu_mul epilogue needs N \(\d+\) to be "
                                         r"a multiple of 2 \* cols"):
        chip.matmul(case.A, case.B, then="silu_mul")
    with pytest.raises(ValueError, match=r"a gelu epilogue takes no paired=True \(only \['rope'\]"):
        chip.matmul(case.A, case.B, then="gelu", paired=True)
    with pytest.raises(ValueError, match="a gelu epilogue cannot write its result transposed"):
        chip.matmul(case.A, case.B, then="gelu", transpose=True,
                    out=chip.empty((case.N, case.M), bfloat16))


def test_head_rms_norm_is_bit_exact(chip):
    """QK-norm: RMSNorm over each head of the projection's rows, every head
    with the same gamma (one head wide), over several M blocks: bit-exact to
    the golden VPU form; a head that does not divide N is a clear error."""
    cfg = chip.config
    rng = np.random.default_rng(SEED + 17)
    M, K, head, heads = 2 * cfg.acc_rows // 25 + 3, 3 * cfg.rows, 2 * cfg.cols, 3
    a = golden.as_bf16(rng.standard_normal((M, K)).astype(np.float32))
    b = golden.as_bf16(rng.standard_normal((K, heads * head)).astype(np.float32))
    gamma = (1 + 0.1 * rng.standard_normal(head)).astype(np.float32)
    params = chip.upload(gamma[None])
    out, extra = chip.empty((M, heads * head)), chip.empty((M, heads * head), bfloat16)
    with chip.record() as rec:
        chip.matmul(chip.upload(a), chip.upload(b), out=out, out_bf16=extra,
                    then="head_rms_norm", params=params, eps=1e-6)
    ops = rec.calls[0].ops
    assert len(ops) == 1 and ops[0].epilogue.kind == "head_rms_norm"
    plan = compile_matmuls(cfg, ops).segments[0][0][1]
    assert plan.blocks > 1, plan
    assert races(cfg, compile_matmuls(cfg, ops).program) == []
    want = vpu.head_rms_norm(golden.matmul(a, b, rows=cfg.rows), gamma, 1e-6, lanes=cfg.cols)
    golden.assert_bits_equal(out.numpy(), want, "head_rms_norm")
    golden.assert_bits_equal(_bits(extra), golden.fp32_to_bf16(golden.f32_bits(want)),
                             "head_rms_norm bf16")
    with pytest.raises(ValueError, match="must be a multiple of cols .* and divide the result"):
        chip.matmul(chip.upload(a), chip.upload(b[:, :heads * head - cfg.cols]),
                    then="head_rms_norm", params=params)


def _neox_table(cos, sin):
    """The rope_neox table rows: cos, then sin with each head's first half negated."""
    half = cos.shape[1] // 2
    return np.concatenate([cos, np.concatenate([-sin[:, :half], sin[:, half:]], axis=1)], axis=1)


@pytest.mark.parametrize("kind", ["rope_neox", "head_rms_norm_rope"])
def test_neox_rope_epilogues_are_bit_exact(chip, kind):
    """NEOX RoPE (dims i and i + d/2 of each head turn together: the partner
    is a whole tile, no lane moves), alone and after QK-norm, over several M
    blocks, into an fp32 result and transposed into bf16 (the K cache's
    K^T): bit-exact to the golden VPU form; a head whose half is not whole
    tiles is a clear error."""
    from mxu.hdl import hostops
    cfg = chip.config
    rng = np.random.default_rng(SEED + 19)
    M, K, head, heads = 2 * cfg.acc_rows // 25 + 3, 3 * cfg.rows, 2 * cfg.cols, 3
    a = golden.as_bf16(rng.standard_normal((M, K)).astype(np.float32))
    b = golden.as_bf16(rng.standard_normal((K, heads * head)).astype(np.float32))
    gamma = (1 + 0.1 * rng.standard_normal(head)).astype(np.float32)
    cos, sin = hostops.rope_tables(head, 100.0, np.arange(M) + 3, neox=True)
    table, params = chip.upload(_neox_table(cos, sin)), chip.upload(gamma[None])
    extra = dict(params=params, eps=1e-6) if kind == "head_rms_norm_rope" else {}
    out, out_t = chip.empty((M, heads * head)), chip.empty((heads * head, M), bfloat16)
    A, B = chip.upload(a), chip.upload(b)
    with chip.record() as rec:
        chip.matmul(A, B, out=out, then=kind, other=table, **extra)
        chip.matmul(A, B, out=out_t, out_dtype=bfloat16, then=kind, other=table, transpose=True,
                    **extra)
    assert races(cfg, compile_matmuls(cfg, rec.calls[0].ops).program) == []
    r = golden.matmul(a, b, rows=cfg.rows)
    want = (vpu.rope_neox(r, cos, sin) if kind == "rope_neox" else
            vpu.head_rms_norm_rope(r, gamma, 1e-6, cos, sin, lanes=cfg.cols))
    golden.assert_bits_equal(out.numpy(), want, kind)
    golden.assert_bits_equal(_bits(out_t), golden.fp32_to_bf16(golden.f32_bits(want)).T, kind)
    odd = 2 * (cfg.cols // 2 + 1)          # a head whose half is not whole tiles
    bad = chip.upload(_neox_table(*hostops.rope_tables(odd, 100.0, np.arange(M), neox=True)))
    with pytest.raises(ValueError, match=f"a {kind}.*P/2 a multiple of cols"):
        chip.matmul(A, B[:, :odd * heads], then=kind, other=bad,
                    **(dict(params=chip.upload(np.ones((1, odd), np.float32))) if extra else {}))


def test_norm_add_rms_norm_is_bit_exact(chip):
    """A post-norm block's end (Gemma 3): c = rms_norm(r, g0) + residual and
    its RMSNorm with g1 in bf16, over several M blocks: bit-exact to the
    golden VPU form."""
    cfg = chip.config
    rng = np.random.default_rng(SEED + 23)
    M, K, N = 2 * cfg.acc_rows // 25 + 3, 3 * cfg.rows, 3 * cfg.cols + 2
    a = golden.as_bf16(rng.standard_normal((M, K)).astype(np.float32))
    b = golden.as_bf16(rng.standard_normal((K, N)).astype(np.float32))
    res = rng.standard_normal((M, N)).astype(np.float32)
    gammas = (1 + 0.1 * rng.standard_normal((2, N))).astype(np.float32)
    out, extra = chip.empty((M, N)), chip.empty((M, N), bfloat16)
    with chip.record() as rec:
        chip.matmul(chip.upload(a), chip.upload(b), out=out, out_bf16=extra,
                    then="norm_add_rms_norm", other=chip.upload(res),
                    params=chip.upload(gammas), eps=1e-6)
    ops = rec.calls[0].ops
    assert compile_matmuls(cfg, ops).segments[0][0][1].blocks > 1
    assert races(cfg, compile_matmuls(cfg, ops).program) == []
    c, norm = vpu.norm_add_rms_norm(golden.matmul(a, b, rows=cfg.rows), res, gammas[0],
                                    gammas[1], 1e-6, lanes=cfg.cols)
    golden.assert_bits_equal(out.numpy(), c, "norm_add_rms_norm sum")
    golden.assert_bits_equal(_bits(extra), golden.fp32_to_bf16(golden.f32_bits(norm)),
                             "norm_add_rms_norm norm")


def test_transposed_pieces_store_beside_their_transposes():
    """A decode step's K projection: RoPE'd rows of several sequences, each
    one transposed into a column of its own K^T cache (a `Scatter` of
    one-row pieces). Each block's transpose gives the store engine a token
    and its STORE follows a few transposes later (docs/compiler.md,
    "Results in pieces"): race-free, every column bit-exact to the golden
    VPU form, the caches' other columns untouched."""
    chip = Chip(VPU_SHAPES["4x4"], fast_mac=True)
    cfg, P, M, pos, width = chip.config, 8, 6, 5, 8
    N = 4 * P
    rng = np.random.default_rng(SEED + 29)
    a, b, table, want = _rope_problem(chip, rng, M, N, P)
    old = golden.as_bf16(rng.standard_normal((M, N, width)).astype(np.float32))
    caches = [chip.upload(old[r], dtype=bfloat16) for r in range(M)]
    with chip.record() as rec:
        chip.matmul(chip.upload(a), chip.upload(b), out_dtype=bfloat16, then="rope",
                    other=table, transpose=True,
                    out=[(r, caches[r][:, pos:pos + 1]) for r in range(M)])
    program = compile_matmuls(cfg, rec.calls[0].ops).program
    popping = [t for t in program.text if t.startswith("STORE") and "pop_prev" in t]
    assert len(popping) > 1, popping
    assert races(cfg, program) == []
    want = golden.fp32_to_bf16(golden.f32_bits(want))
    for k, cache in enumerate(caches):
        got = _bits(cache)
        golden.assert_bits_equal(got[:, pos], want[k], f"sequence {k}'s column")
        rest = np.delete(np.arange(width), pos)
        golden.assert_bits_equal(got[:, rest], golden.fp32_to_bf16(golden.f32_bits(old[k]))[:, rest],
                                 f"sequence {k}'s other columns")
