"""Quantized weights on the whole chip: a quantized LOAD (the weight expander
in the DMA's load path) then LOADW and MATMUL give the golden matmul with the
golden expander's weights, for every format, on the default 16x16 chip and
on the `fpga` preset's chip."""

import re
import numpy as np
import pytest

from chip_configs import SHAPES
from mxu.hdl.isa import ErrorCode
from mxu.hdl.quant import QUANT_INFO, QuantFormat, repack, tile_block_bytes
from mxu.sim import Chip
from mxu.sim.compiler.program import Program
from mxu.verif import golden
from mxu.verif.quant import D_AT, dequantize, expand_tiles, random_blocks

CONFIG = SHAPES["16x16"]
A_AT, W_AT, C_AT = 0x10000, 0x40000, 0x80000


@pytest.fixture(scope="module")
def chip():
    return Chip(CONFIG, fast_mac=True)


def _program(fmt, m, k, w_row, tile):
    """Activations (m x k) tile by tile into VMEM rows 0.., the weight strip
    with one quantized LOAD into rows w_row.., then LOADW + MATMUL per K tile."""
    R, N = CONFIG.rows, CONFIG.cols
    p = Program()
    for t in range(k // R):
        p.load(ext_addr=A_AT + 2 * R * t, rows=m, row_bytes=2 * R, ext_stride=2 * k,
               vmem_row=m * t)
    p.load(ext_addr=W_AT, rows=k, row_bytes=tile, vmem_row=w_row, format=fmt, push_next=True)
    for t in range(k // R):
        p.loadw(vmem_row=w_row + R * t, k_rows=R, pop_prev=t == 0)
        p.matmul(act_row=m * t, m_rows=m, out_row=0, seed="zero" if t == 0 else "acc",
                 new_weights=True, push_next=t == k // R - 1)
    p.store(ext_addr=C_AT, rows=m, row_bytes=4 * N, acc_row=0, pop_prev=True)
    return p.halt()


@pytest.mark.parametrize("fmt", [QuantFormat[n] for n in CONFIG.quant_formats],
                         ids=lambda f: f.name)
def test_quantized_load_loadw_matmul(chip, fmt):
    """The expander's two rows a cycle on VMEM's two DMA write lanes
    (``quant_rows`` 2), with the bus at full rate."""
    assert CONFIG.quant_rows == 2
    _check_quantized_matmul(chip, fmt)


@pytest.mark.parametrize("fmt", [QuantFormat[n] for n in CONFIG.quant_formats],
                         ids=lambda f: f.name)
def test_quantized_load_under_stalls(chip, fmt):
    """The same with a slow, irregular bus: random read latency and the R and
    AR channels paused 40 % of the cycles, so that beats arrive with gaps
    and groups of rows leave the expander at irregular times; the strip at
    an odd VMEM row, so that lane 0 writes the odd rows."""
    chip.set_memory_timing(latency=(0, 24), pause={"ar": 40, "r": 40}, seed=fmt.value)
    try:
        _check_quantized_matmul(chip, fmt, w_row=513)
    finally:
        chip.set_memory_timing()


def _check_quantized_matmul(chip, fmt, w_row=512):
    info = QUANT_INFO[fmt]
    N, m = CONFIG.cols, 5
    k = info.block * (2 if info.block == 32 else 1)
    rng = np.random.default_rng(fmt.value)
    raw = random_blocks(fmt, N * (k // info.block), fmt.value)
    strip = repack(raw, fmt, (N, k), N)
    W = expand_tiles(strip, fmt, N)                               # (k, N) bf16 bits
    A = golden.as_bf16(rng.standard_normal((m, k)).astype(np.float32))
    result = chip.run(_program(fmt, m, k, w_row, tile_block_bytes(fmt, N)),
                      {A_AT: A.view(np.uint16).tobytes(), W_AT: strip.tobytes()})
    assert result.error == ErrorCode.NONE, result
    got = np.frombuffer(chip.read_memory(C_AT, m * N * 4), np.float32).reshape(m, N)
    want = golden.matmul(A, W.view(golden.bf16), rows=CONFIG.rows)
    golden.assert_bits_equal(got, want, what=f"{fmt.name} matmul", seed=fmt.value)


def test_bad_quantized_load_is_a_descriptor_error(chip):
    fmt = QuantFormat.Q4_0
    p = Program().load(ext_addr=W_AT, rows=48, row_bytes=tile_block_bytes(fmt, CONFIG.cols),
                       vmem_row=0, format=fmt).halt()
    result = chip.run(p)
    assert result.error == ErrorCode.DMA_DESCRIPTOR, result
    ok = chip.run(Program().load(ext_addr=W_AT, rows=32, row_bytes=tile_block_bytes(
        fmt, CONFIG.cols), vmem_row=0, format=fmt).halt())
    assert ok.error == ErrorCode.NONE, ok


# ------------------------------------------------------------------ the runtime

@pytest.mark.parametrize("name,n,k,m", [("Q4_1", 40, 96, 3), ("Q8_0", 16, 64, 1),
                                        ("Q6_K", 24, 256, 2)])
def test_upload_quantized_matmul(chip, name, n, k, m):
    """chip.matmul(x, W) with W on the chip as its GGUF blocks equals the
    golden matmul, and the bf16 path, bit for bit."""
    import gguf
    fmt = QuantFormat[name]
    info = QUANT_INFO[fmt]
    raw = random_blocks(fmt, n * k // info.block, 11)
    raw[:, QUANT_INFO[fmt].file_bytes - 2 if fmt is QuantFormat.Q6_K else 0:][:, :2] = \
        np.array([0.02], np.float16).view(np.uint8)          # finite scales
    free = chip.free_bytes
    W = chip.upload_quantized(raw.tobytes(), gguf.GGMLQuantizationType[name], (n, k),
                              name="blk.0.ffn_up.weight")
    assert W.shape == (k, n) and W.format is fmt
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = chip.matmul(x, W)
    stats = chip.last_stats
    assert stats.macs == m * k * n and stats.cycles > 0
    assert stats.utilization == pytest.approx(m * k * n / CONFIG.rows / CONFIG.cols / stats.cycles)
    Wb = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)
    golden.assert_bits_equal(got, golden.matmul(x, Wb, rows=CONFIG.rows), what=f"{name} matmul")
    golden.assert_bits_equal(got, chip.matmul(x, Wb), what=f"{name} vs the bf16 path")
    W.free()
    assert chip.free_bytes == free


def test_fpga_chip_quantized_matmuls():
    """The `fpga` preset's chip (RTL MACs, one weight row a cycle, a 64-bit
    bus) with its expander (docs/synth.md): every
    format's quantized matmul equals the golden one and the bf16 path, bit
    for bit; the strips of one matmul are quantized LOADs back to back."""
    from mxu.hdl import ChipConfig
    config = ChipConfig.preset("fpga")
    assert set(config.quant_formats) == {f.name for f in QUANT_INFO}
    chip = Chip(config)
    rng = np.random.default_rng(17)
    for n, fmt in enumerate(QUANT_INFO):
        info = QUANT_INFO[fmt]
        k, cols = 2 * info.block, 3 * config.cols + 1
        raw = random_blocks(fmt, cols * k // info.block, 40 + n)
        at = D_AT.get(fmt, 0)
        raw[:, at:at + 2] = np.array([0.02], np.float16).view(np.uint8)     # finite scales
        W = chip.upload_quantized(raw, fmt.name, (cols, k), name=f"{fmt.name} weight")
        x = rng.standard_normal((2, k)).astype(np.float32)
        got = chip.matmul(x, W)
        Wb = dequantize(raw, fmt, (cols, k)).T.view(golden.bf16)
        golden.assert_bits_equal(got, golden.matmul(x, Wb, rows=config.rows),
                                 what=f"{fmt.name} matmul on the fpga chip")
        golden.assert_bits_equal(got, chip.matmul(x, Wb), what=f"{fmt.name} vs the bf16 path")
        W.free()


def test_upload_quantized_errors(chip):
    free = chip.free_bytes
    block = np.zeros(18, np.uint8)
    name = "blk.3.attn_q.weight"
    cases = [
        (dict(raw=np.zeros(17 * 4, np.uint8), qtype="Q4_0", shape=(4, 32)),
         "blk.3.attn_q.weight: Q4_0 block array of 68 bytes for shape \\(4, 32\\): expected 72"),
        (dict(raw=block, qtype="IQ2_XXS", shape=(1, 256)),
         "blk.3.attn_q.weight: quantization type 'IQ2_XXS' is not one the chip expands"),
        (dict(raw=block, qtype="Q4_0", shape=(1, 40)),
         "blk.3.attn_q.weight: row length 40 is not a whole number of Q4_0 blocks of 32"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            chip.upload_quantized(name=name, **kwargs)
        assert chip.free_bytes == free
    W = chip.upload_quantized(np.zeros(18 * 16, np.uint8), "Q4_0", (16, 32), name=name)
    with pytest.raises(TypeError, match="blk.3.attn_q.weight: a quantized tensor holds weights; "
                                        "it cannot be the activations A of a matmul"):
        chip.matmul(W, np.zeros((32, 16), np.float32))
    with pytest.raises(TypeError, match="blk.3.attn_q.weight: a quantized tensor holds weights; "
                                        "it cannot be bias of a matmul"):
        chip.matmul(np.zeros((1, 32), np.float32), W, bias=W)
    with pytest.raises(ValueError, match=r"inner dimensions differ: A is \(1, 64\), B is "
                                         r"\(32, 16\) \(blk.3.attn_q.weight\)"):
        chip.matmul(np.zeros((1, 64), np.float32), W)
    assert np.array_equal(chip.matmul(np.ones((1, 32), np.float32), W),
                          np.zeros((1, 16), np.float32))    # d = 0: every weight is -0 or +0
    W.free()
    with pytest.raises(ValueError, match="was freed"):
        chip.matmul(np.ones((1, 32), np.float32), W)
    assert chip.free_bytes == free


def test_quantized_weights_take_what_bf16_weights_take(chip):
    """A bias, ReLU, a bf16 result and a recording of several matmuls: the
    same bits as with the bf16 upload of the same weights."""
    fmt = QuantFormat.Q4_1
    n, k = 40, 128
    raw = random_blocks(fmt, n * k // 32, 3)
    raw[:, :2] = np.array([0.02], np.float16).view(np.uint8)
    raw[:, 2:4] = np.array([-0.1], np.float16).view(np.uint8)
    W = chip.upload_quantized(raw, fmt, (n, k), name="w")
    Wb = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for kwargs in (dict(bias=bias), dict(bias=bias, relu=True, out_dtype=golden.bf16)):
        got = chip.matmul(x, W, **kwargs)
        golden.assert_bits_equal(np.asarray(got, np.float32),
                                 np.asarray(chip.matmul(x, Wb, **kwargs), np.float32),
                                 what=f"quantized vs bf16 weights, {sorted(kwargs)}")
    with chip.record():
        outs = [chip.matmul(x[i:i + 2], W) for i in range(3)]
    for i, out in enumerate(outs):
        golden.assert_bits_equal(out.numpy(), golden.matmul(x[i:i + 2], Wb, rows=CONFIG.rows),
                                 what=f"recorded matmul {i}")
        out.free()
    W.free()


def test_quantized_weights_split_k_between_blocks():
    """When K does not fit VMEM, the lowering cuts it into chunks of whole
    blocks (a quantized load starts at a tile-block), each seeded with the
    previous chunk's sums; the program compiles with its quantized LOADs."""
    from mxu.hdl import ChipConfig
    from mxu.sim.compiler.lower import lower_matmul
    from mxu.sim.compiler.matmul import compile_matmuls
    from mxu.sim.compiler.operands import Operand, QuantOperand
    config = ChipConfig(rows=8, cols=8, vmem_bytes=8 << 10)      # 512 VMEM rows
    fmt, k, n, m = QuantFormat.Q4_1, 4096, 16, 2
    strip = k // 32 * tile_block_bytes(fmt, 8)
    b = QuantOperand(0x10000, k, n, fmt, strip, 8)
    a = Operand(0x100000, m, k, 2 * k, "bf16")
    c = Operand(0x200000, m, n, 4 * n, "fp32")
    ops = lower_matmul(config, a, b, c).build([])
    assert len(ops) > 1
    assert all(op.b.rows % 32 == 0 for op in ops) and sum(op.K for op in ops) == k
    assert [op.b.addr for op in ops] == [b.addr + sum(o.K for o in ops[:i]) // 32 *
                                         tile_block_bytes(fmt, 8) for i in range(len(ops))]
    compile_matmuls(config, ops)                               # with its LOOPs
    program = compile_matmuls(config, ops, loops=False).program
    quant = [t for t in program.text if f"'quant': {fmt.value}" in str(t)]
    tile = tile_block_bytes(fmt, 8)
    assert all(f"row_bytes={tile}" in str(t) for t in quant)
    # Each LOAD brings whole blocks (a chunk of them), each tile-block once.
    spans = sorted((int(re.search(r"ext_addr=(\d+)", t)[1]), int(re.search(r"rows=(\d+)", t)[1]))
                   for t in quant)
    assert all(rows % 32 == 0 for _, rows in spans)
    blocks = [addr + i * tile for addr, rows in spans for i in range(rows // 32)]
    assert sorted(blocks) == sorted(set(blocks)) and len(blocks) == 2 * k // 32


def test_quantized_ops_share_a_segment_only_when_their_rings_fit_one():
    """Gemma 3 270M's Q projection (640 x 1024, QK-norm: a row-wise epilogue,
    so one group of all 64 N tiles, in chunks of 8 K tiles) and its K
    projection (640 x 256, chunks of 40) cannot share one ring of slots of
    the longest chunk: `ring_shared` keeps them apart (on the real model
    they met in one segment, and its ring ran out of slots). Two plain
    projections of one shape can."""
    from types import SimpleNamespace

    from mxu.hdl import ChipConfig
    from mxu.sim.compiler.operands import QuantOperand
    from mxu.sim.compiler.plan import chunk_tiles, ring_shared
    config = ChipConfig.preset("llm")
    fmt, c = QuantFormat.Q5_0, config.cols

    def op(k, n, row_wise):
        b = QuantOperand(0, k, n, fmt, k // 32 * tile_block_bytes(fmt, c), c)
        epilogue = SimpleNamespace(row_wise=True) if row_wise else None
        return SimpleNamespace(M=6, b=b, epilogue=epilogue)

    q, k = op(640, 1024, True), op(640, 256, True)
    assert chunk_tiles(config, q) < chunk_tiles(config, k)
    assert not ring_shared(config, [q, k])
    assert ring_shared(config, [q]) and ring_shared(config, [k])
    assert ring_shared(config, [op(640, 1024, False), op(640, 1024, False)])


def test_a_short_quantized_segment_preloads_the_next_ones_weights():
    """One program: a quantized matmul of 16 rows whose few steps (fewer
    than its lead) leave the bus room, then a plain matmul that reads
    nothing the first one writes. The plain one's weight tiles load in that
    room, from the first segment's last step (docs/compiler.md, "Preloaded
    weights"); both results equal the golden ones, bit for bit, and the
    program is race-free."""
    from mxu.hdl import ChipConfig
    from mxu.hdl.dtypes import bfloat16
    from mxu.sim.compiler.matmul import compile_matmuls
    from mxu.verif.hazards import races
    chip = Chip(ChipConfig.preset("llm"), fast_mac=True)
    cfg, fmt = chip.config, QuantFormat.Q4_0
    n, k = 4 * cfg.cols, 4 * cfg.rows            # 16 steps at 16 rows
    raw = random_blocks(fmt, n * k // QUANT_INFO[fmt].block, 23)
    raw[:, D_AT.get(fmt, 0):D_AT.get(fmt, 0) + 2] = np.array([0.02], np.float16).view(np.uint8)
    W = chip.upload_quantized(raw, fmt.name, (n, k), name="short weight")
    rng = np.random.default_rng(29)
    x, x2, w2 = (golden.as_bf16(rng.standard_normal(shape).astype(np.float32))
                 for shape in ((16, k), (16, 2 * cfg.rows), (2 * cfg.rows, 2 * cfg.cols)))
    X, X2, W2 = (chip.upload(a, dtype=bfloat16) for a in (x, x2, w2))
    y, y2 = chip.empty((16, n)), chip.empty((16, 2 * cfg.cols))
    with chip.record() as rec:
        chip.matmul(X, W, out=y)
        chip.matmul(X2, W2, out=y2)
    ops = [op for call in rec.calls for op in call.ops]
    compiled = compile_matmuls(cfg, ops)
    assert compiled.preloads > 0 and races(cfg, compiled.program) == []
    Wb = dequantize(raw, fmt, (n, k)).T.view(golden.bf16)
    golden.assert_bits_equal(y.numpy(), golden.matmul(x, Wb, rows=cfg.rows), what="quantized")
    golden.assert_bits_equal(y2.numpy(), golden.matmul(x2, w2, rows=cfg.rows), what="preloaded")


def test_a_wide_add_rms_norm_on_quantized_weights_runs_in_chunks():
    """A batch-16 decode step's output projection: add_rms_norm over every N
    tile of 16-row steps that outlast their Q4_1 tiles' beats. Its N tiles
    go in chunks (24, 8 and 4 of SmolLM2's 36; here 8, 8 and 4 of 20), each
    chunk's tiles added, squared and summed into the tree while the array
    goes on (docs/compiler.md, "Norm chunks"): a compute token for each
    chunk's part, a race-free program, and the sum and the norm bit for bit
    the golden VPU form's."""
    from mxu.hdl import ChipConfig
    from mxu.hdl.dtypes import bfloat16
    from mxu.sim.compiler.matmul import compile_matmuls
    from mxu.verif import vpu
    from mxu.verif.hazards import races
    chip = Chip(ChipConfig.preset("llm"), fast_mac=True)
    cfg, fmt, M = chip.config, QuantFormat.Q4_1, 16
    n, k = 20 * cfg.cols, 4 * cfg.rows
    raw = random_blocks(fmt, n * k // QUANT_INFO[fmt].block, 31)
    raw[:, D_AT.get(fmt, 0):D_AT.get(fmt, 0) + 2] = np.array([0.02], np.float16).view(np.uint8)
    W = chip.upload_quantized(raw, fmt.name, (n, k), name="o_proj")
    rng = np.random.default_rng(37)
    a = golden.as_bf16(rng.standard_normal((M, k)).astype(np.float32))
    res = rng.standard_normal((M, n)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal((1, n))).astype(np.float32)
    out, norm = chip.empty((M, n)), chip.empty((M, n), bfloat16)
    with chip.record() as rec:
        chip.matmul(chip.upload(a, dtype=bfloat16), W, out=out, out_bf16=norm, then="add_rms_norm",
                    other=chip.upload(res), params=chip.upload(gamma), eps=1e-5)
    program = compile_matmuls(cfg, rec.calls[0].ops).program
    parts = [t for t in program.text if t.startswith("VECTOR") and "pop_prev" in t]
    assert len(parts) == 3, parts
    assert races(cfg, program) == []
    x = golden.matmul(a, dequantize(raw, fmt, (n, k)).T.view(golden.bf16), rows=cfg.rows) + res
    golden.assert_bits_equal(out.numpy(), x, "the sum")
    want = golden.fp32_to_bf16(golden.f32_bits(vpu.rms_norm(x, gamma[0], 1e-5, lanes=cfg.cols)))
    golden.assert_bits_equal(norm.numpy().view(np.uint16), want, "the norm")
