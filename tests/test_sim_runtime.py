"""The runtime (docs/runtime.md): device tensors, views, chained matmuls, splits
of M, N and K on small chips, recorded programs and the compile cache; every
result bit-exact against the golden model."""

import gc

import ml_dtypes
import numpy as np
import pytest

from chip_configs import SHAPES, TINY
from mxu.hdl import ChipConfig
from mxu.sim import Chip, DeviceTensor, RunStats
from mxu.verif import golden

SEED = 20261125


@pytest.fixture(scope="module")
def tiny():
    return Chip(TINY)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _exact(C, A, B, rows, bias=None, what="matmul"):
    seed = None if bias is None else np.broadcast_to(np.asarray(bias, np.float32), C.shape)
    golden.assert_bits_equal(np.asarray(C), golden.matmul(np.asarray(A), np.asarray(B), seed=seed,
                                                         rows=rows), what, seed=SEED)


def test_upload_and_read_back(tiny):
    rng = np.random.default_rng(SEED)
    x = _rand(rng, 5, 7)
    t = tiny.upload(x)
    assert isinstance(t, DeviceTensor) and t.shape == (5, 7) and t.dtype == np.float32
    assert t.addr % 64 == 0 and t.stride == 28
    np.testing.assert_array_equal(t.numpy(), x)
    b = tiny.upload(x, dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(b.numpy(), x.astype(ml_dtypes.bfloat16))
    v = tiny.upload(np.arange(10, dtype=np.float32))
    assert v.shape == (10,) and np.array_equal(np.asarray(v), np.arange(10))


def test_views_copy_nothing(tiny):
    rng = np.random.default_rng(SEED + 1)
    x = _rand(rng, 6, 10)
    t = tiny.upload(x)
    free = tiny.free_bytes
    view = t[1:4, 2:7]
    assert tiny.free_bytes == free
    assert view.shape == (3, 5) and view.stride == t.stride and view.addr == t.addr + 40 + 8
    np.testing.assert_array_equal(view.numpy(), x[1:4, 2:7])
    np.testing.assert_array_equal(t[2].numpy(), x[2])
    np.testing.assert_array_equal(t[:, 3].numpy(), x[:, 3:4])
    with pytest.raises(IndexError, match="step 1"):
        t[::2]


def test_memory_is_freed_when_dropped_or_freed(tiny):
    free = tiny.free_bytes
    t = tiny.upload(np.ones((100, 100), np.float32))
    view = t[10:20]
    assert tiny.free_bytes == free - 40000
    del t
    gc.collect()
    assert tiny.free_bytes < free               # the view keeps the block
    del view
    gc.collect()
    assert tiny.free_bytes == free
    u = tiny.upload(np.ones(3, np.float32))
    w = u[1:]
    u.free()
    assert tiny.free_bytes == free
    with pytest.raises(ValueError, match="was freed"):
        w.numpy()


@pytest.mark.parametrize("bad, error, match", [
    (lambda c: c.upload([1.0]), TypeError, "numpy array"),
    (lambda c: c.upload(np.ones(3, np.int32)), TypeError, "float array"),
    (lambda c: c.upload(np.ones((2, 2, 2), np.float32)), ValueError, "1-D or 2-D"),
    (lambda c: c.upload(np.ones(3, np.float32), dtype=np.float64), TypeError, "bfloat16 or float32"),
    (lambda c: c.empty((1 << 20,), np.float32), ValueError,
     r"cannot allocate 4,194,304 bytes .* has 1,048,576 bytes"),
])
def test_bad_tensors(tiny, bad, error, match):
    with pytest.raises(error, match=match):
        bad(tiny)


def test_tensors_of_another_chip_and_wrong_dtypes(tiny):
    other = Chip(TINY)
    a = other.upload(np.ones((2, 3), np.float32), dtype=ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="another chip"):
        tiny.matmul(a, np.ones((3, 2), np.float32))
    f = tiny.upload(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="must be a bfloat16 device tensor"):
        tiny.matmul(f, np.ones((3, 2), np.float32))


def test_device_tensors_views_and_chaining(tiny):
    """Operands that are row and column slices of resident tensors, a result
    kept on the chip as bf16 and fed to the next matmul."""
    rng = np.random.default_rng(SEED + 2)
    X = _rand(rng, 20, 30)
    W = _rand(rng, 40, 24)
    Wd = tiny.upload(W, dtype=ml_dtypes.bfloat16)
    Xd = tiny.upload(X, dtype=ml_dtypes.bfloat16)
    C = tiny.matmul(Xd[3:15, 5:22], Wd[10:27, 4:13])
    _exact(C, Xd.numpy()[3:15, 5:22], Wd.numpy()[10:27, 4:13], 4, what="views")
    H = tiny.matmul(Xd, Wd[:30], out_dtype=ml_dtypes.bfloat16, relu=True, keep=True)
    assert isinstance(H, DeviceTensor) and H.dtype == ml_dtypes.bfloat16 and H.shape == (20, 24)
    V = _rand(rng, 24, 6)
    Y = tiny.matmul(H, V, bias=np.full(6, 0.5, np.float32))
    want_h = golden.matmul(Xd.numpy(), Wd.numpy()[:30], rows=4)
    want_h = np.where(want_h > 0, want_h, np.float32(0)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(H.numpy().view(np.uint16), want_h.view(np.uint16))
    _exact(Y, want_h, V, 4, bias=np.full(6, 0.5, np.float32), what="chained")
    out = tiny.empty((20, 6), np.float32)
    assert tiny.matmul(H, V, bias=np.full(6, 0.5, np.float32), out=out) is out
    np.testing.assert_array_equal(out.numpy(), Y)


@pytest.mark.parametrize("shape, M, K, N", [
    ("1x1", 3, 9000, 2),      # one activation row needs 9000 VMEM rows: the 1x1 chip has 8192
    ("4x4", 5, 8300, 6),      # 2075 rows against 2048
    ("3x5", 4, 5100, 11),     # 1700 rows against 1638
    ("4x4", 300, 40, 700),    # M and N far beyond one accumulator block
])
def test_splits_of_m_n_and_k(shape, M, K, N):
    chip = Chip(SHAPES[shape])
    rng = np.random.default_rng(SEED + M)
    A, B = _rand(rng, M, K), _rand(rng, K, N)
    bias = _rand(rng, N)
    C = chip.matmul(A, B, bias=bias)
    _exact(C, A, B, chip.config.rows, bias=bias, what=f"{shape} {M}x{K}x{N}")


def test_split_k_with_relu_and_bf16_output():
    chip = Chip(SHAPES["1x1"])
    rng = np.random.default_rng(SEED + 3)
    A, B = _rand(rng, 2, 9000), _rand(rng, 9000, 3)
    C = chip.matmul(A, B, relu=True, out_dtype=ml_dtypes.bfloat16)
    want = golden.matmul(A, B, rows=1)
    want = np.where(np.isnan(want) | (want > 0), want, np.float32(0)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(C.view(np.uint16), want.view(np.uint16))


def test_recorded_heads_are_one_program_and_replay_from_the_cache(tiny):
    rng = np.random.default_rng(SEED + 4)
    Q = [_rand(rng, 16, 8) for _ in range(6)]
    Kt = [_rand(rng, 8, 16) for _ in range(6)]
    Kd = [tiny.upload(k, dtype=ml_dtypes.bfloat16) for k in Kt]
    Qd = [tiny.upload(q, dtype=ml_dtypes.bfloat16) for q in Q]
    with tiny.record() as rec:
        outs = [tiny.matmul(q, k) for q, k in zip(Qd, Kd)]
    stats = rec.stats
    assert isinstance(stats, RunStats) and stats.programs == 1 and stats.cache_hits == 0
    assert stats.macs == 6 * 16 * 8 * 16 and tiny.last_stats is stats
    for out, q, k in zip(outs, Q, Kt):
        _exact(out.numpy(), q, k, 4, what="recorded head")
    again = rec.run()
    assert again.cache_hits == 1 and again.cycles == stats.cycles


def test_repeated_calls_hit_the_compile_cache(tiny):
    rng = np.random.default_rng(SEED + 5)
    A, B = _rand(rng, 9, 10), _rand(rng, 10, 7)
    first = tiny.matmul(A, B)
    again = tiny.matmul(A, B)
    assert tiny.last_stats.cache_hits == 1
    golden.assert_bits_equal(again.view(np.uint32), first.view(np.uint32), "cached replay")
    # The cache holds each program's image alone (docs/runtime.md).
    from mxu.sim.compiler.program import FrozenProgram
    assert all(isinstance(c.program, FrozenProgram) for c in tiny._programs.values())


def test_the_compile_cache_is_bounded_by_its_instructions(tiny, monkeypatch):
    """Programs beyond the instruction budget leave, oldest first, and come
    back by compiling again, with the same results; the newest always stays."""
    from mxu.sim.runtime import chip as chip_module
    rng = np.random.default_rng(SEED + 11)
    shapes = [(9, 10, 7), (5, 12, 9), (7, 6, 11)]
    pairs = [(_rand(rng, m, k), _rand(rng, k, n)) for m, k, n in shapes]
    tiny._programs.clear()                     # the module's chip: earlier tests' programs
    tiny.matmul(*pairs[0])
    first = sum(len(p.program) for p in tiny._programs.values())
    monkeypatch.setattr(chip_module, "PROGRAM_CACHE_INSTRUCTIONS", first)
    for a, b in pairs[1:]:
        tiny.matmul(a, b)
        assert tiny.last_stats.cache_hits == 0
        held = [len(p.program) for p in tiny._programs.values()]
        assert sum(held) <= first or len(held) == 1, held
    out = tiny.matmul(*pairs[0])               # evicted: compiled again
    assert tiny.last_stats.cache_hits == 0
    _exact(out, *pairs[0], 4, what="recompiled after eviction")
    tiny.matmul(*pairs[0])
    assert tiny.last_stats.cache_hits == 1


def test_stats_are_a_dataclass_with_the_old_keys(tiny):
    rng = np.random.default_rng(SEED + 6)
    tiny.matmul(_rand(rng, 16, 8), _rand(rng, 8, 8))
    s = tiny.last_stats
    assert s.macs == 16 * 8 * 8 and s.ideal_cycles == s.macs / 16
    assert s["utilization"] == s.utilization == s.ideal_cycles / s.cycles
    assert s.programs == 1 and s.instructions > 0 and s.dma_read_bytes > 0
    assert s.sim_seconds > 0 and s.host_seconds > 0
    assert set(s.stall_cycles) == {"load", "compute", "store"}


@pytest.mark.slow
@pytest.mark.parametrize("M, K, N", [(1024, 1024, 1024), (20000, 16, 16), (16, 30000, 16)])
def test_large_matmuls_on_the_default_chip(M, K, N):
    chip = Chip(ChipConfig(), fast_mac=True)
    rng = np.random.default_rng(SEED + 7)
    A, B = _rand(rng, M, K), _rand(rng, K, N)
    _exact(chip.matmul(A, B), A, B, 16, what=f"{M}x{K}x{N}")


def test_a_recording_keeps_its_operands_alive(tiny):
    """Inputs uploaded inside a recording and dropped at once must not be
    overwritten before the program runs; an output cannot be read before it."""
    rng = np.random.default_rng(SEED + 8)
    W = tiny.upload(_rand(rng, 8, 8), dtype=ml_dtypes.bfloat16)
    x1, x2 = _rand(rng, 5, 8), _rand(rng, 5, 8)
    with tiny.record():
        y1 = tiny.matmul(tiny.upload(x1, dtype=ml_dtypes.bfloat16), W)
        y2 = tiny.matmul(tiny.upload(x2, dtype=ml_dtypes.bfloat16), W)
        with pytest.raises(ValueError, match="has not run yet"):
            y1.numpy()
    _exact(y1.numpy(), x1, W.numpy(), 4, what="first recorded input")
    _exact(y2.numpy(), x2, W.numpy(), 4, what="second recorded input")


def test_a_recording_does_not_replay_on_freed_tensors(tiny):
    rng = np.random.default_rng(SEED + 9)
    W = tiny.upload(_rand(rng, 8, 8), dtype=ml_dtypes.bfloat16)
    with tiny.record() as rec:
        y = tiny.matmul(_rand(rng, 4, 8), W)
    y.free()
    with pytest.raises(ValueError, match="was freed"):
        rec.run()


def test_a_transient_tensor_lives_only_inside_its_program(tiny):
    """A transient intermediate feeds the next matmul of its recording; after
    the program it raises, and the recording still runs again."""
    rng = np.random.default_rng(SEED + 10)
    x, W1, W2 = _rand(rng, 6, 8), _rand(rng, 8, 8), _rand(rng, 8, 4)
    h = tiny.empty((6, 8), ml_dtypes.bfloat16, transient=True)
    assert h.transient and not tiny.empty((1, 1)).transient
    with tiny.record() as rec:
        tiny.matmul(x, W1, out=h)
        y = tiny.matmul(h, W2, keep=True)
    H = golden.matmul(x.astype(ml_dtypes.bfloat16), W1.astype(ml_dtypes.bfloat16), rows=4)
    _exact(y.numpy(), H.astype(ml_dtypes.bfloat16), W2, 4, what="through the transient")
    with pytest.raises(ValueError, match="transient"):
        h.numpy()
    with pytest.raises(ValueError, match="transient"):
        tiny.matmul(h, W2)
    rec.run()
    _exact(y.numpy(), H.astype(ml_dtypes.bfloat16), W2, 4, what="run again")
    with pytest.raises(TypeError, match="transient must be True or False"):
        tiny.empty((2, 2), transient="yes")


def test_short_k_with_a_bias_on_one_row(tiny):
    """A one-row Linear with one K tile: its bias is then a 1 x N matrix, whose
    buffers need wide groups to be spaced (this once failed to plan)."""
    rng = np.random.default_rng(SEED + 10)
    A, B, bias = _rand(rng, 1, 4), _rand(rng, 4, 40), _rand(rng, 40)
    _exact(tiny.matmul(A, B, bias=bias), A, B, 4, bias=bias, what="1x4x40 + bias")


def test_raw_programs_do_not_overwrite_tensors(tiny):
    """Without a base, a raw program goes where the allocator says."""
    from mxu.sim import Program
    big = tiny.free_bytes - 4096
    t = tiny.upload(np.full(big // 4, 3.0, np.float32))
    assert tiny.run(Program().halt()).ok
    assert np.all(t.numpy() == 3.0)
    t.free()
    with pytest.raises(ValueError, match="overlaps the program"):
        tiny.run(Program().halt(), {0x100: b"\x01" * 64}, base=0x100)
