"""The block formats and the chip's tile-block layout (`mxu.hdl.quant`):
the table matches gguf, the repacking is lossless, bad input is named."""

import gguf
import numpy as np
import pytest

from mxu.hdl import ChipConfig
from mxu.hdl.quant import (QUANT_FORMATS, QUANT_INFO, QuantFormat, join_blocks, quant_format,
                           repack, split_blocks, tile_block_bytes, unpack)


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda f: f.name)
def test_table_matches_gguf(fmt):
    qtype = gguf.GGMLQuantizationType[fmt.name]
    assert fmt.value == qtype.value
    block, file_bytes = gguf.GGML_QUANT_SIZES[qtype]
    info = QUANT_INFO[fmt]
    assert (info.block, info.file_bytes) == (block, file_bytes)
    assert info.header_bytes + info.block * info.bits // 8 == file_bytes   # lossless size


@pytest.mark.parametrize("fmt", QUANT_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("cols", [4, 16])
def test_repack_is_lossless(fmt, cols):
    info = QUANT_INFO[fmt]
    rng = np.random.default_rng(fmt.value * 100 + cols)
    n, k = 7, 3 * info.block
    raw = rng.integers(0, 256, n * (k // info.block) * info.file_bytes, dtype=np.uint8)
    heads, codes = split_blocks(raw.reshape(-1, info.file_bytes), fmt)
    assert codes.max() < 1 << info.bits
    assert np.array_equal(join_blocks(heads, codes, fmt).reshape(-1), raw)
    chip = repack(raw, fmt, (n, k), cols)
    groups = -(-n // cols)
    assert chip.size == groups * (k // info.block) * tile_block_bytes(fmt, cols)
    assert np.array_equal(unpack(chip, fmt, (n, k), cols), raw)


def test_tile_block_order():
    """Q8_0, cols 2: headers of both columns, then codes in (k, n) order."""
    n, k = 2, 32
    d = np.array([1.0, -2.0], np.float16).view(np.uint8).reshape(2, 2)
    q = np.arange(64, dtype=np.uint8).reshape(2, 32)
    raw = np.concatenate([d, q], axis=1).reshape(-1)
    chip = repack(raw, "Q8_0", (n, k), 2)
    assert np.array_equal(chip[:4], d.reshape(-1))
    assert np.array_equal(chip[4:], q.T.reshape(-1))


def test_names_and_errors():
    assert quant_format("Q4_1") is QuantFormat.Q4_1
    assert quant_format(gguf.GGMLQuantizationType.Q6_K) is QuantFormat.Q6_K
    with pytest.raises(ValueError, match="'IQ2_XXS' is not one the chip expands"):
        quant_format(gguf.GGMLQuantizationType.IQ2_XXS)
    with pytest.raises(ValueError, match="row length 40 is not a whole number of Q4_0 blocks"):
        repack(np.zeros(18, np.uint8), "Q4_0", (1, 40), 16)
    with pytest.raises(ValueError, match="block array of 17 bytes .* expected 18"):
        repack(np.zeros(17, np.uint8), "Q4_0", (1, 32), 16)


def test_config_formats():
    assert ChipConfig().quant_formats == tuple(f.name for f in QUANT_FORMATS)
    assert ChipConfig(rows=4, cols=4).quant_formats == ()        # headers of 8 bytes on a 16-byte bus
    assert ChipConfig(quant_formats=["Q6_K", "Q4_0"]).quant_formats == ("Q4_0", "Q6_K")
    assert ChipConfig.preset("default").quant_rows == 2
    with pytest.raises(ValueError, match=r"ChipConfig.quant_formats: Q4_0 needs cols \* 2 header "
                                         r"bytes \(8\) and cols \* 16 code bytes \(64\) to be "
                                         r"multiples of the bus's 16 bytes"):
        ChipConfig(rows=4, cols=4, quant_formats=("Q4_0",))
    with pytest.raises(ValueError, match="unknown format 'IQ2_XXS'"):
        ChipConfig(quant_formats=("IQ2_XXS",))
    with pytest.raises(ValueError, match="must be a tuple of format names"):
        ChipConfig(quant_formats="Q4_0")
