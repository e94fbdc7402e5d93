"""`Chip.matmul` on the whole simulated chip, bit-exact against the golden model,
and its argument checking."""

import ml_dtypes
import numpy as np
import pytest

from chip_configs import SHAPES, TINY
from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.verif import golden
from mxu.verif.programs import loadw_bound_program

SEED = 20261122


@pytest.fixture(scope="module")
def tiny():
    return Chip(TINY)


def _check(chip, A, B, bias=None, **kw):
    C = chip.matmul(A, B, bias=bias, **kw)
    M, N = A.shape[0], B.shape[1]
    seed = None if bias is None else np.broadcast_to(np.asarray(bias, np.float32), (M, N))
    want = golden.matmul(A, B, seed=seed, rows=chip.config.rows)
    if kw.get("relu"):
        want = np.where(np.isnan(want) | (want > 0), want, np.float32(0)).astype(np.float32)
    if kw.get("out_dtype") is ml_dtypes.bfloat16:
        want = golden.fp32_to_bf16(golden.f32_bits(want)).view(ml_dtypes.bfloat16)
        golden.assert_bits_equal(C.view(np.uint16).astype(np.uint32),
                                 want.view(np.uint16).astype(np.uint32), "matmul bf16", seed=SEED)
    else:
        golden.assert_bits_equal(C, want, f"matmul {A.shape}x{B.shape}", seed=SEED)
    return C


# Verilator builds dominate `make test`: the 16x16 chip runs there with the fast
# MAC (identical results and cycles, `test_fast_mac_matches_the_rtl_array`), the
# all-RTL 16x16 and the 8x8 chips in `make test-all`.
_SHAPE_RUNS = [pytest.param(s, False, id=s) for s in ("1x1", "4x4", "3x5")] + [
    pytest.param("16x16", True, id="16x16-fastmac"),
    pytest.param("8x8", False, id="8x8", marks=pytest.mark.slow),
    pytest.param("16x16", False, id="16x16", marks=pytest.mark.slow)]


@pytest.mark.parametrize("shape, fast_mac", _SHAPE_RUNS)
def test_random_matmul_on_every_array_shape(shape, fast_mac):
    chip = Chip(SHAPES[shape], fast_mac=fast_mac)
    rng = np.random.default_rng(SEED)
    r, c = chip.config.rows, chip.config.cols
    for M, K, N in [(1, 1, 1), (2 * r + 1, 3 * r + 2, 2 * c + 3), (r, r, c)]:
        _check(chip, rng.standard_normal((M, K)).astype(np.float32),
               rng.standard_normal((K, N)).astype(np.float32))


def _specials(rng, shape):
    classes = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e38, -3e38, 1.0],
                       np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < 0.3
    x[mask] = rng.choice(classes, mask.sum())
    return x


def test_special_values(tiny):
    rng = np.random.default_rng(SEED + 1)
    _check(tiny, _specials(rng, (9, 11)), _specials(rng, (11, 6)))


def test_cancellation_heavy(tiny):
    rng = np.random.default_rng(SEED + 2)
    A = rng.standard_normal((12, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    A[:, 8:] = A[:, :8]           # second half of K cancels the first exactly ...
    B[8:] = -B[:8]
    B[8:] *= np.float32(1.0078125)  # ... or nearly
    _check(tiny, A * np.float32(1e4), B)


@pytest.mark.parametrize("bias_kind", ["row", "matrix"])
def test_bias_relu_and_bf16_output(tiny, bias_kind):
    rng = np.random.default_rng(SEED + 3)
    A = rng.standard_normal((10, 7)).astype(np.float32)
    B = rng.standard_normal((7, 9)).astype(np.float32)
    bias = rng.standard_normal(9 if bias_kind == "row" else (10, 9)).astype(np.float32)
    _check(tiny, A, B, bias=bias)
    _check(tiny, A, B, bias=bias, relu=True)
    _check(tiny, A, B, bias=bias, out_dtype=ml_dtypes.bfloat16)


def test_bfloat16_operands_and_stats(tiny):
    rng = np.random.default_rng(SEED + 4)
    A = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16)
    _check(tiny, A, B)
    stats = tiny.last_stats
    assert stats.ideal_cycles == 16 * 8 * 8 / 16
    assert 0 < stats.utilization <= 1
    assert stats["utilization"] == stats.utilization      # the old dict key still works
    assert stats.cycles >= stats.array_active_cycles == 16 * 2 * 2
    assert stats.dma_write_bytes == 16 * 8 * 4


@pytest.mark.parametrize("args,error,match", [
    (([[1.0]], np.ones((1, 1), np.float32)), TypeError, "A must be a numpy array"),
    ((np.ones(3, np.float32), np.ones((3, 1), np.float32)), ValueError, "A must be 2-D"),
    ((np.ones((2, 3), np.float32), np.ones((4, 1), np.float32)), ValueError, "inner dimensions"),
    ((np.ones((2, 3), np.int32), np.ones((3, 1), np.float32)), TypeError, "must be a float array"),
    ((np.ones((0, 3), np.float32), np.ones((3, 1), np.float32)), ValueError, "empty dimension"),
])
def test_bad_operands(tiny, args, error, match):
    with pytest.raises(error, match=match):
        tiny.matmul(*args)


def test_bad_bias_and_out_dtype(tiny):
    A, B = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) or \(2, 4\)"):
        tiny.matmul(A, B, bias=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="out_dtype"):
        tiny.matmul(A, B, out_dtype=np.int8)


def test_a_k_beyond_vmem_is_split_and_too_large_is_an_error(tiny):
    """K = 60000 needs 15000 VMEM rows for one activation row (the chip has 2048):
    K is split into chunks seeded with the partial sums, still bit-exact."""
    rng = np.random.default_rng(SEED + 8)
    _check(tiny, rng.standard_normal((1, 60000)).astype(np.float32),
           rng.standard_normal((60000, 1)).astype(np.float32))
    assert tiny.last_stats.programs == 1
    with pytest.raises(ValueError, match="external memory has 1,048,576 bytes"):
        tiny.matmul(np.ones((600, 600), np.float32), np.ones((600, 600), np.float32))


def test_random_memory_latency_and_back_pressure():
    """The whole chip against a slow, stalling external memory: random latency and
    40 % pauses on every AXI channel change the timing, never the result."""
    chip = Chip(TINY, mem_latency=(0, 24), mem_pause={ch: 40 for ch in ("aw", "w", "b", "ar", "r")},
                seed=SEED)
    rng = np.random.default_rng(SEED + 5)
    A = rng.standard_normal((13, 21)).astype(np.float32)
    B = rng.standard_normal((21, 10)).astype(np.float32)
    _check(chip, A, B, bias=rng.standard_normal(10).astype(np.float32), relu=True)
    slow = chip.last_stats.cycles
    fast = Chip(TINY)
    _check(fast, A, B, bias=np.zeros(10, np.float32))
    assert slow > fast.last_stats.cycles


def test_fast_mac_matches_the_rtl_array(tiny):
    """`fast_mac` replaces the PE grid with a C++ model of the same IEEE float32
    arithmetic (`mxu.sim.backends.fast_array`): results and cycle counts must
    equal the all-RTL chip's, specials included."""
    fast = Chip(TINY, fast_mac=True)
    rng = np.random.default_rng(SEED + 6)
    for M, K, N in [(9, 11, 6), (17, 8, 13)]:
        A, B = _specials(rng, (M, K)), _specials(rng, (K, N))
        C_fast = _check(fast, A, B)
        C_rtl = _check(tiny, A, B)
        golden.assert_bits_equal(C_fast, C_rtl, "fast_mac vs RTL array", seed=SEED)
        assert fast.last_stats.cycles == tiny.last_stats.cycles


def test_double_buffering_keeps_the_array_busy():
    """docs/performance.md / issue: >= 95 % utilization on 128x384x384 with the default
    chip, measured by the chip's own cycle counter from start to done."""
    chip = Chip(SHAPES["16x16"], fast_mac=True)   # same cycles as the RTL array, see above
    rng = np.random.default_rng(SEED + 7)
    A = rng.standard_normal((128, 384)).astype(np.float32)
    B = rng.standard_normal((384, 384)).astype(np.float32)
    _check(chip, A, B)
    stats = chip.last_stats
    assert stats["ideal_cycles"] == 128 * 384 * 384 / 256
    assert stats.utilization >= 0.95, stats
    assert stats["array_active_cycles"] == 128 * (384 // 16) * (384 // 16)


# One row a cycle is a Verilator build of its own (minutes): slow.
@pytest.mark.parametrize("width", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_loadw_takes_the_weight_load_cycles(width):
    """M = 1 tiles whose weights are in VMEM already: each further tile costs
    exactly its LOADW's ``ceil(rows / weight_rows_per_cycle)`` beats, or, if
    more, the VMEM bank reads of the tile (its rows and the MATMUL's one
    activation row, a read per bank a cycle) (docs/array.md, section 4); the
    results are bit-exact. On the 16x16 chip (fast MAC: the same cycles as
    the RTL array), where a tile's 9 or 16 cycles are above the 4 in which
    the LOOP issues a LOADW + MATMUL pair."""
    config = SHAPES["16x16"].replace(weight_rows_per_cycle=width)
    chip = Chip(config, fast_mac=True)

    def cycles(used):
        program, image, out, expected = loadw_bound_program(
            config, np.random.default_rng(SEED + width), 40, used)
        result = chip.run(program, image)
        assert result.ok, result.error
        out = result.memory[out:out + used * config.acc_row_bytes]
        golden.assert_bits_equal(out.view(np.float32).reshape(used, config.cols), expected,
                                 f"LOADW-bound program, {width} weight rows a cycle", seed=SEED)
        return result.counters["cycles"]

    bank_reads = -(-(config.rows + 1) // config.vmem_banks)
    per_tile = max(config.weight_load_cycles, bank_reads)
    extra = cycles(40) - cycles(8)
    assert extra == 32 * per_tile, (extra, config.weight_load_cycles, bank_reads)


def test_fpga_preset_chip():
    """The `fpga` preset as built for the ECP5 (all RTL, mac_stages 7 with the
    staggered weights of docs/array.md): bit-exact on special values and
    partial tiles, and near the physical limit on whole tiles (the fast array
    is held to the RTL one at this depth in tests/test_sim_array.py)."""
    chip = Chip(ChipConfig.preset("fpga"))
    rng = np.random.default_rng(SEED + 11)
    for M, K, N in [(13, 9, 7), (4, 16, 4)]:
        _check(chip, _specials(rng, (M, K)), _specials(rng, (K, N)))
    A = rng.standard_normal((64, 64)).astype(np.float32)
    B = rng.standard_normal((64, 64)).astype(np.float32)
    _check(chip, A, B)
    assert chip.last_stats.utilization > 0.85, chip.last_stats


@pytest.mark.slow
def test_a_threaded_model_gives_the_same_results_and_cycles():
    """``Chip(threads=2)``: Verilator evaluates the model on two threads, and
    the memory model's DPI calls may come from either (they carry their chip).
    Same bits and cycles as one thread, against a stalling memory too. Slow: a
    Verilator build of its own for a Verilator guarantee."""
    stalls = dict(mem_latency=(0, 24), mem_pause={ch: 40 for ch in ("aw", "w", "b", "ar", "r")},
                  seed=SEED)
    rng = np.random.default_rng(SEED + 11)
    A, B = _specials(rng, (19, 23)), _specials(rng, (23, 14))
    for timing in ({}, stalls):
        one, two = Chip(TINY, **timing), Chip(TINY, threads=2, **timing)
        C_one, C_two = _check(one, A, B), _check(two, A, B)
        golden.assert_bits_equal(C_two, C_one, "threads=2 vs threads=1", seed=SEED)
        assert two.last_stats.cycles == one.last_stats.cycles


def test_close_frees_the_simulator_and_later_use_is_a_clear_error():
    """`close()` (and the end of a `with` block) drops the native chip and its
    external memory at once; the chip and its tensors then raise ChipError,
    and closing again does nothing."""
    import gc
    import weakref

    from mxu.sim.driver.chip import ChipError
    with Chip(TINY, fast_mac=True) as chip:
        A = np.arange(12, dtype=np.float32).reshape(3, 4)
        kept = chip.upload(A)
        assert np.array_equal(chip.matmul(A, np.eye(4, dtype=np.float32)), A)
        native = weakref.ref(chip.device._native)
    assert chip.closed and native() is None      # freed when the block ended, no gc needed
    assert repr(chip) == "Chip(4x4, closed)"
    closed = "this chip has been closed"
    for use in (lambda: chip.matmul(A, A.T), lambda: chip.upload(A), lambda: chip.read_reg("ID"),
                lambda: chip.read_memory(0, 4), lambda: chip.counters()):
        with pytest.raises(ChipError, match=closed):
            use()
    with pytest.raises(ChipError, match=r"device tensor's chip is closed: " + closed):
        kept.numpy()
    chip.close()                                 # idempotent
    gc.collect()
