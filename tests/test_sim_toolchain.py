"""The simulation toolchain (`mxu.sim.backends.toolchain`): the fast-MAC
chip models are compiled by the `ziglang` package's clang, with flags that keep the
C++ models' fp32 arithmetic the golden model's (docs/simulation.md)."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mxu.hdl import ChipConfig
from mxu.sim.backends.toolchain import clang_command
from mxu.sim.driver.chip import _library


def _clang():
    command = clang_command()
    if command is None:
        pytest.skip("no clang from the ziglang package here (not x86-64, or not installed): "
                    "g++ builds the models")
    return command


def test_fast_chip_models_are_built_by_clang():
    _clang()
    library = Path(_library(ChipConfig.preset("default"), fast_mac=True)._name)
    assert b"clang version" in library.read_bytes(), f"{library} was not compiled by clang"


def test_clang_flags_keep_products_and_sums_apart(tmp_path):
    """``a * b + c`` must round the product, then the sum, as NumPy float32
    does: a fused multiply-add (contraction, or a -march that has FMA without
    -ffp-contract=off) would give other bits for these operands."""
    source = tmp_path / "madd.cpp"
    source.write_text('extern "C" float madd(float a, float b, float c) { return a * b + c; }\n')
    library = tmp_path / "libmadd.so"
    subprocess.run(f"{_clang()} -O2 -fPIC -shared -o {library} {source}", shell=True, check=True)
    madd = ctypes.CDLL(str(library)).madd
    madd.restype = ctypes.c_float
    madd.argtypes = [ctypes.c_float] * 3
    a = np.float32(1 + 2.0 ** -12)              # a * a = 1 + 2^-11 + 2^-24 exactly
    c = np.float32(-1)
    unfused = (a * a) + c                        # the tie rounds to even: 2^-11
    assert unfused != np.float64(a) * np.float64(a) + np.float64(c)    # the operands tell
    assert np.float32(madd(a, a, c)) == unfused
