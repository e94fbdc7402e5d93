"""The fp32 accumulator memory.

Address map (see ``docs/memory.md``): rows ``0 .. config.acc_rows - 1``, each
``config.cols`` fp32 (element ``j``, the partial sum of array column ``j``, is
bits ``[32j, 32j+32)``), row ``r`` in bank ``r % config.acc_banks``.

Two requestors read it (the array's seed port, the DMA for stores) and two write
it (the array's result port, the DMA for loads, e.g. a bias); with
``config.vpu`` the vector engine adds two read ports and a write port, last in
priority. The array's ports have the top priority and are ``always_ready``; the
others wait while a port before them uses the same bank. Reads are synchronous
(one cycle) and read-first.
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
    vector_read_a, vector_read_b : In(ReadPortSignature(addr, row)), with ``config.vpu``
    vector_write : In(WritePortSignature(addr, row)), with ``config.vpu``
        The vector engine's operand reads and result writes.
    """

    def __init__(self, config):
        self.config = config
        self.addr_shape = _addr_shape(config.acc_rows)
        row = acc_row_layout(config)
        members = {
            "array_read": In(ReadPortSignature(self.addr_shape, row, always_ready=True)),
            "array_write": In(WritePortSignature(self.addr_shape, row, always_ready=True)),
            "dma_read": In(ReadPortSignature(self.addr_shape, row)),
            "dma_write": In(WritePortSignature(self.addr_shape, row)),
        }
        if config.vpu:
            members["vector_read_a"] = In(ReadPortSignature(self.addr_shape, row))
            members["vector_read_b"] = In(ReadPortSignature(self.addr_shape, row))
            members["vector_write"] = In(WritePortSignature(self.addr_shape, row))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        reads = [self.array_read, self.dma_read]
        writes = [self.array_write, self.dma_write]
        if c.vpu:
            reads += [self.vector_read_a, self.vector_read_b]
            writes += [self.vector_write]
        m.submodules.mem = mem = BankedRowMemory(
            width=32 * c.cols, depth=c.acc_rows, banks=c.acc_banks,
            read_ports=[i == 0 for i in range(len(reads))],
            write_ports=[i == 0 for i in range(len(writes))])
        for outer, inner in zip(reads, mem.read):
            _connect_read(m, outer, inner)
        for outer, inner in zip(writes, mem.write):
            _connect_write(m, outer, inner)
        return m
