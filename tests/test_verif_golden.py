"""The golden model against an independent exact-arithmetic oracle and against the
statements of docs/numerics.md."""

import ast
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mxu.verif import exact, golden, vectors

SEED = 20261122


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


def test_mul_matches_exact_oracle_on_special_pairs_and_random(rng):
    a, b = vectors.pairs(vectors.special_bf16(), vectors.special_bf16())
    a = np.concatenate([a, vectors.random_bf16(rng, 20000)])
    b = np.concatenate([b, vectors.random_bf16(rng, 20000)])
    golden.assert_bits_equal(golden.mul(a, b), exact.exact_mul_bf16(a, b), "mul",
                             {"a": a, "b": b}, SEED)


def test_add_matches_exact_oracle(rng):
    x, y = vectors.pairs(vectors.special_fp32(), vectors.special_fp32())
    dx, dy = vectors.directed_add()
    rx, ry = vectors.add_vectors(rng, 20000)
    x, y = np.concatenate([x, dx, rx]), np.concatenate([y, dy, ry])
    golden.assert_bits_equal(golden.add(x, y), exact.exact_add_f32(x, y), "add",
                             {"x": x, "y": y}, SEED)


def test_mac_matches_exact_oracle(rng):
    a, w, acc = vectors.mac_vectors(rng, 20000)
    golden.assert_bits_equal(golden.mac(a, w, acc), exact.exact_mac(a, w, acc), "mac",
                             {"a": a, "w": w, "acc": acc}, SEED)


def test_nan_is_canonical():
    nan_pairs = np.array([0x7F800000, 0xFF800000], np.uint32)
    assert golden.add(nan_pairs[:1], nan_pairs[1:])[0] == 0x7FC00000
    assert golden.mul(np.array([0x7F80], np.uint16), np.array([0x0000], np.uint16))[0] == 0x7FC00000


def test_fp32_to_bf16_is_round_to_nearest_even(rng):
    x = np.concatenate([vectors.special_fp32(), vectors.random_fp32(rng, 50000),
                        np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF], np.uint32)])
    got = golden.fp32_to_bf16(x)
    # Independent statement of RNE on the bit pattern (valid for every non-NaN).
    rne = ((x.astype(np.uint64) + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (x & 0x7F800000 == 0x7F800000) & (x & 0x7FFFFF != 0)
    np.testing.assert_array_equal(got[~nan], rne[~nan])
    np.testing.assert_array_equal(got[nan], (0x7FC0 | ((x[nan] >> 16) & 0x8000)).astype(np.uint16))


def test_matmul_is_the_sequential_dot_product_from_the_seed(rng):
    M, K, N = 3, 7, 4
    A = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    S = rng.standard_normal((M, N)).astype(np.float32)
    C = golden.matmul(A, B, seed=S, rows=4)
    for i in range(M):
        for j in range(N):
            ref = np.array([S[i, j]], np.float32).view(np.uint32)
            for k in range(K):
                ref = exact.exact_mac(A[i, k:k + 1].view(np.uint16),
                                      B[k:k + 1, j].copy().view(np.uint16), ref)
            assert C[i, j].view(np.uint32) == ref[0], (i, j)


def test_matmul_padding_turns_negative_zero_into_positive_zero():
    A = np.array([[-0.0]], np.float32)
    B = np.array([[1.0]], np.float32)
    seed = np.array([[-0.0]], np.float32)
    assert golden.matmul(A, B, seed=seed, rows=1).view(np.uint32)[0, 0] == 0x80000000
    assert golden.matmul(A, B, seed=seed, rows=2).view(np.uint32)[0, 0] == 0x00000000


def test_matmul_rejects_bad_shapes():
    with pytest.raises(ValueError, match="inner dimensions differ"):
        golden.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        golden.matmul(np.zeros(3, np.float32), np.zeros((3, 2), np.float32))


# The modules of verif/ that may import mxu.sim: they drive the chip or
# report on it; none of them is a golden model.
DRIVES_THE_CHIP = {
    "cli.py": "the `mxu verif` commands, which run the chip",
    "programs.py": "the testbenches' chip programs, built with mxu.sim's Program",
    "formal/prove.py": "prints its results with mxu.sim's report table",
}


def _sim_imports(path):
    """Lines of `path` that import mxu.sim (absolute, or relative from verif/)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level >= 2:       # from ..sim (mxu.verif's sibling), from ...sim
                base = "mxu." + base
            names = [base] + ([f"{base}.{a.name}" for a in node.names] if base == "mxu" else [])
        else:
            continue
        if any(n == "mxu.sim" or n.startswith("mxu.sim.") for n in names):
            found.append(node.lineno)
    return found


def test_golden_models_do_not_import_the_runtime():
    """The references stay independent: no module of verif/ imports mxu.sim
    except the listed ones, which drive the chip (the golden models take
    what they share with the runtime from mxu.hdl, e.g. `hdl/hostops.py`)."""
    root = Path(__file__).resolve().parents[1] / "verif"
    offenders = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        lines = _sim_imports(path)
        if lines and rel not in DRIVES_THE_CHIP:
            offenders[rel] = lines
    assert not offenders, f"verif/ modules importing mxu.sim (file: lines): {offenders}"
    for rel in DRIVES_THE_CHIP:
        assert _sim_imports(root / rel), f"verif/{rel} no longer imports mxu.sim: drop it from the list"
    assert _sim_imports(_Source("from mxu.sim.runtime import hostops\n")) == [1]
    assert _sim_imports(_Source("from ..sim import Chip\n")) == [1]
    assert _sim_imports(_Source("from mxu import sim\n")) == [1]
    assert _sim_imports(_Source("from mxu.hdl import hostops\n")) == []


class _Source:
    """A stand-in for a path holding `text` (the scan's own check)."""

    def __init__(self, text):
        self.text = text

    def read_text(self):
        return self.text

    def __str__(self):
        return "<planted>"
