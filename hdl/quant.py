"""The chip's block-quantized weight formats (GGUF's own blocks) and their
on-chip layout (docs/numerics.md, "Quantized weights"; docs/memory.md,
"Quantized loads").

A weight W is used as (K = in, N = out); GGUF stores it as N rows of K with
blocks of `block` weights along K. At upload the host repacks the file's
bytes, without changing one bit of them, into *tile-blocks*: per group of
``cols`` output columns (N padded with zero blocks to a multiple of ``cols``)
and per block index along K, first the ``cols`` columns' headers
(`QuantInfo.header_bytes` each: the block's fp16 scales and sub-block scales,
in the fixed form given below), then the ``block x cols`` codes as one
LSB-first bitstream of `QuantInfo.bits` each, in (k, n) row-major order. The
tile-blocks of one column group follow each other along K, so a K x cols
strip is one contiguous byte range: one LOAD. The expander
(`mxu.hdl.expander`) turns that stream back into bf16 weight rows.

Header forms (bytes, little-endian):

* Q8_0, Q4_0, Q5_0: ``d`` (fp16).
* Q4_1: ``d``, ``m`` (fp16 each).
* Q4_K: ``d``, ``dmin``, then the 8 sub-block scales ``sc`` and the 8 mins
  ``m`` as sixteen 6-bit fields, LSB-first (12 bytes: the file's 12 scale
  bytes, reordered).
* Q6_K: ``d``, then the 16 int8 sub-block scales.

Codes: Q5_0's high bit joins its four low bits into one 5-bit code, Q6_K's
``ql``/``qh`` into one 6-bit code; Q8_0's code is the int8's byte.

This module is the host side (NumPy): the format table, `repack` and its
inverse `unpack`, and `split_blocks` (a file block array -> headers and codes),
shared by the golden model and the runtime. No gguf import: its type numbers
are written here once, and tests check them against ``gguf``.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.lib import enum

__all__ = ["QuantFormat", "QuantInfo", "QUANT_INFO", "QUANT_FORMATS", "quant_format",
           "tile_block_bytes", "split_blocks", "join_blocks", "repack", "unpack",
           "sections_fit_beats"]


class QuantFormat(enum.Enum, shape=4):
    """The format of a LOAD (instruction flag bits 14:11): ``NONE`` moves bytes
    as they are; the others are GGUF block types, numbered as
    ``gguf.GGMLQuantizationType`` numbers them."""
    NONE = 0
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q8_0 = 8
    Q4_K = 12
    Q6_K = 14


@dataclass(frozen=True)
class QuantInfo:
    """One format's sizes: weights per block, bits per code, header bytes per
    block in the chip's form, bytes per block in the file, rows per sub-block
    (the rows that share one scale), and the offset subtracted from a code
    (``None``: the code is an int8)."""
    block: int
    bits: int
    header_bytes: int
    file_bytes: int
    sub_rows: int
    offset: int | None

    @property
    def code_bytes(self):
        return self.block * self.bits // 8


QUANT_INFO = {
    QuantFormat.Q8_0: QuantInfo(32, 8, 2, 34, 32, None),
    QuantFormat.Q4_0: QuantInfo(32, 4, 2, 18, 32, 8),
    QuantFormat.Q4_1: QuantInfo(32, 4, 4, 20, 32, 0),
    QuantFormat.Q5_0: QuantInfo(32, 5, 2, 22, 32, 16),
    QuantFormat.Q4_K: QuantInfo(256, 4, 16, 144, 32, 0),
    QuantFormat.Q6_K: QuantInfo(256, 6, 18, 210, 16, 32),
}
for _f, _i in QUANT_INFO.items():     # the layout is lossless: the same bytes per block
    assert _i.header_bytes + _i.code_bytes == _i.file_bytes, _f

QUANT_FORMATS = tuple(QUANT_INFO)
"""Every block format the expander knows, in a fixed order."""


def quant_format(qtype):
    """A `QuantFormat` from one, from a ``gguf.GGMLQuantizationType`` or from
    a name such as ``"Q4_1"``; raises ValueError naming what the chip takes."""
    name = getattr(qtype, "name", qtype)
    if isinstance(name, str) and name in QuantFormat.__members__ and name != "NONE":
        return QuantFormat[name]
    known = ", ".join(f.name for f in QUANT_FORMATS)
    raise ValueError(f"quantization type {name!r} is not one the chip expands (it takes {known})")


def tile_block_bytes(fmt, cols):
    """Bytes of one tile-block: `cols` columns' headers and codes of one block."""
    info = QUANT_INFO[fmt]
    return cols * info.file_bytes


def sections_fit_beats(fmt, cols, bus_bytes):
    """Whether a tile-block's header section and code section are each whole
    bus beats: the expander takes headers and codes beat by beat."""
    info = QUANT_INFO[fmt]
    return (cols * info.header_bytes) % bus_bytes == 0 and (cols * info.code_bytes) % bus_bytes == 0


def _nibbles(qs):
    """Q4_0/Q4_1/Q5_0 low nibbles in element order: byte j holds elements j
    (low) and j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _pack_bits(values, bits):
    """(..., n) codes -> (..., n * bits / 8) bytes, LSB-first."""
    shifts = np.arange(bits, dtype=np.uint8)
    b = (values[..., None] >> shifts) & 1
    return np.packbits(b.reshape(*values.shape[:-1], -1).astype(np.uint8), axis=-1,
                       bitorder="little")


def _unpack_bits(data, bits, n):
    """Inverse of `_pack_bits`."""
    b = np.unpackbits(data, axis=-1, bitorder="little").reshape(*data.shape[:-1], n, bits)
    return (b.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(-1).astype(np.uint8)


def _k_scales(scales):
    """Q4_K's 12 scale bytes -> (sc, m), 8 six-bit values each (llama.cpp's
    get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    m = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc, m


def _k_scale_bytes(sc, m):
    """Inverse of `_k_scales`."""
    lo = (sc[:, :4] & 0x3F) | ((sc[:, 4:] & 0x30) << 2)
    mid = (m[:, :4] & 0x3F) | ((m[:, 4:] & 0x30) << 2)
    hi = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=-1).astype(np.uint8)


def split_blocks(blocks, fmt):
    """(n, file_bytes) uint8 blocks -> (headers (n, header_bytes) uint8 in the
    chip's form, codes (n, block) uint8 in element order)."""
    fmt, b = quant_format(fmt), np.asarray(blocks, np.uint8)
    info = QUANT_INFO[fmt]
    if fmt is QuantFormat.Q8_0:
        return b[:, :2], b[:, 2:]
    if fmt in (QuantFormat.Q4_0, QuantFormat.Q4_1):
        h = info.header_bytes
        return b[:, :h], _nibbles(b[:, h:])
    if fmt is QuantFormat.Q5_0:
        qh = b[:, 2:6].copy().view("<u4")
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        return b[:, :2], _nibbles(b[:, 6:]) | (high << 4)
    if fmt is QuantFormat.Q4_K:
        sc, m = _k_scales(b[:, 4:16])
        fields = _pack_bits(np.concatenate([sc, m], axis=-1), 6)
        qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        return np.concatenate([b[:, :4], fields], axis=-1), (qs & 0x0F).reshape(-1, 256)
    # Q6_K: ql (128), qh (64), scales (16), d (2).
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    codes = (ql & 0x0F).reshape(-1, 256) | ((qh & 0x03).reshape(-1, 256) << 4)
    return np.concatenate([b[:, 208:210], b[:, 192:208]], axis=-1), codes


def join_blocks(headers, codes, fmt):
    """Inverse of `split_blocks`: the file's block bytes."""
    fmt = quant_format(fmt)
    h, c = np.asarray(headers, np.uint8), np.asarray(codes, np.uint8)
    if fmt is QuantFormat.Q8_0:
        return np.concatenate([h, c], axis=-1)
    low = (c[:, :16] & 0x0F) | ((c[:, 16:32] & 0x0F) << 4) if c.shape[1] == 32 else None
    if fmt in (QuantFormat.Q4_0, QuantFormat.Q4_1):
        return np.concatenate([h, low], axis=-1)
    if fmt is QuantFormat.Q5_0:
        qh = (((c >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(-1)
        qh = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
        return np.concatenate([h, qh, low], axis=-1)
    if fmt is QuantFormat.Q4_K:
        fields = _unpack_bits(h[:, 4:16], 6, 16)
        nib = c.reshape(-1, 4, 2, 32)
        qs = (nib[:, :, 0] | (nib[:, :, 1] << 4)).reshape(-1, 128)
        return np.concatenate([h[:, :4], _k_scale_bytes(fields[:, :8], fields[:, 8:]), qs],
                              axis=-1)
    lo = (c & 0x0F).reshape(-1, 2, 2, 64)
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    hi = (c >> 4).reshape(-1, 2, 4, 32)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6))
    return np.concatenate([ql, qh.reshape(-1, 64), h[:, 2:18], h[:, :2]], axis=-1)


def _check_shape(raw, fmt, shape):
    """The block array of an (N, K) weight, as (N, K / block, file_bytes)."""
    info = QUANT_INFO[fmt]
    n, k = (int(s) for s in shape)
    if k % info.block:
        raise ValueError(f"row length {k} is not a whole number of {fmt.name} blocks of "
                         f"{info.block}")
    raw = np.frombuffer(bytes(raw), np.uint8) if not isinstance(raw, np.ndarray) else raw
    want = n * (k // info.block) * info.file_bytes
    if raw.size != want:
        raise ValueError(f"{fmt.name} block array of {raw.size} bytes for shape {(n, k)}: "
                         f"expected {want} ({n} x {k // info.block} blocks of "
                         f"{info.file_bytes} bytes)")
    return raw.reshape(n, k // info.block, info.file_bytes).astype(np.uint8, copy=False)


def repack(raw, fmt, shape, cols):
    """The chip's layout of a GGUF tensor: `raw` its block bytes, `shape` (N, K)
    as the file stores it (N rows of K). Returns uint8 bytes: column group by
    column group (N padded to a multiple of `cols` with zero blocks), each a
    K x cols strip of K / block tile-blocks."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    blocks = _check_shape(raw, fmt, shape)
    n, nb = blocks.shape[:2]
    groups = -(-n // cols)
    padded = np.zeros((groups * cols, nb, info.file_bytes), np.uint8)
    padded[:n] = blocks
    heads, codes = split_blocks(padded.reshape(-1, info.file_bytes), fmt)
    # (group, col, block, ...) -> (group, block, col, ...)
    heads = heads.reshape(groups, cols, nb, -1).transpose(0, 2, 1, 3)
    codes = codes.reshape(groups, cols, nb, info.block).transpose(0, 2, 3, 1)   # (g, b, k, n)
    bits = _pack_bits(codes.reshape(groups, nb, -1), info.bits)
    tiles = np.concatenate([heads.reshape(groups, nb, -1), bits], axis=-1)
    return np.ascontiguousarray(tiles).reshape(-1)


def tiles_of(chip, fmt, cols):
    """Chip-layout bytes of whole tile-blocks -> (headers (t, cols,
    header_bytes), codes (t, block, cols)), t tile-blocks in order."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    tiles = np.asarray(chip, np.uint8).reshape(-1, tile_block_bytes(fmt, cols))
    heads = tiles[:, :cols * info.header_bytes].reshape(-1, cols, info.header_bytes)
    codes = _unpack_bits(tiles[:, cols * info.header_bytes:], info.bits, info.block * cols)
    return heads, codes.reshape(-1, info.block, cols)


def unpack(chip, fmt, shape, cols):
    """Inverse of `repack`: the file's block bytes of an (N, K) tensor."""
    fmt = quant_format(fmt)
    info = QUANT_INFO[fmt]
    n, k = (int(s) for s in shape)
    nb, groups = k // info.block, -(-n // cols)
    heads, codes = tiles_of(chip, fmt, cols)
    heads = heads.reshape(groups, nb, cols, -1).transpose(0, 2, 1, 3).reshape(-1, info.header_bytes)
    codes = codes.reshape(groups, nb, info.block, cols).transpose(0, 3, 1, 2)
    blocks = join_blocks(heads, codes.reshape(-1, info.block), fmt)
    return blocks.reshape(groups * cols, nb * info.file_bytes)[:n].reshape(-1)
