"""AXI4 and AXI4-Lite interface signatures (AMBA AXI, issue H), defined once.

Both signatures are seen from the **master**: ``Out`` members are driven by the
master (``awaddr``, ``wdata``, ``bready``...), ``In`` members by the slave
(``awready``, ``rdata``...). A slave component declares ``In(AXI4Signature(...))``.

Member names are the lower-case AXI signal names without the channel prefix
separator (``awaddr``, ``rresp``), so a component port ``axi`` becomes Verilog
ports ``axi__awaddr``, ``axi__rresp``..., which cocotbext-axi finds with
``AxiBus.from_prefix(dut, "axi_")`` and which Verilated C++ sees as
``axi___05Fawaddr`` (see ``sim/backends/csrc/axi_mem.h``).

Only the signals the mxu needs are present: no QOS, REGION or USER signals.
``*lock`` is the AXI4 one-bit lock (always 0 here), ``*cache`` and ``*prot`` are
carried for completeness.
"""

import enum

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AxiBurst", "AxiResp", "AXI4Signature", "AXI4LiteSignature", "segment_beats"]


class AxiBurst(enum.IntEnum):
    """``AxBURST`` encodings."""
    FIXED = 0
    INCR = 1
    WRAP = 2


class AxiResp(enum.IntEnum):
    """``xRESP`` encodings."""
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


_DATA_WIDTHS = (8, 16, 32, 64, 128, 256, 512, 1024)


def _check_addr(addr_width):
    if not isinstance(addr_width, int) or not 12 <= addr_width <= 64:
        raise ValueError(f"AXI address width must be an integer from 12 to 64, not {addr_width!r}")


class AXI4Signature(wiring.Signature):
    """An AXI4 (full) master port: AW, W, B, AR and R channels.

    Parameters
    ----------
    addr_width : int
        ``AxADDR`` width, 12..64 (12 so that the 4 KiB burst boundary exists).
    data_width : int
        ``xDATA`` width: 8..1024, a power of two. ``wstrb`` has ``data_width // 8`` bits.
    id_width : int
        ``xID`` width, 1..16.
    """

    def __init__(self, *, addr_width, data_width, id_width=1):
        _check_addr(addr_width)
        if data_width not in _DATA_WIDTHS:
            raise ValueError(f"AXI4 data width must be one of {_DATA_WIDTHS}, not {data_width!r}")
        if not isinstance(id_width, int) or not 1 <= id_width <= 16:
            raise ValueError(f"AXI4 ID width must be an integer from 1 to 16, not {id_width!r}")
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        members = {}
        for ch in ("aw", "ar"):
            members.update({
                f"{ch}id": Out(id_width), f"{ch}addr": Out(addr_width), f"{ch}len": Out(8),
                f"{ch}size": Out(3), f"{ch}burst": Out(2), f"{ch}lock": Out(1),
                f"{ch}cache": Out(4), f"{ch}prot": Out(3),
                f"{ch}valid": Out(1), f"{ch}ready": In(1),
            })
        members.update({
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })
        super().__init__(members)

    def __eq__(self, other):
        return (type(other) is AXI4Signature and self.addr_width == other.addr_width
                and self.data_width == other.data_width and self.id_width == other.id_width)

    def __repr__(self):
        return (f"AXI4Signature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")


class AXI4LiteSignature(wiring.Signature):
    """An AXI4-Lite master port (no IDs, no bursts, no LAST).

    Parameters
    ----------
    addr_width : int
        ``AxADDR`` width, 12..64.
    data_width : int
        32 or 64 (the only widths AXI4-Lite allows).
    """

    def __init__(self, *, addr_width, data_width=32):
        _check_addr(addr_width)
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_width!r}")
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (type(other) is AXI4LiteSignature and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __repr__(self):
        return f"AXI4LiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"


def segment_beats(start, length, lg):
    """Bus beats (of ``2**lg`` bytes) that ``length`` bytes from byte address
    ``start`` touch, counted from the beat that holds ``start``."""
    return (start[:lg] + length + (1 << lg) - 1) >> lg
