"""The expander's golden model (`mxu.verif.quant`) against gguf's own
dequantization then bf16 RNE, and against the exact-rational oracle, on random
blocks of every format and on special fp16 scales."""

import gguf
import gguf.quants
import numpy as np
import pytest

from mxu.hdl.quant import QUANT_FORMATS, QUANT_INFO, QuantFormat, repack, split_blocks
from mxu.verif.exact import exact_expand
from mxu.verif.golden import assert_bits_equal, f32_bits, fp32_to_bf16
from mxu.verif.quant import SPECIAL_F16, codes_to_q, dequantize, expand_tiles, random_blocks, scalars

def _gguf_bf16(raw, fmt, n):
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw.reshape(n, -1), gguf.GGMLQuantizationType[fmt.name])
    return fp32_to_bf16(f32_bits(ref.astype(np.float32)))


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_golden_matches_gguf(fmt, seed):
    n = 64
    raw = random_blocks(fmt, n, seed)
    shape = (n, QUANT_INFO[fmt].block)
    assert_bits_equal(dequantize(raw, fmt, shape), _gguf_bf16(raw, fmt, n),
                      what=f"{fmt.name} golden vs gguf", seed=seed)


def test_negative_zero_survives():
    """d < 0 and q = 0: gguf's product is -0, and so is the expander's (t = -0)."""
    d = np.array([-1.5], np.float16).view(np.uint8)
    raw = np.concatenate([d, np.zeros(32, np.uint8)])           # Q8_0, every code 0
    out = dequantize(raw, "Q8_0", (1, 32))
    assert (out == 0x8000).all()
    raw = np.concatenate([d, np.full(16, 0x88, np.uint8)])      # Q4_0, nibble 8: q = 0
    assert (dequantize(raw, "Q4_0", (1, 32)) == 0x8000).all()


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda f: f.name)
def test_golden_matches_exact(fmt):
    info = QUANT_INFO[fmt]
    n = 3 * len(SPECIAL_F16) + 4
    raw = random_blocks(fmt, n, 7)
    heads, codes = split_blocks(raw, fmt)
    want = dequantize(raw, fmt, (n, info.block))
    rng = np.random.default_rng(3)
    q = codes_to_q(codes, fmt).astype(int)
    for b in range(n):
        for k in rng.choice(info.block, 6, replace=False):
            h = [int(x) for x in heads[b]]
            d = h[0] | h[1] << 8
            j = int(k) // info.sub_rows
            minimum, m_scale, neg, scale = None, 1, False, 1
            if fmt is QuantFormat.Q4_1:
                minimum = h[2] | h[3] << 8
            elif fmt is QuantFormat.Q4_K:
                fields = int.from_bytes(bytes(h[4:16]), "little")
                scale = (fields >> (6 * j)) & 0x3F
                minimum, m_scale, neg = h[2] | h[3] << 8, (fields >> (6 * (8 + j))) & 0x3F, True
            elif fmt is QuantFormat.Q6_K:
                scale = np.uint8(h[2 + j]).view(np.int8).item()
            got = exact_expand(d, scale, minimum, m_scale, int(q[b, k]), neg)
            assert got == want[b, k], (f"{fmt.name} block {b} k {k}: exact 0x{got:04x} "
                                       f"golden 0x{int(want[b, k]):04x}")


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda f: f.name)
def test_tiles_are_the_weights_transposed(fmt):
    """The expander's rows of a K x cols strip are W[k, n] = file row n, element k."""
    info = QUANT_INFO[fmt]
    n, k, cols = 22, 2 * info.block, 16
    raw = random_blocks(fmt, n * 2, 5)   # 44 blocks: every special d, m and dmin
    rows = expand_tiles(repack(raw, fmt, (n, k), cols), fmt, cols)
    weights = dequantize(raw, fmt, (n, k))
    groups = -(-n // cols)
    strips = rows.reshape(groups, k, cols)
    got = np.concatenate(list(strips), axis=1)[:, :n]
    assert_bits_equal(got, weights.T, what=f"{fmt.name} strips")


def test_scalars_q4k():
    """Q4_K: s = d * sc_j and t = -(dmin * m_j), per 32-row sub-block."""
    h = np.zeros((1, 16), np.uint8)
    h[0, :2] = np.array([2.0], np.float16).view(np.uint8)
    h[0, 2:4] = np.array([0.5], np.float16).view(np.uint8)
    fields = sum(v << (6 * i) for i, v in enumerate([1, 2, 3, 4, 5, 6, 7, 63] + [0, 1, 2, 3, 4, 5, 6, 7]))
    h[0, 4:16] = np.frombuffer(fields.to_bytes(12, "little"), np.uint8)
    s, t = scalars(h, "Q4_K")
    assert s.tolist() == [[2, 4, 6, 8, 10, 12, 14, 126]]
    assert t.view(np.uint32)[0, 0] == 0x80000000 and t[0, 7] == -3.5
