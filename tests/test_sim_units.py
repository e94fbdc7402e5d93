"""Argument checking of the unit-level simulation API: clear errors, no simulator run."""

import numpy as np
import pytest

from mxu.sim import simulate_fp32_to_bf16, simulate_mac


def test_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        simulate_mac(np.zeros(3, np.uint16), np.zeros(2, np.uint16), np.zeros(3, np.uint32))


@pytest.mark.parametrize("bad", ["a", "w", "acc"])
def test_wrong_dtype(bad):
    args = {"a": np.zeros(4, np.uint16), "w": np.zeros(4, np.uint16), "acc": np.zeros(4, np.uint32)}
    args[bad] = args[bad].astype(np.float32)
    with pytest.raises(TypeError, match=f"{bad} must have dtype"):
        simulate_mac(**args)


def test_not_an_array():
    with pytest.raises(TypeError, match="a must be a numpy array"):
        simulate_mac([1, 2], np.zeros(2, np.uint16), np.zeros(2, np.uint32))


def test_not_1d():
    with pytest.raises(ValueError, match="x must be 1-D"):
        simulate_fp32_to_bf16(np.zeros((2, 2), np.uint32))


def test_bad_stages_and_simulator():
    ok = np.zeros(1, np.uint16), np.zeros(1, np.uint16), np.zeros(1, np.uint32)
    with pytest.raises(ValueError, match="mac_stages must be 1 to 7"):
        simulate_mac(*ok, stages=8)
    with pytest.raises(ValueError, match="simulator must be one of"):
        simulate_mac(*ok, simulator="modelsim")


def test_empty_input():
    assert simulate_mac(np.zeros(0, np.uint16), np.zeros(0, np.uint16),
                        np.zeros(0, np.uint32)).dtype == np.uint32


def test_units_not_inlined_marks_only_the_core_units():
    from mxu.sim.backends.verilog import units_not_inlined
    text = ("module \\top.chip.core.load_dma (a, b);\n  input a;\nendmodule\n"
            "module \\top.chip.core.load_dma.gearbox (a);\nendmodule\n"
            "module \\top.chip (a);\nendmodule\n")
    marked = units_not_inlined(text)
    assert marked.count("/*verilator no_inline_module*/") == 1
    assert marked.startswith("module \\top.chip.core.load_dma (a, b);\n  /*verilator no_inline_module*/\n")
