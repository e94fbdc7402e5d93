"""The transformer's layer operations in the vector unit's form (`mxu.verif.vpu`,
docs/vpu.md): each against the host operation it replaces and against float64,
and a whole encoder forward with them against the float32 reference."""

import math

import numpy as np
import pytest

from mxu.hdl import hostops
from mxu.sim.models.encoder import EncoderConfig, EncoderWeights
from mxu.verif import vpu
from mxu.verif.transformer import golden_forward, reference_forward

RNG = np.random.default_rng(5)


def test_softmax_matches_the_host_and_masks_exactly():
    x = (RNG.standard_normal((64, 100)) * 4).astype(np.float32)
    mask = RNG.random((1, 100)) > 0.3
    got = vpu.softmax(x, mask)
    assert np.abs(got - hostops.softmax(x, mask)).max() <= 2 ** -22
    assert np.all(got[:, ~mask[0]] == 0)
    assert np.abs(got.sum(axis=-1) - 1).max() <= 1e-6
    empty = vpu.softmax(np.zeros((2, 4), np.float32), np.zeros((1, 4), bool))
    assert np.all(empty == 0)


def test_layer_norm_matches_the_host():
    x = (RNG.standard_normal((32, 384)) * 3 + 1).astype(np.float32)
    gamma, beta = RNG.standard_normal((2, 384)).astype(np.float32)
    got = vpu.layer_norm(x, gamma, beta, 1e-12)
    want = hostops.layer_norm(x, gamma, beta, 1e-12)
    assert np.abs(got - want).max() <= 4 * np.abs(want).max() * 2 ** -24


def test_gelu_against_float64_erf():
    x = np.linspace(-12, 12, 240_001).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(vpu.gelu(x) - exact).max() <= 4e-7      # A&S 7.1.26 is within 1.5e-7
    special = vpu.gelu(np.float32([np.inf, -np.inf, np.nan, 0.0]))
    assert special[0] == np.inf and special[1] == 0 and np.isnan(special[2]) and special[3] == 0


def test_encoder_forward_in_vpu_form_is_accurate():
    config = EncoderConfig(hidden=32, heads=4, ffn=64, layers=2, eps=1e-12, vocab=50,
                           max_positions=32)
    weights = EncoderWeights.random(config, seed=3)
    lengths = [7, 16, 12]
    ids = np.zeros((3, 16), np.int64)
    mask = np.zeros((3, 16), bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = RNG.integers(1, config.vocab, n)
        mask[i, :n] = True
    chip_form = golden_forward(weights, ids, mask, rows=4, vector_ops="vpu")
    host_form = golden_forward(weights, ids, mask, rows=4)
    assert not np.array_equal(chip_form, host_form)       # the VPU form is its own sequence
    for i, n in enumerate(lengths):
        ref = reference_forward(weights, ids[i, :n])
        for got, host, want in zip(chip_form[i, :n], host_form[i, :n], ref):
            cos = lambda a, b: float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
            assert cos(got, host) >= 0.9999
            assert cos(got, want) >= 0.999                # as the host form's test asks


def test_unknown_vector_ops():
    config = EncoderConfig(hidden=8, heads=2, ffn=16, layers=1, eps=1e-12, vocab=10,
                           max_positions=8)
    weights = EncoderWeights.random(config, seed=0)
    with pytest.raises(ValueError, match="vector_ops must be one of"):
        golden_forward(weights, np.ones((1, 4), np.int64), np.ones((1, 4), bool), rows=4,
                       vector_ops="gpu")


@pytest.mark.parametrize("cols", [1, 3, 16])
def test_row_reductions_are_the_host_tree(cols):
    from mxu.hdl.vpu import VpuOp
    x = (RNG.standard_normal((50, cols)) * 100).astype(np.float32)
    n = len(x)
    total = vpu.vector_alu(np.full(n, VpuOp.RSUM.value), x.view(np.uint32), x.view(np.uint32))
    biggest = vpu.vector_alu(np.full(n, VpuOp.RMAX.value), x.view(np.uint32), x.view(np.uint32))
    np.testing.assert_array_equal(total.view(np.float32),
                                  np.broadcast_to(hostops.tree_sum(x), x.shape))
    np.testing.assert_array_equal(biggest.view(np.float32),
                                  np.broadcast_to(x.max(axis=1, keepdims=True), x.shape))


def test_every_layer_op_names_its_golden_function():
    """Each layer op the compiler knows (`LAYER_OPS`) states its contract as a
    function of the golden VPU form."""
    from mxu.sim.compiler.layerops import LAYER_OPS
    from mxu.verif import vpu
    for name, op in LAYER_OPS.items():
        assert callable(getattr(vpu, op.golden, None)), f"{name}: mxu.verif.vpu.{op.golden}"
        assert callable(getattr(hostops, op.golden, None)), f"{name}: hostops.{op.golden}"


def test_decoder_ops_in_vpu_form_against_float64():
    """RMSNorm, RoPE and SiLU(gate) * up in the VPU's primitives (the golden
    Llama form, docs/llm.md) against float64, and SiLU's special values."""
    from mxu.verif import vpu
    rng = np.random.default_rng(5)
    x = (3 * rng.standard_normal((64, 576))).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(576)).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-5) * g
    for lanes in (1, 16, 5):
        got = vpu.rms_norm(x, g, 1e-5, lanes)
        assert np.max(np.abs(got - want) / (np.abs(want) + 1e-3)) < 2e-6, lanes
    cos, sin = np.cos(x64[:, :64]).astype(np.float32), np.sin(x64[:, :64]).astype(np.float32)
    q = x[:, :64]
    swapped = np.empty_like(q)
    swapped[:, 0::2], swapped[:, 1::2] = -q[:, 1::2], q[:, 0::2]
    want = q.astype(np.float64) * cos + swapped.astype(np.float64) * sin
    assert np.max(np.abs(vpu.rope(q, cos, sin) - want)) < 1e-5 * np.max(np.abs(want))
    gate = np.concatenate([x[0], np.float32([0, -0.0, 88.5, -88.5, -200, 200])])
    up = np.ones_like(gate) * np.float32(1.5)
    g64 = gate.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * 1.5
    got = vpu.silu_mul(gate, up)
    assert np.all(np.abs(got - want) <= 4e-7 * np.maximum(1, np.abs(want)))
    special = vpu.silu_mul(np.float32([np.inf, -np.inf, np.nan]), np.float32([2, 2, 2]))
    assert special[0] == np.inf and special[1] == 0 and np.signbit(special[1])
    assert np.isnan(special[2])


def test_gelu_tanh_mul_in_vpu_form_against_float64_and_the_host_form():
    """GeGLU's tanh-GELU(gate) * up in the VPU's primitives against float64
    and its host form, and its special values."""
    from mxu.verif import vpu
    rng = np.random.default_rng(6)
    gate = np.concatenate([(4 * rng.standard_normal(4000)).astype(np.float32),
                           np.float32([0, -0.0, 10, -10, 30, -30, 88, -88, 1e20, -1e20])])
    up = np.float32(1.5) * np.ones_like(gate)
    g = gate.astype(np.float64)
    want = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * 1.5
    got = vpu.gelu_tanh_mul(gate, up)
    assert np.all(np.abs(got - want) <= 1e-6 * np.maximum(1, np.abs(want)))
    host = hostops.gelu_tanh_mul(gate, up)
    assert np.all(np.abs(host - want) <= 1e-6 * np.maximum(1, np.abs(want)))
    special = vpu.gelu_tanh_mul(np.float32([np.inf, -np.inf, np.nan]), np.float32([2, 2, 2]))
    assert special[0] == np.inf and special[1] == 0 and np.signbit(special[1])
    assert np.isnan(special[2])


def test_head_rms_norm_in_vpu_form_against_float64_and_the_host_form():
    """QK-norm (RMSNorm over each head) in the VPU's primitives against
    float64 per head, and against its host form."""
    from mxu.verif import vpu
    rng = np.random.default_rng(7)
    x = (3 * rng.standard_normal((8, 4 * 32))).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    h64 = x.astype(np.float64).reshape(8, 4, 32)
    want = (h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + 1e-6) * g).reshape(8, -1)
    for lanes in (1, 16, 5):
        got = vpu.head_rms_norm(x, g, 1e-6, lanes)
        assert np.max(np.abs(got - want) / (np.abs(want) + 1e-3)) < 2e-6, lanes
    host = hostops.head_rms_norm(x, g, 1e-6)
    assert np.max(np.abs(host - want) / (np.abs(want) + 1e-3)) < 2e-6


def test_neox_rope_and_post_norm_in_vpu_form_against_float64_and_the_host_form():
    """NEOX RoPE (halves of each head turn together), QK-norm + NEOX RoPE and
    the post-norm residual end in the VPU's primitives against float64 and
    against their host forms."""
    from mxu.verif import vpu
    rng = np.random.default_rng(8)
    n, d, heads = 6, 16, 3
    x = (3 * rng.standard_normal((n, heads * d))).astype(np.float32)
    cos, sin = hostops.rope_tables(d, 10000.0, np.arange(n) + 5, neox=True)
    h = x.astype(np.float64).reshape(n, heads, d)
    c64, s64 = cos.astype(np.float64)[:, None], sin.astype(np.float64)[:, None]
    rot = np.concatenate([-h[..., d // 2:], h[..., :d // 2]], axis=-1)
    want = (h * c64 + rot * s64).reshape(n, -1)
    for got in (vpu.rope_neox(x, cos, sin), hostops.rope_neox(x, cos, sin)):
        assert np.max(np.abs(got - want)) < 1e-5
    g = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    normed = vpu.head_rms_norm(x, g, 1e-6, 4)
    golden_bits = vpu.head_rms_norm_rope(x, g, 1e-6, cos, sin, 4)
    assert np.array_equal(golden_bits, vpu.rope_neox(normed, cos, sin))
    host = hostops.head_rms_norm_rope(x, g, 1e-6, cos, sin)
    assert np.max(np.abs(host - golden_bits)) < 1e-5
    res = rng.standard_normal((n, heads * d)).astype(np.float32)
    g2 = (1 + 0.1 * rng.standard_normal((2, heads * d))).astype(np.float32)
    c, norm = vpu.norm_add_rms_norm(x, res, g2[0], g2[1], 1e-6)
    x64 = x.astype(np.float64)
    rms = lambda v, w: v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-6) * w
    c64 = rms(x64, g2[0]) + res
    assert np.max(np.abs(c - c64)) < 1e-5 and np.max(np.abs(norm - rms(c64, g2[1]))) < 1e-5
    hc, hn = hostops.norm_add_rms_norm(x, res, g2[0], g2[1], 1e-6)
    assert np.max(np.abs(hc - c)) < 1e-5 and np.max(np.abs(hn - norm)) < 1e-5
