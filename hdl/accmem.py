"""The fp32 accumulator memory.

Address map (see ``docs/memory.md``): rows ``0 .. config.acc_rows - 1``, each
``config.cols`` fp32 (element ``j``, the partial sum of array column ``j``, is
bits ``[32j, 32j+32)``), row ``r`` in bank ``r % config.acc_banks``.

Two requestors read it (the array's seed port, the DMA for stores) and two write
it (the array's result port, the DMA for loads, e.g. a bias). The array's ports
have the top priority and are ``always_ready``; the DMA's wait while the array
uses the same bank. Reads are synchronous (one cycle) and read-first.
"""

from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from .numerics import FP32
from .vmem import BankedRowMemory, ReadPortSignature, WritePortSignature, _addr_shape, \
    _connect_read, _connect_write

__all__ = ["AccMem", "acc_row_layout"]


def acc_row_layout(config):
    """An accumulator row: ``config.cols`` fp32, column 0 in the low bits."""
    return data.ArrayLayout(FP32, config.cols)


class AccMem(wiring.Component):
    """Accumulator memory: ``config.acc_rows`` rows of ``config.cols`` fp32 in
    ``config.acc_banks`` simple-dual-port banks.

    Parameters
    ----------
    config : ChipConfig

    Interface
    ---------
    array_read : In(ReadPortSignature(addr, row, always_ready=True))
        Seeds the top of the array's columns; never refused.
    array_write : In(WritePortSignature(addr, row, always_ready=True))
        Takes the array's results from the bottom of the columns; never refused.
    dma_read : In(ReadPortSignature(addr, row))
        The DMA's read port for stores.
    dma_write : In(WritePortSignature(addr, row))
        The DMA's write port for loads (e.g. biases).
    """

    def __init__(self, config):
        self.config = config
        self.addr_shape = _addr_shape(config.acc_rows)
        row = acc_row_layout(config)
        super().__init__({
            "array_read": In(ReadPortSignature(self.addr_shape, row, always_ready=True)),
            "array_write": In(WritePortSignature(self.addr_shape, row, always_ready=True)),
            "dma_read": In(ReadPortSignature(self.addr_shape, row)),
            "dma_write": In(WritePortSignature(self.addr_shape, row)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.mem = mem = BankedRowMemory(width=32 * c.cols, depth=c.acc_rows,
                                                 banks=c.acc_banks, read_ports=[True, False],
                                                 write_ports=[True, False])
        _connect_read(m, self.array_read, mem.read[0])
        _connect_read(m, self.dma_read, mem.read[1])
        _connect_write(m, self.array_write, mem.write[0])
        _connect_write(m, self.dma_write, mem.write[1])
        return m
