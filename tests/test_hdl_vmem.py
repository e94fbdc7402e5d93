"""VMEM and its banked row memory, on Amaranth's simulator against a Python model:
random traffic on every port checks read-first data, write priority, and that
a port is refused exactly when a higher-priority port uses the same bank; a
directed run checks the banking argument (the DMA gets at least one row every
two cycles while the array streams consecutive rows)."""

import pytest

from mxu.hdl.config import ChipConfig
from mxu.hdl.vmem import BankedRowMemory, Vmem
from mxu.verif.tb_vmem import check_banked


@pytest.mark.parametrize("banks", [1, 2, 4])
def test_banked_row_memory_random(banks):
    mem = BankedRowMemory(width=40, depth=24, banks=banks, read_ports=[True, False, False],
                          write_ports=[True, False])
    check_banked(mem, [(p, i == 0) for i, p in enumerate(mem.read)],
                 [(p, i == 0) for i, p in enumerate(mem.write)],
                 depth=24, banks=banks, width=40, cycles=1500, seed=banks)


@pytest.mark.parametrize("banks", [2, 4])
def test_vmem_random(banks):
    config = ChipConfig(rows=4, cols=3, vmem_bytes=512, vmem_banks=banks)
    vmem = Vmem(config)
    check_banked(vmem, [(vmem.array_read, True), (vmem.dma_read, False)],
                 [(vmem.dma_write, False)], depth=config.vmem_rows, banks=banks,
                 width=16 * config.vmem_row_elems, cycles=1500, seed=10 + banks)


@pytest.mark.parametrize("banks", [2, 4])
def test_vmem_random_with_every_lane(banks):
    """The chip's VMEM: two weight read lanes after the activations, before
    the DMA; a second DMA write lane after the first (docs/memory.md)."""
    config = ChipConfig(rows=4, cols=3, vmem_bytes=512, vmem_banks=banks, weight_rows_per_cycle=2)
    vmem = Vmem(config, weight_port=True)
    reads = [vmem.array_read, vmem.weight_read, vmem.weight_read1, vmem.dma_read]
    check_banked(vmem, [(p, i == 0) for i, p in enumerate(reads)],
                 [(vmem.dma_write, False), (vmem.dma_write1, False)], depth=config.vmem_rows,
                 banks=banks, width=16 * config.vmem_row_elems, cycles=1500, seed=20 + banks)


def test_vmem_sequential_streams_share_banks():
    """The banking argument: with the array reading consecutive rows every cycle
    and the DMA asking for consecutive rows every cycle, the DMA still gets a row
    at least every other cycle -- enough, since it needs one every
    vmem_row_bytes / axi_data_bytes >= 2 cycles."""
    config = ChipConfig(rows=4, cols=4, vmem_bytes=1024, vmem_banks=2)
    vmem = Vmem(config)
    cycles = 400
    stats = check_banked(vmem, [(vmem.array_read, True), (vmem.dma_read, False)], [],
                         depth=config.vmem_rows, banks=2, width=16 * config.vmem_row_elems,
                         cycles=cycles, seed=3, pattern="sequential")
    assert stats["dma_grants"] >= cycles // 2 - 1, stats


def test_vmem_shape():
    config = ChipConfig()
    vmem = Vmem(config)
    vmem._MustUse__silence = True
    assert config.vmem_rows == 32768 and config.vmem_row_bytes == 32
    assert vmem.array_read.req.payload.shape().width == 15
    assert vmem.dma_write.payload.data.shape().size == 16 * config.vmem_row_elems


@pytest.mark.parametrize("kwargs,message", [
    (dict(width=0, depth=4, banks=2, read_ports=[True], write_ports=[True]),
     "BankedRowMemory width must be a positive integer, not 0"),
    (dict(width=8, depth=4, banks=3, read_ports=[True], write_ports=[True]),
     "BankedRowMemory banks must be a power of two, not 3"),
    (dict(width=8, depth=1, banks=2, read_ports=[True], write_ports=[True]),
     r"BankedRowMemory depth must be an integer >= banks \(2\), not 1"),
    (dict(width=8, depth=4, banks=2, read_ports=[], write_ports=[True]),
     r"BankedRowMemory read_ports must be a non-empty list of booleans"),
    (dict(width=8, depth=4, banks=2, read_ports=[True], write_ports=[False, True]),
     r"BankedRowMemory write_ports must be a non-empty list of booleans .* only port 0 may be True"),
])
def test_banked_row_memory_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BankedRowMemory(**kwargs)
