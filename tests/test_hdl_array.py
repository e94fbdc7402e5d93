"""The systolic array (issue #3): bit-exact results against the sequential fp32
dot product for every shape, tile size, special value and stall pattern, and the
cycle contract ``cycles == sum(M_t) + rows*stages + cols - 1`` on the real RTL.

Cost control (docs/testing.md): large random volumes go through the ctypes
Verilator harness (one cached build per shape, shared by every test of that
shape); cocotb checks the protocol, stalls and special values on a few small
shapes; the big shapes (8x8, 16x16) and the long runs are marked ``slow``.
"""

import json

import ml_dtypes
import numpy as np
import pytest

from mxu.hdl.array import (SystolicArray, array_latency, bubble_free_rows, default_weight_queue_depth,
                           weight_load_cycles)
from mxu.hdl.mac import MAC_STAGES
from mxu.hdl.pe import ProcessingElement
from mxu.sim.backends.array import pack_streams, run_amaranth, run_streams, simulate_array
from mxu.sim.backends.cocotb import cocotb_build, cocotb_test
from mxu.sim.backends.verilog import array_verilog
from mxu.sim.backends.toolchain import icarus_available
from mxu.verif import golden, vectors
from mxu.verif.array_model import array_reference

BF16 = ml_dtypes.bfloat16
FAST_SHAPES = [(1, 1), (1, 8), (8, 1), (3, 5), (4, 4)]
SLOW_SHAPES = [(8, 8), (16, 16)]
ALL_SHAPES = FAST_SHAPES + SLOW_SHAPES


def shape_params(shapes=ALL_SHAPES, slow=SLOW_SHAPES):
    return [pytest.param(r, c, id=f"{r}x{c}", marks=[pytest.mark.slow] if (r, c) in slow else [])
            for r, c in shapes]


def tile_sizes(rows):
    """M = 1, rows-1, rows, 3*rows (the issue's list; rows-1 dropped when 0)."""
    return [m for m in (1, rows - 1, rows, 3 * rows) if m >= 1]


def min_bubble_free_rows(rows, stages):
    """Smallest M for which back-to-back tiles have no bubble: what the
    documentation promises (docs/array.md), which the tests hold the RTL to."""
    return bubble_free_rows(rows, stages)


def random_streams(rng, rows, cols, sizes, special_percent=0, cancel=False):
    """Tiles of random bit patterns (biased to subnormals, ties, cancellation),
    optionally salted with special values or with seeds that cancel A @ W."""
    A, W, S = [], [], []
    for m in sizes:
        a = vectors.random_bf16(rng, m * rows).reshape(m, rows)
        w = vectors.random_bf16(rng, rows * cols).reshape(rows, cols)
        s = vectors.random_fp32(rng, m * cols).reshape(m, cols)
        if special_percent:
            for x, pool in ((a, vectors.special_bf16()), (w, vectors.special_bf16()),
                            (s, vectors.special_fp32())):
                vectors.salt(rng, x, pool, special_percent)
        if cancel:
            af = rng.standard_normal((m, rows)).astype(BF16)
            wf = rng.standard_normal((rows, cols)).astype(BF16)
            a, w = af.view(np.uint16), wf.view(np.uint16)
            s = (-(af.astype(np.float64) @ wf.astype(np.float64))).astype(np.float32).view(np.uint32)
        A.append(a.view(BF16))
        W.append(w.view(BF16))
        S.append(s.view(np.float32))
    return A, W, S


def check(C, A, W, S, rows, cols, what, seed):
    expected = array_reference(A, W, S, rows=rows, cols=cols)
    assert len(C) == len(expected)
    for t, (got, want) in enumerate(zip(C, expected)):
        golden.assert_bits_equal(got, want, f"{what} tile {t} (M={A[t].shape[0]})",
                                 inputs=None, seed=seed)


# ---------------------------------------------------------------------------
# Parameters, errors and the golden model (no simulator)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(rows=0, cols=1), "rows must be a positive integer, not 0"),
    (dict(rows=2, cols=-1), "cols must be a positive integer, not -1"),
    (dict(rows=True, cols=1), "rows must be a positive integer, not True"),
    (dict(rows=2.0, cols=1), "rows must be a positive integer, not 2.0"),
    (dict(rows=2, cols=2, mac_stages=8), "mac_stages must be one of (1, 2, 3, 4, 5, 6, 7), not 8"),
    (dict(rows=2, cols=2, weight_queue_depth=0),
     "weight_queue_depth must be a positive integer, not 0"),
    (dict(rows=2, cols=2, weight_rows=0), "weight_rows must be a positive integer, not 0"),
])
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        SystolicArray(**kwargs)
    assert str(info.value) == message


def test_pe_constructor_error():
    with pytest.raises(ValueError) as info:
        ProcessingElement(0)
    assert str(info.value) == "mac_stages must be one of (1, 2, 3, 4, 5, 6, 7), not 0"


def unelaborated(component):
    """A component built only to inspect it (silences Amaranth's unused warning)."""
    component._MustUse__silence = True
    return component


def test_interface_and_latency():
    array = unelaborated(SystolicArray(3, 5, 2))
    members = array.signature.members
    assert set(members) == {"act", "seed", "weight", "result", "weights_ready", "busy"}
    assert members["act"].signature.members["payload"].shape.size == 3 * 16 + 1
    assert members["seed"].signature.members["payload"].shape.size == 5 * 32
    assert members["weight"].signature.members["payload"].shape.size == 5 * 16
    assert members["result"].signature.members["payload"].shape.size == 5 * 32
    for rows, cols, stages in [(1, 1, 1), (3, 5, 2), (16, 16, 2), (8, 4, 3)]:
        assert array_latency(rows, cols, stages) == rows * stages + cols - 1
        assert unelaborated(SystolicArray(rows, cols, stages)).latency == rows * stages + cols - 1
    assert default_weight_queue_depth(16, 2) == 16
    assert default_weight_queue_depth(16, 1) == 2
    assert default_weight_queue_depth(1, 3) == 2
    # A wide port: beats of two rows, a tile's beats in the queue.
    wide = unelaborated(SystolicArray(3, 5, 2, weight_rows=2))
    assert wide.signature.members["weight"].signature.members["payload"].shape.size == 2 * 5 * 16
    assert default_weight_queue_depth(16, 2, 2) == 8 and default_weight_queue_depth(16, 1, 2) == 8
    assert bubble_free_rows(16, 2, 2) == 8 and bubble_free_rows(3, 7, 2) == 2


def _ok(rows=2, cols=3, m=2):
    return ([np.zeros((m, rows), BF16)], [np.zeros((rows, cols), BF16)],
            [np.zeros((m, cols), np.float32)])


@pytest.mark.parametrize("change, error, message", [
    (lambda A, W, S: (A[0], W, S), TypeError,
     "A must be a list of arrays, one per weight tile, not ndarray"),
    (lambda A, W, S: ([], [], []), ValueError, "A and W must hold at least one weight tile"),
    (lambda A, W, S: (A * 2, W, S), ValueError, "A has 2 tiles but W has 1"),
    (lambda A, W, S: (A, W, S * 2), ValueError, "A has 1 tiles but seeds has 2"),
    (lambda A, W, S: ([np.zeros((2, 3), BF16)], W, S), ValueError,
     "A[0] must have shape (M, 2) with M >= 1, not (2, 3)"),
    (lambda A, W, S: ([np.zeros((0, 2), BF16)], W, S), ValueError,
     "A[0] must have shape (M, 2) with M >= 1, not (0, 2)"),
    (lambda A, W, S: (A, [np.zeros((3, 2), BF16)], S), ValueError,
     "W[0] must have shape (2, 3), not (3, 2)"),
    (lambda A, W, S: (A, W, [np.zeros((2, 3), np.float64)]), TypeError,
     "seeds[0] must be a float32 array, not float64"),
    (lambda A, W, S: (A, W, [np.zeros((1, 3), np.float32)]), ValueError,
     "seeds[0] must have shape (2, 3), not (1, 3)"),
    (lambda A, W, S: ([np.zeros((2, 2), np.int32)], W, S), TypeError,
     "A[0] must be an ml_dtypes.bfloat16 or float32 array, not int32"),
    (lambda A, W, S: ([np.full((2, 2), 1.1, np.float32)], W, S), ValueError,
     "A[0] holds float32 values that are not bf16 values (first at index (0, 0): "
     "np.float32(1.1)); round them with ml_dtypes.bfloat16 first"),
])
def test_simulate_array_errors(change, error, message):
    A, W, S = change(*_ok())
    with pytest.raises(error) as info:
        simulate_array(A, W, S, rows=2, cols=3, simulator="amaranth")
    assert str(info.value) == message


def test_simulate_array_bad_simulator():
    with pytest.raises(ValueError) as info:
        simulate_array(*_ok(), rows=2, cols=3, simulator="modelsim")
    assert str(info.value) == "simulator must be one of ('verilator', 'icarus', 'amaranth'), not 'modelsim'"


def test_model_is_the_sequential_dot_product():
    """array_reference (built on golden.matmul) equals golden.dot per output:
    the seed first, then k = 0..rows-1 in order."""
    rng = np.random.default_rng(7)
    rows, cols = 5, 3
    A, W, S = random_streams(rng, rows, cols, [4, 1], special_percent=10)
    C = array_reference(A, W, S, rows=rows, cols=cols)
    for a, w, s, c in zip(A, W, S, C):
        for i in range(a.shape[0]):
            for j in range(cols):
                want = golden.f32_bits(np.float32(golden.dot(a[i], w[:, j], s[i, j])))
                assert c[i, j].view(np.uint32) == want, (i, j)


# ---------------------------------------------------------------------------
# Amaranth's simulator: every mac_stages, no build cost
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("stages", MAC_STAGES)
def test_amaranth_tiles_and_contract(stages):
    rows, cols, seed = 2, 3, 100 + stages
    rng = np.random.default_rng(seed)
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows) + [1], special_percent=15)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages, simulator="amaranth")
    check(C, A, W, S, rows, cols, f"amaranth s{stages}", seed)
    m = min_bubble_free_rows(rows, stages)
    sizes = [m, m + 1, 3 * m]
    A, W, _ = random_streams(rng, rows, cols, sizes)
    C, cycles = simulate_array(A, W, rows=rows, cols=cols, stages=stages, simulator="amaranth")
    check(C, A, W, None, rows, cols, f"amaranth contract s{stages}", seed)
    assert cycles == sum(sizes) + rows * stages + cols - 1


@pytest.mark.parametrize("stages", [2, 3, 7])
def test_amaranth_bubble_bound_is_tight(stages):
    """Tiles of `rows` activation rows stream back to back at every depth (the
    staggered weights of mac_stages >= 3 included); one row less costs a bubble."""
    rows, cols = 4, 2
    rng = np.random.default_rng(5 + stages)
    sizes = [rows] * 4
    A, W, _ = random_streams(rng, rows, cols, sizes)
    C, cycles = simulate_array(A, W, rows=rows, cols=cols, stages=stages, simulator="amaranth")
    check(C, A, W, None, rows, cols, "at the bound", 5)
    assert cycles == sum(sizes) + array_latency(rows, cols, stages)
    A, W, _ = random_streams(rng, rows, cols, [rows - 1] * 4)
    C, cycles = simulate_array(A, W, rows=rows, cols=cols, stages=stages, simulator="amaranth")
    check(C, A, W, None, rows, cols, "below the bound", 5)
    assert cycles > 4 * (rows - 1) + array_latency(rows, cols, stages)


@pytest.mark.parametrize("rows, stages", [(4, 1), (3, 2), (4, 2), (4, 3), (3, 7)])
def test_amaranth_wide_weight_port(rows, stages):
    """Two weight rows a beat: every tile size bit-exact (the last beat of an odd
    tile half padding); tiles of ceil(rows / 2) rows stream back to back and
    one row less costs a bubble; and M = 1 tiles follow each other every
    ``ceil(rows / 2)`` cycles, the tile's weight beats."""
    cols, width, seed = 2, 2, 40 + 10 * rows + stages
    rng = np.random.default_rng(seed)
    latency = array_latency(rows, cols, stages)

    def run(sizes, special=0):
        A, W, S = random_streams(rng, rows, cols, sizes, special_percent=special)
        streams = pack_streams(A, W, S, rows=rows, cols=cols)
        result = run_amaranth(streams, stages, weight_rows=width)
        check([r.view(np.float32) for r in streams.split(result.result)], A, W, S, rows, cols,
              f"weight_rows={width}, M={sizes}", seed)
        return result.cycles

    run(tile_sizes(rows) + [1, 2], special=15)
    m = bubble_free_rows(rows, stages, width)
    assert m == weight_load_cycles(rows, width) < rows
    assert run([m] * 4) == 4 * m + latency
    if m > 1:
        assert run([m - 1] * 4) > 4 * (m - 1) + latency
    tiles = 5
    assert run([1] * tiles) == (tiles - 1) * weight_load_cycles(rows, width) + 1 + latency


@pytest.mark.parametrize("depth, stages", [(1, 2), (2, 2), (1, 5), (2, 5)])
def test_amaranth_small_weight_queue(depth, stages):
    """A weight queue smaller than the default stays correct (it only adds bubbles)."""
    rows, cols, seed = 4, 2, 9 + depth
    rng = np.random.default_rng(seed)
    A, W, S = random_streams(rng, rows, cols, [1, 4, 3, 9, 4])
    streams = pack_streams(A, W, S, rows=rows, cols=cols)
    run = run_amaranth(streams, stages, weight_queue_depth=depth)
    check([r.view(np.float32) for r in streams.split(run.result)], A, W, S, rows, cols,
          f"queue depth {depth}", seed)


# ---------------------------------------------------------------------------
# Verilator fast path (ctypes harness): every shape, big random volumes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols", shape_params())
def test_verilator_shapes(rows, cols):
    """One build per shape runs: tiles of M = 1, rows-1, rows, 3*rows with random
    values; special values; cancellation; random stalls on every stream; and the
    cycle contract at full rate."""
    stages = 2
    seed = 1000 * rows + cols
    rng = np.random.default_rng(seed)

    # Random values, several tile sequences, full rate.
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows) * 3)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages)
    check(C, A, W, S, rows, cols, "random", seed)

    # Special values and cancellation.
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows) * 2, special_percent=30)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages)
    check(C, A, W, S, rows, cols, "special", seed)
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows), cancel=True)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages)
    check(C, A, W, S, rows, cols, "cancellation", seed)

    # Random stalls: gaps on each input stream, back-pressure on the output.
    for percents in [(50, 90, 100, 100), (100, 100, 30, 100), (100, 100, 100, 40), (70, 60, 50, 60)]:
        A, W, S = random_streams(rng, rows, cols, tile_sizes(rows) * 2, special_percent=5)
        streams = pack_streams(A, W, S, rows=rows, cols=cols)
        run = run_streams(streams, stages=stages, act_valid_percent=percents[0],
                          seed_valid_percent=percents[1], weight_valid_percent=percents[2],
                          ready_percent=percents[3], seed=seed + sum(percents))
        check([r.view(np.float32) for r in streams.split(run.result)], A, W, S, rows, cols,
              f"stalls {percents}", seed)

    # Cycle contract: T tiles of M >= rows, full rate, weights streamed ahead.
    for sizes in ([rows] * 4, [rows, 3 * rows, rows + 1, 2 * rows]):
        A, W, S = random_streams(rng, rows, cols, sizes)
        streams = pack_streams(A, W, S, rows=rows, cols=cols)
        run = run_streams(streams, stages=stages)
        check([r.view(np.float32) for r in streams.split(run.result)], A, W, S, rows, cols,
              "contract", seed)
        assert run.cycles == sum(sizes) + rows * stages + cols - 1, (sizes, run.cycles)
        # The harness offers every stream from the first cycle after reset, so
        # the activations wait exactly until the first tile's weights are staged
        # (the cycles before the measured window), and never after: no bubble.
        assert run.act_wait == run.total_cycles - run.cycles


@pytest.mark.parametrize("stages", [1, 3, 4, 7])
@pytest.mark.parametrize("rows, cols", shape_params([(3, 5), (8, 8)], slow=[(3, 5), (8, 8)]))
def test_verilator_other_stages(rows, cols, stages):
    seed = 77 + stages
    rng = np.random.default_rng(seed)
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows) * 2, special_percent=10)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages)
    check(C, A, W, S, rows, cols, f"s{stages}", seed)
    m = min_bubble_free_rows(rows, stages)
    sizes = [m, 2 * m, m + 1]
    A, W, S = random_streams(rng, rows, cols, sizes)
    C, cycles = simulate_array(A, W, S, rows=rows, cols=cols, stages=stages)
    check(C, A, W, S, rows, cols, f"contract s{stages}", seed)
    assert cycles == sum(sizes) + rows * stages + cols - 1


@pytest.mark.slow
@pytest.mark.parametrize("rows, cols", [(4, 4), (8, 8)])
def test_verilator_long_random(rows, cols):
    """A long run: 40 tiles of random sizes with random stalls."""
    seed = 4242 + rows
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(1, 4 * rows, 40))
    A, W, S = random_streams(rng, rows, cols, sizes, special_percent=3)
    streams = pack_streams(A, W, S, rows=rows, cols=cols)
    run = run_streams(streams, stages=2, act_valid_percent=80, seed_valid_percent=85,
                      weight_valid_percent=70, ready_percent=75, seed=seed)
    check([r.view(np.float32) for r in streams.split(run.result)], A, W, S, rows, cols,
          "long", seed)


# ---------------------------------------------------------------------------
# Icarus through simulate_array
# ---------------------------------------------------------------------------

def require_icarus():
    if not icarus_available():
        print("skipping: Icarus Verilog (iverilog) not installed")
        pytest.skip("Icarus Verilog (iverilog) not installed")


@pytest.mark.parametrize("rows, cols", shape_params([(3, 5), (1, 1), (4, 4)], slow=[(4, 4)]))
def test_icarus_simulate_array(rows, cols):
    require_icarus()
    seed = 31 * rows + cols
    rng = np.random.default_rng(seed)
    A, W, S = random_streams(rng, rows, cols, tile_sizes(rows), special_percent=10)
    C, _ = simulate_array(A, W, S, rows=rows, cols=cols, simulator="icarus")
    check(C, A, W, S, rows, cols, "icarus", seed)
    sizes = [rows, 2 * rows, rows]
    A, W, _ = random_streams(rng, rows, cols, sizes)
    C, cycles = simulate_array(A, W, rows=rows, cols=cols, simulator="icarus")
    check(C, A, W, None, rows, cols, "icarus contract", seed)
    assert cycles == sum(sizes) + array_latency(rows, cols, 2)


# ---------------------------------------------------------------------------
# cocotb: protocol, stalls, special values, cycle contract
# ---------------------------------------------------------------------------

COCOTB_CASES = [
    pytest.param("verilator", 3, 5, 2, id="verilator-3x5"),
    pytest.param("icarus", 3, 5, 2, id="icarus-3x5"),
    pytest.param("icarus", 1, 1, 2, id="icarus-1x1"),
    pytest.param("verilator", 1, 1, 2, id="verilator-1x1", marks=pytest.mark.slow),
    pytest.param("verilator", 1, 8, 2, id="verilator-1x8", marks=pytest.mark.slow),
    pytest.param("verilator", 8, 1, 2, id="verilator-8x1", marks=pytest.mark.slow),
    pytest.param("verilator", 4, 4, 2, id="verilator-4x4", marks=pytest.mark.slow),
    pytest.param("verilator", 4, 4, 1, id="verilator-4x4-s1", marks=pytest.mark.slow),
    pytest.param("verilator", 4, 4, 3, id="verilator-4x4-s3", marks=pytest.mark.slow),
    pytest.param("verilator", 8, 8, 2, id="verilator-8x8", marks=pytest.mark.slow),
    pytest.param("verilator", 16, 16, 2, id="verilator-16x16", marks=pytest.mark.slow),
    pytest.param("icarus", 4, 4, 2, id="icarus-4x4", marks=pytest.mark.slow),
    pytest.param("icarus", 8, 1, 3, id="icarus-8x1-s3", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("simulator, rows, cols, stages", COCOTB_CASES)
def test_cocotb(simulator, rows, cols, stages, tmp_path):
    if simulator == "icarus":
        require_icarus()
    build = cocotb_build(array_verilog(rows, cols, stages), "top", simulator,
                         name=f"array{rows}x{cols}s{stages}")
    args = dict(rows=rows, cols=cols, stages=stages, seed=rows * 100 + cols * 10 + stages)
    cocotb_test(build, "top", "mxu.verif.tb_array", simulator, test_dir=tmp_path,
                extra_env={"MXU_TB_ARGS": json.dumps(args)})


def test_synth_wrapper_keeps_io_small():
    """The synthesis wrapper elaborates and has a fixed, small pin count."""
    from mxu.sim.backends.verilog import to_verilog
    from mxu.synth.array import ArraySynthWrapper
    text = to_verilog(ArraySynthWrapper(2, 3, 2))
    header = text[text.index("module top("):text.index(");", text.index("module top("))]
    assert header.count(",") + 1 == 12   # 10 port groups (48 pins) + clk + rst
