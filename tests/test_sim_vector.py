"""The vector engine on the whole chip (fast native path): every VECTOR op and
operand mode, its tokens with compute and store, its interlock, and every
static error it reports, against the ISA's functional model, on a square and a
non-square chip with the vector unit (docs/vpu.md)."""

import numpy as np
import pytest

from chip_configs import TINY, VPU_SHAPES, run_cocotb_chip
from mxu.hdl import ChipConfig
from mxu.hdl.isa import ErrorCode
from mxu.sim import Chip, Program
from mxu.verif import golden, programs
from mxu.verif.hazards import races

SEED = 20261123


@pytest.fixture(scope="module", params=sorted(VPU_SHAPES))
def chip(request):
    # The fast lanes, which `test_fast_lanes_give_the_same_results_and_cycles`
    # holds to the RTL's bits and cycles (`slow`: an RTL-lane chip build is three
    # CPU minutes; the RTL lane and VectorAlu run in tests/test_hdl_vpu.py).
    return Chip(VPU_SHAPES[request.param], fast_mac=True)


def _fresh(chip):
    chip.clear_errors()
    chip.soft_reset()
    chip.memory[:] = 0


def _run_checked(chip, p, image, outputs):
    """`p` on a fresh `chip` and on the ISA model; the `outputs` byte ranges
    must be bit-equal. Returns the chip's result."""
    _fresh(chip)
    result, model, _ = programs.run_both(chip, p, image)
    for lo, hi in outputs:
        golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], f"bytes {lo:#x}")
    return result


def test_every_vector_op_against_the_model(chip):
    _fresh(chip)
    p, image, outputs = programs.vector_program(chip.config, np.random.default_rng(SEED))
    assert not races(chip.config, p)
    result, model, expected = programs.run_both(chip, p, image)
    assert expected.error is ErrorCode.NONE
    assert result.error is ErrorCode.NONE, result.error
    for lo, hi in outputs:
        golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], f"bytes {lo:#x}")
    assert result.counters["vector_active"] == expected.vector_rows
    assert result.counters["instructions"] == len(p)


@pytest.mark.parametrize("cols", [16, 7])
def test_fast_lane_row_against_the_golden_alu(chip, cols):
    """The fast lanes' C row (`mxu.sim.backends.fast_vpu`: four lanes at a time
    on vectors, the rest one by one), called in the chip's library, against
    the golden `VectorAlu` on operands that cover every sign and exponent,
    random and special words, for every element op."""
    import ctypes
    from mxu.hdl.isa import VpuOp
    from mxu.verif.vpu import vector_alu
    row = chip.device._lib.mxu_vpu_row
    row.restype, row.argtypes = None, [ctypes.c_uint] * 2 + [ctypes.c_void_p] * 3
    rng = np.random.default_rng(SEED + 7)
    sweep = np.arange(0, 1 << 32, 1 << 23, dtype=np.uint64).astype(np.uint32)
    words = np.concatenate([sweep, sweep | 1, sweep | 0x7FFFFF, programs.fp32_operands(rng, (4096,))])
    a = words[: len(words) // cols * cols].reshape(-1, cols)
    b = rng.permutation(a.ravel()).reshape(a.shape)
    for op in [op for op in VpuOp if op not in (VpuOp.RSUM, VpuOp.RMAX)]:
        y = np.zeros_like(a)
        for i in range(len(a)):
            row(op.value, cols, a[i].ctypes.data, b[i].ctypes.data, y[i].ctypes.data)
        golden.assert_bits_equal(y, vector_alu(np.full(len(a), op.value), a, b), op.name)


def test_vector_errors_then_a_good_program(chip):
    _errors_then_a_good_program(chip)


def test_pipelined_vector_errors_then_a_good_program():
    """As above on the 4x4 chip with the fpga-llm preset's pipelined vector
    unit, whose VECTORs wait in a queue in front of the interlock."""
    cfg = VPU_SHAPES["4x4"].replace(vpu_stages=ChipConfig.preset("fpga-llm").vpu_stages)
    _errors_then_a_good_program(Chip(cfg, fast_mac=True))


def _errors_then_a_good_program(chip):
    """Each of the vector error programs stops at its pc with its code (chip
    and ISA model); then a good program on the same chip is right."""
    cases = programs.vector_error_programs(chip.config)
    good, image, outputs = programs.vector_program(chip.config, np.random.default_rng(SEED + 1))
    for name, (program, code, pc) in cases.items():
        _fresh(chip)
        result, _, expected = programs.run_both(chip, program, {})
        assert (expected.error, expected.pc) == (code, pc), name
        assert (result.error, result.error_pc) == (code, pc), name
    _fresh(chip)
    result, model, expected = programs.run_both(chip, good, image)
    assert result.error is ErrorCode.NONE
    for lo, hi in outputs:
        golden.assert_bits_equal(result.memory[lo:hi], model.ext[lo:hi], f"bytes {lo:#x}")


def test_vector_instructions_are_illegal_without_the_vector_unit():
    chip = Chip(TINY)
    for program in (Program().vector("exp", a_row=0, rows=1, dst_row=1).halt(),
                    Program().sync("vector").halt(),
                    Program().matmul(act_row=0, m_rows=1, out_row=0, vector=True).halt()):
        _fresh(chip)
        result = chip.run(program, {})
        assert (result.error, result.error_pc) == (ErrorCode.ILLEGAL_INSTR, 0)


def _load_tiles(p, x_addr, tiles, **deps):
    """LOAD an (m, n) fp32 matrix stored row-major at `x_addr` as `tiles`."""
    c = tiles.cols
    for t in range(tiles.count):
        width = min(c, tiles.n - t * c)
        p.load(acc_row=tiles.tile(t), ext_addr=x_addr + 4 * t * c, rows=tiles.m,
               row_bytes=4 * width, ext_stride=4 * tiles.n,
               **(deps if t == tiles.count - 1 else {}))


def _store_tiles(p, y_addr, tiles, **deps):
    c = tiles.cols
    for t in range(tiles.count):
        width = min(c, tiles.n - t * c)
        p.store(acc_row=tiles.tile(t), ext_addr=y_addr + 4 * t * c, rows=tiles.m,
                row_bytes=4 * width, ext_stride=4 * tiles.n, **(deps if t == 0 else {}))


def _padded_row(values, count, cols, pad):
    row = np.full(count * cols, pad, np.float32)
    row[:len(values)] = values
    return row


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "gelu"])
def test_layer_programs_against_the_vpu_form(chip, kind):
    """Each layer op as a VECTOR program on accumulator tiles equals the golden
    VPU form of the layer (`mxu.verif.vpu`, rows reduced with lanes = cols) bit
    for bit, on widths with partial tiles, a power of two of tiles and fewer
    columns than lanes, on a power-of-two and a non-power-of-two lane count."""
    from mxu.sim.compiler.vector import Tiles, VectorEmitter
    from mxu.verif import vpu
    cfg = chip.config
    rng = np.random.default_rng(SEED + 7)
    for n in (3, 8, 12, 20):
        m = 5
        x = (rng.standard_normal((m, n)) * 3).astype(np.float32)
        x[0, 0] = 0.0
        xt = Tiles(0, m, n, cfg.cols)
        scratch = [xt.like(xt.end * (i + 1) + 8) for i in range(4)]
        spare = scratch[-1].end + 8
        one = Tiles(spare + 2 * m, 1, n, cfg.cols)          # one-row matrices (bias, gamma, ...)
        two, three = one.like(one.end), one.like(one.end + one.count)
        p, image = Program(), {0x0: x}
        _load_tiles(p, 0x0, xt)
        emit = VectorEmitter(p, cfg)
        if kind == "softmax":
            mask = rng.random(n) < 0.7
            mask[0] = True
            image[0x8000] = _padded_row(np.where(mask, 0, -np.inf), one.count, cfg.cols, -np.inf)
            p.load(acc_row=one.base, ext_addr=0x8000, rows=one.count, row_bytes=4 * cfg.cols,
                   push_next=True)
            p.sync("compute", pop_prev=True, push_next=True, vector=True)
            emit.begin(pop_prev=True).softmax(xt, one, xt, scratch[0], spare).end(push_next=True)
            expected = vpu.softmax(x, mask, lanes=cfg.cols)
        elif kind == "layer_norm":
            gamma, beta = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
            image[0x8000] = _padded_row(gamma, one.count, cfg.cols, 0)
            image[0x9000] = _padded_row(beta, two.count, cfg.cols, 0)
            image[0xA000] = _padded_row(np.ones(n), three.count, cfg.cols, 0)
            for row, addr in ((one, 0x8000), (two, 0x9000), (three, 0xA000)):
                p.load(acc_row=row.base, ext_addr=addr, rows=row.count, row_bytes=4 * cfg.cols,
                       push_next=row is three)
            p.sync("compute", pop_prev=True, push_next=True, vector=True)
            emit.begin(pop_prev=True).layer_norm(xt, one, two, 1e-12, xt, scratch[:2], spare,
                                                 three)
            emit.end(push_next=True)
            expected = vpu.layer_norm(x, gamma, beta, 1e-12, lanes=cfg.cols)
        else:
            p.sync("load", push_next=True)
            p.sync("compute", pop_prev=True, push_next=True, vector=True)
            emit.begin(pop_prev=True).gelu(xt, xt, scratch).end(push_next=True)
            expected = vpu.gelu(x)
        _store_tiles(p, 0x10000, xt, pop_prev=True, vector=True)
        p.halt()
        assert not races(cfg, p)
        _fresh(chip)
        result, model, want = programs.run_both(chip, p, image)
        assert result.error is ErrorCode.NONE and want.error is ErrorCode.NONE
        out = result.memory[0x10000:0x10000 + 4 * m * n].view(np.uint32).reshape(m, n)
        golden.assert_bits_equal(out, expected.view(np.uint32), f"{kind}, n={n}")
        golden.assert_bits_equal(out, model.ext[0x10000:0x10000 + 4 * m * n].view(np.uint32)
                                 .reshape(m, n), f"{kind}, n={n}, ISA model")


def test_chip_vector_ops_in_a_recording(chip):
    """`Chip.vector`: every kind on device tensors, alone and recorded into one
    program with matmuls, bit-exact to the golden VPU form."""
    from mxu.hdl.dtypes import bfloat16
    from mxu.sim.runtime.vector import layer_norm_params, softmax_bias
    from mxu.verif import vpu
    cfg = chip.config
    _fresh(chip)
    rng = np.random.default_rng(SEED + 11)
    R, n = 12, 7
    x = (rng.standard_normal((R, n)) * 2).astype(np.float32)
    X = chip.upload(x)
    bf = lambda a: golden.fp32_to_bf16(np.asarray(a, np.float32).view(np.uint32))

    out, out_b = chip.empty((R, n)), chip.empty((R, n), bfloat16)
    chip.vector("gelu", X, out=out, out_bf16=out_b)
    golden.assert_bits_equal(out.numpy(), vpu.gelu(x), "gelu")
    golden.assert_bits_equal(out_b.numpy().view(np.uint16), bf(vpu.gelu(x)), "gelu bf16")

    mask = rng.random((3, n)) < 0.6
    mask[:, 1] = True
    soft = chip.vector("softmax", X, out=chip.empty((R, n)), other=softmax_bias(chip, mask),
                       group=4, scale=0.25)
    want = vpu.softmax(vpu.scale(x, 0.25).reshape(3, 4, n), mask[:, None], lanes=cfg.cols)
    golden.assert_bits_equal(soft.numpy(), want.reshape(R, n), "softmax")

    y, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((R, n), n, n))
    ln = chip.vector("add_layer_norm", X, out=chip.empty((R, n)), other=chip.upload(y),
                     params=layer_norm_params(chip, g, b), eps=1e-5)
    golden.assert_bits_equal(ln.numpy(), vpu.layer_norm(vpu.add(x, y), g, b, 1e-5, lanes=cfg.cols),
                             "add_layer_norm")

    copy, t = chip.vector("copy", X, out_bf16=chip.empty((R, n), bfloat16),
                          out_t=chip.empty((n, R), bfloat16))
    golden.assert_bits_equal(copy.numpy().view(np.uint16), bf(x), "copy")
    golden.assert_bits_equal(t.numpy().view(np.uint16), np.ascontiguousarray(bf(x).T), "transpose")

    w1 = rng.standard_normal((n, 9)).astype(np.float32)
    w2 = rng.standard_normal((9, 5)).astype(np.float32)
    W1, W2 = chip.upload(w1, dtype=bfloat16), chip.upload(w2, dtype=bfloat16)
    h, hb = chip.empty((R, 9)), chip.empty((R, 9), bfloat16)
    with chip.record() as rec:
        chip.matmul(chip.upload(x, dtype=bfloat16), W1, out=h)
        chip.vector("gelu", h, out_bf16=hb)
        z = chip.matmul(hb, W2, keep=True)
    assert rec.stats.programs == 1 and rec.stats.vector_active_cycles > 0
    hh = golden.matmul(golden.as_bf16(x), golden.as_bf16(w1), rows=cfg.rows)
    want = golden.matmul(bf(vpu.gelu(hh)).view(bfloat16), golden.as_bf16(w2), rows=cfg.rows)
    golden.assert_bits_equal(z.numpy(), want, "matmul -> gelu -> matmul in one program")


def test_chip_vector_rejects_bad_input(chip):
    from mxu.hdl.dtypes import bfloat16
    X = chip.upload(np.zeros((4, 6), np.float32))
    with pytest.raises(ValueError, match="kind must be one of"):
        chip.vector("tanh", X, out=chip.empty((4, 6)))
    with pytest.raises(TypeError, match="x must be a float32 device tensor"):
        chip.vector("gelu", chip.upload(np.zeros((4, 6), np.float32), dtype=bfloat16))
    with pytest.raises(ValueError, match="out must have shape"):
        chip.vector("gelu", X, out=chip.empty((4, 5)))
    with pytest.raises(ValueError, match="needs an output"):
        chip.vector("gelu", X)
    with pytest.raises(ValueError, match="group"):
        chip.vector("softmax", X, out=chip.empty((4, 6)),
                    other=chip.upload(np.zeros((3, 8), np.float32)), group=3)
    with pytest.raises(ValueError, match="no vector unit"):
        Chip(TINY).vector("gelu", X)


@pytest.mark.parametrize("pause", [0, 50])
def test_cocotb_vector_programs(pause, tmp_path):
    """The vector programs and errors through cocotb, with cocotbext-axi's
    AxiRam as memory (random pauses on every AXI channel at pause=50), on the
    4x4 chip with the vector unit (Verilator; the fast lanes, held to the RTL
    lanes by `test_fast_lanes_give_the_same_results_and_cycles`: the protocol
    is what this test is for)."""
    run_cocotb_chip("mxu.verif.tb_vector", pause, SEED, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("stages", sorted({1, ChipConfig.preset("fpga-llm").vpu_stages}))
def test_fast_lanes_give_the_same_results_and_cycles(stages):
    """The fast vector lane (`mxu.sim.backends.fast_vpu`, C generated from
    `mxu.hdl.vecmath`) against the RTL lane on the chip, with one-stage fp32
    units and with the fpga-llm preset's: the vector program and the
    functions over operands that cover every exponent: same bits, same cycles."""
    cfg = VPU_SHAPES["4x4"].replace(vpu_stages=stages)
    rtl, fast = Chip(cfg), Chip(cfg, fast_mac=True)
    p, image, outputs = programs.vector_program(cfg, np.random.default_rng(SEED + 3))
    rng = np.random.default_rng(SEED + 4)
    # Every sign and exponent field once (mantissa 0), then random and special words.
    sweep = np.arange(0, 1 << 32, 1 << 23, dtype=np.uint64).astype(np.uint32)
    sweep = np.concatenate([sweep, programs.fp32_operands(rng, (64,))]).reshape(-1, 4)
    results = []
    for chip in (rtl, fast):
        result = _run_checked(chip, p, image, outputs)
        funcs = Program().load(acc_row=0, ext_addr=0, rows=len(sweep), row_bytes=16,
                               push_next=True)
        funcs.sync("compute", pop_prev=True, push_next=True, vector=True)
        for k, op in enumerate(("exp", "recip", "rsqrt", "mul")):
            funcs.vector(op, a_row=0, rows=len(sweep), dst_row=(k + 1) * len(sweep),
                         b_row=0 if op == "mul" else None, pop_prev=k == 0, push_next=k == 3)
        funcs.store(acc_row=len(sweep), ext_addr=0x20000, rows=4 * len(sweep), row_bytes=16,
                    pop_prev=True, vector=True).halt()
        assert not races(cfg, funcs)
        done, fmodel, _ = programs.run_both(chip, funcs, {0: sweep})
        n = 4 * len(sweep) * 16
        golden.assert_bits_equal(done.memory[0x20000:0x20000 + n], fmodel.ext[0x20000:0x20000 + n],
                                 "functions over every exponent")
        results.append((result.counters["cycles"], done.counters["cycles"],
                        done.memory[0x20000:0x20000 + n].copy()))
    assert results[0][:2] == results[1][:2]
    np.testing.assert_array_equal(results[0][2], results[1][2])


def _two_vectors_cycles(chip, n, rng):
    """Load `n` rows, run two independent VECTORs of `n` rows each (an add
    and a multiply) and store their results; its cycles, the results checked
    against the ISA model."""
    cols = chip.config.cols
    out = 0x40000
    p = Program().load(acc_row=0, ext_addr=0, rows=n, row_bytes=4 * cols, push_next=True)
    p.sync("compute", pop_prev=True, push_next=True, vector=True)
    p.vector("add", a_row=0, rows=n, dst_row=n, b_row=0, pop_prev=True)
    p.vector("mul", a_row=0, rows=n, dst_row=2 * n, b_row=0, push_next=True)
    p.store(acc_row=n, ext_addr=out, rows=2 * n, row_bytes=4 * cols, pop_prev=True,
            vector=True).halt()
    assert not races(chip.config, p)
    image = {0: programs.fp32_operands(rng, (n, cols))}
    return _run_checked(chip, p, image, [(out, out + 8 * n * cols)]).counters["cycles"]


@pytest.mark.parametrize("stages", sorted({2, ChipConfig.preset("fpga-llm").vpu_stages}))
def test_pipelined_vector_unit_keeps_a_row_a_cycle(stages):
    """The registered handshakes of a pipelined vector unit (the queue in
    front of the interlock, the input stage, the output queue: docs/vpu.md,
    "Pipeline depth") cost latency, not throughput: 192 more rows in each of
    two VECTORs add as many cycles at `stages` as with one-stage units."""
    def extra(config):
        chip = Chip(config, fast_mac=True)
        rng = np.random.default_rng(SEED + 5)
        return _two_vectors_cycles(chip, 256, rng) - _two_vectors_cycles(chip, 64, rng)
    base = VPU_SHAPES["4x4"]
    assert extra(base.replace(vpu_stages=stages)) == extra(base)


def _vector_program_runs(chips, seed):
    """The vector program on each of `chips` (checked against the ISA model):
    its counters and output bytes, per chip."""
    p, image, outputs = programs.vector_program(chips[0].config, np.random.default_rng(seed))
    runs = []
    for c in chips:
        result = _run_checked(c, p, image, outputs)
        runs.append((result.counters, bytes(result.memory[:max(hi for _, hi in outputs)])))
    return runs


def test_idle_gating_gives_the_same_results_and_cycles():
    """The fast build with the idle vector unit's clock gated (the default,
    docs/simulation.md) against the build that evaluates it every cycle, on
    the vector program: the same bits and the same counters (cycles, rows
    taken, stalls)."""
    cfg = VPU_SHAPES["4x4"]
    runs = _vector_program_runs([Chip(cfg, fast_mac=True),
                                 Chip(cfg, fast_mac=True, idle_gating=False)], SEED + 6)
    assert runs[0][0]["vector_active"] > 0
    assert runs[0] == runs[1]


def test_profile_build_gives_the_same_results_and_cycles():
    """``profile_units=True`` (each unit of the core a C++ class of its own,
    for bench/simprofile.py) is the same model: same bits, same counters."""
    cfg = VPU_SHAPES["4x4"]
    runs = _vector_program_runs([Chip(cfg, fast_mac=True),
                                 Chip(cfg, fast_mac=True, profile_units=True)], SEED + 5)
    assert runs[0] == runs[1]
