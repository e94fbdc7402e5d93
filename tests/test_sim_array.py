"""The fast array (`mxu.sim.backends.fast_array`): the PE grid as one C++ model
must give the RTL array's results and cycles, to the bit and to the cycle,
under every stall pattern; the whole-chip tests compare them on programs."""

import numpy as np
import pytest

from mxu.sim.backends.array import native_array, pack_streams
from mxu.verif.array_model import array_reference

from test_hdl_array import check, random_streams

# Shapes whose RTL array `tests/test_hdl_array.py` builds anyway, and one deep
# pipeline; then the wide weight port (two rows a beat, the chip's default).
CASES = [(1, 1, 2, 1), (3, 5, 2, 1), (4, 4, 2, 1), (2, 3, 7, 1), (3, 5, 2, 2), (4, 4, 2, 2),
         (2, 3, 7, 2)]
# (act, seed, weight valid, result ready) percentages.
STALLS = [(100, 100, 100, 100), (50, 90, 100, 100), (100, 100, 30, 100), (100, 100, 100, 40),
          (70, 60, 50, 60)]


@pytest.mark.parametrize("rows, cols, stages, width", CASES,
                         ids=[f"{r}x{c}s{s}w{w}" for r, c, s, w in CASES])
def test_fast_array_matches_the_rtl_array(rows, cols, stages, width):
    seed = 500 + 10 * rows + cols + stages + 1000 * (width - 1)
    rng = np.random.default_rng(seed)
    rtl = native_array(rows, cols, stages, weight_rows=width)
    fast = native_array(rows, cols, stages, fast=True, weight_rows=width)
    sizes = [1, rows, 3 * rows + 1, 2, max(1, rows - 1), 2 * rows, 1]
    A, W, S = random_streams(rng, rows, cols, sizes, special_percent=10)
    streams = pack_streams(A, W, S, rows=rows, cols=cols)
    for percents in STALLS:
        options = dict(act_valid_percent=percents[0], seed_valid_percent=percents[1],
                       weight_valid_percent=percents[2], ready_percent=percents[3],
                       seed=seed + sum(percents))
        want, got = rtl.run(streams, **options), fast.run(streams, **options)
        check([r.view(np.float32) for r in streams.split(got.result)], A, W, S, rows, cols,
              f"fast array, stalls {percents}", seed)
        np.testing.assert_array_equal(got.result, want.result)
        timing = lambda run: (run.cycles, run.total_cycles, run.act_wait, run.weight_wait,
                              run.out_stall)
        assert timing(got) == timing(want), (percents, timing(got), timing(want))


@pytest.mark.parametrize("rows, cols", [(3, 5), (2, 8), (16, 16)])
def test_fast_array_special_values_and_cancellation(rows, cols):
    """NaN payloads, infinities, signed zeros and exact cancellation: the model
    makes NaNs canonical once, at the end, and must still equal the RTL. Eight
    and sixteen columns take the model's four-wide vector path, five the
    scalar one."""
    seed = 4711 + cols
    rng = np.random.default_rng(seed)
    for special, cancel in ((60, False), (0, True)):
        A, W, S = random_streams(rng, rows, cols, [rows, 1, 2 * rows], special_percent=special,
                                 cancel=cancel)
        streams = pack_streams(A, W, S, rows=rows, cols=cols)
        got = native_array(rows, cols, 2, fast=True).run(streams)
        want = array_reference(A, W, S, rows=rows, cols=cols)
        np.testing.assert_array_equal(got.result, np.concatenate(want).view(np.uint32))
