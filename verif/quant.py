"""The golden model of the weight expander (docs/numerics.md, "Quantized
weights"): block-quantized weights -> bf16, in NumPy float32 in the
documented order.

Every format is one per-weight sequence

    x = bf16_rne(fp32_add(fp32_mul(s, q), t))

with per-(sub-)block fp32 scalars ``s`` and ``t`` and a small integer code
``q`` (`scalars`). It equals ``bf16_rne(gguf.quants.dequantize(...))`` bit for
bit (NaN as the canonical NaN); `tests/test_verif_quant.py` checks both that and
the exact-rational oracle `mxu.verif.exact.exact_expand`.
"""

import numpy as np

from mxu.hdl.quant import QUANT_INFO, QuantFormat, quant_format, split_blocks, tiles_of

from .golden import f32_bits, fp32_to_bf16

__all__ = ["SPECIAL_F16", "random_blocks", "codes_to_q", "scalars", "expand_fields", "expand_tiles", "dequantize"]

_NEG_ZERO = np.float32(-0.0)


def _f16(headers, byte):
    """The fp16 at `byte` of each header, as float32 (exact)."""
    return headers[..., byte:byte + 2].copy().view("<f2")[..., 0].astype(np.float32)


def _fields6(headers):
    """Q4_K's sixteen 6-bit fields (sc 0..7, m 0..7) of each header."""
    bits = np.unpackbits(headers[..., 4:16], axis=-1, bitorder="little")
    bits = bits.reshape(*headers.shape[:-1], 16, 6).astype(np.uint8)
    return (bits << np.arange(6, dtype=np.uint8)).sum(-1).astype(np.uint8)


def codes_to_q(codes, fmt):
    """Codes -> the integer q of each weight, as float32 (exact)."""
    info = QUANT_INFO[fmt]
    if info.offset is None:
        return codes.astype(np.uint8).view(np.int8).astype(np.float32)
    return codes.astype(np.float32) - np.float32(info.offset)


def scalars(headers, fmt):
    """(s, t) of each sub-block: float32 arrays of shape (..., block /
    sub_rows) from headers (..., header_bytes) in the chip's form.

    Q8_0/Q4_0/Q5_0: s = d, t = -0; Q4_1: s = d, t = m; Q4_K: s = d * sc_j,
    t = -(dmin * m_j); Q6_K: s = d * scale_j, t = -0. ``-0`` keeps ``s * q``
    as it is (x + -0 == x for every x, -0 included)."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    h = np.asarray(headers, np.uint8)
    subs = info.block // info.sub_rows
    d = _f16(h, 0)[..., None]
    with np.errstate(all="ignore"):
        if fmt is QuantFormat.Q4_K:
            f = _fields6(h).astype(np.float32)
            s = d * f[..., :8]
            t = -(_f16(h, 2)[..., None] * f[..., 8:])
        elif fmt is QuantFormat.Q6_K:
            s = d * h[..., 2:18].view(np.int8).astype(np.float32)
            t = np.full(s.shape, _NEG_ZERO)
        else:
            s = np.broadcast_to(d, (*d.shape[:-1], subs))
            m = _f16(h, 2)[..., None] if fmt is QuantFormat.Q4_1 else _NEG_ZERO
            t = np.broadcast_to(np.float32(m), s.shape)
    return s.astype(np.float32), t.astype(np.float32)


def expand_fields(s, t, q):
    """``bf16_rne(fp32(s * q) + t)`` -> uint16 bf16 bits (NaN canonical)."""
    with np.errstate(all="ignore"):
        p = np.float32(s) * np.float32(q)
        x = (p.astype(np.float32) + np.float32(t)).astype(np.float32)
    return fp32_to_bf16(f32_bits(x))


def expand_tiles(chip, fmt, cols):
    """The expander's output for chip-layout bytes of whole tile-blocks:
    (tile-blocks x block, cols) uint16 bf16 bits, the rows in stream order."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    heads, codes = tiles_of(chip, fmt, cols)          # (t, cols, H), (t, block, cols)
    s, t = scalars(heads, fmt)                         # (t, cols, subs)
    sub = np.arange(info.block) // info.sub_rows       # the sub-block of each row
    s_rows = s[:, :, sub].transpose(0, 2, 1)           # (t, block, cols)
    t_rows = t[:, :, sub].transpose(0, 2, 1)
    out = expand_fields(s_rows, t_rows, codes_to_q(codes, fmt))
    return out.reshape(-1, cols)


def dequantize(raw, fmt, shape):
    """An (N, K) GGUF tensor's weights as bf16 bits (N, K), from the file's
    blocks (what ``weights="bf16"`` puts on the chip)."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    n, k = shape
    heads, codes = split_blocks(np.asarray(raw, np.uint8).reshape(-1, info.file_bytes), fmt)
    s, t = scalars(heads, fmt)
    sub = np.arange(info.block) // info.sub_rows
    out = expand_fields(s[:, sub], t[:, sub], codes_to_q(codes, fmt))
    return out.reshape(n, k)


# fp16: +-0, smallest and largest subnormal, smallest normal, 1, max, +-inf, NaNs.
SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
               0x7C00, 0xFC00, 0x7E00, 0xFE01]

# Where the file's block keeps its fp16 d and, for Q4_1 / Q4_K, m / dmin.
D_AT = {QuantFormat.Q6_K: 208}
M_AT = {QuantFormat.Q4_1: 2, QuantFormat.Q4_K: 2}


def random_blocks(fmt, n, seed):
    """`n` random file blocks (n, file_bytes) of `fmt`; the first ones carry
    every special fp16 d (and m or dmin), as far as `n` reaches."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, info.file_bytes), dtype=np.uint8)
    sp = np.array(SPECIAL_F16, np.uint16).view(np.uint8).reshape(-1, 2)
    at = D_AT.get(fmt, 0)
    for i, pair in enumerate(sp):
        if i < n:
            raw[i, at:at + 2] = pair
        if fmt in M_AT and 2 * len(sp) + i < n:
            raw[len(sp) + i, M_AT[fmt]:M_AT[fmt] + 2] = pair
            raw[2 * len(sp) + i, at:at + 2] = sp[(i + 3) % len(sp)]
            raw[2 * len(sp) + i, M_AT[fmt]:M_AT[fmt] + 2] = pair
    if fmt is QuantFormat.Q6_K and n >= 3:      # int8 scales: 0, -128, 127
        raw[:3, 192] = [0, 128, 127]
    return raw
