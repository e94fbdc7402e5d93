"""The accumulator memory on Amaranth's simulator against a Python model: two
prioritised writers (array results first, then the DMA), two prioritised
readers (array seeds first, then the DMA), read-first data, refusal exactly on
a bank conflict with a higher-priority port."""

import pytest

from mxu.hdl.accmem import AccMem, acc_row_layout
from mxu.hdl.config import ChipConfig
from mxu.verif.tb_vmem import check_banked


@pytest.mark.parametrize("banks,cols", [(2, 3), (4, 1), (1, 2)])
def test_accmem_random(banks, cols):
    config = ChipConfig(rows=2, cols=cols, acc_bytes=4 * cols * 16, acc_banks=banks)
    acc = AccMem(config)
    check_banked(acc, [(acc.array_read, True), (acc.dma_read, False)],
                 [(acc.array_write, True), (acc.dma_write, False)], depth=config.acc_rows,
                 banks=banks, width=32 * cols, cycles=1500, seed=banks * 10 + cols)


def test_accmem_sequential_streams_share_banks():
    config = ChipConfig(rows=2, cols=2, acc_bytes=8 * 32, acc_banks=2)
    acc = AccMem(config)
    stats = check_banked(acc, [(acc.array_read, True), (acc.dma_read, False)], [],
                         depth=config.acc_rows, banks=2, width=64, cycles=300, seed=1,
                         pattern="sequential")
    assert stats["dma_grants"] >= 300 // 2 - 1, stats


def test_accmem_shape():
    config = ChipConfig()
    acc = AccMem(config)
    acc._MustUse__silence = True
    assert config.acc_rows == 8192 and acc.addr_shape.width == 13
    assert acc_row_layout(config).size == 32 * config.cols
    assert acc.array_write.payload.data.shape() == acc_row_layout(config)


def test_acc_banks_validation():
    with pytest.raises(ValueError, match=r"^ChipConfig.acc_bytes \(256\) holds fewer than two "
                                         r"rows per bank$"):
        ChipConfig(acc_bytes=256, acc_banks=4)
