"""The external-memory allocator: the chip's HBM, handed out in 64-byte aligned
blocks (docs/runtime.md).

First fit over a sorted free list, with neighbours coalesced on free. A `Block`
returns itself to the allocator when it is garbage-collected or `free`d, so
device tensors free their memory when they are dropped.
"""

import bisect
import weakref

__all__ = ["Allocator", "Block", "DeviceMemoryError", "ALIGN"]

ALIGN = 64


class DeviceMemoryError(MemoryError, ValueError):
    """Nothing fits in the chip's external memory (a ValueError too: the input
    is too large for the configured memory)."""


def _round_up(n, a=ALIGN):
    return -(-n // a) * a


class Block:
    """``nbytes`` (a multiple of 64) of external memory at ``addr``; freed when
    dropped."""

    def __init__(self, allocator, addr, nbytes, what):
        self._allocator = weakref.ref(allocator)
        self.addr, self.nbytes, self.what = addr, nbytes, what
        self.freed = False
        # A transient tensor's block: its data lives only inside the program
        # that writes it (`spent` once that program has run).
        self.transient = self.spent = False

    def free(self):
        if not self.freed:
            self.freed = True
            allocator = self._allocator()
            if allocator is not None:
                allocator._release(self.addr, self.nbytes)

    def __del__(self):
        self.free()

    def __repr__(self):
        state = "freed" if self.freed else f"{self.nbytes} bytes"
        return f"<Block {self.what} at 0x{self.addr:x}, {state}>"


class Allocator:
    """Allocates [base, base + size) of external memory."""

    def __init__(self, size, base=0):
        self.size, self.base = size, base
        self._free = [(base, size)]            # sorted (addr, length), coalesced

    @property
    def free_bytes(self):
        return sum(length for _, length in self._free)

    @property
    def largest_free(self):
        return max((length for _, length in self._free), default=0)

    def alloc(self, nbytes, what="a tensor", top=False):
        """A `Block` of at least `nbytes` (64-byte aligned): the lowest free
        place, or with `top` the highest (where programs go, away from the
        tensors). A `DeviceMemoryError` that says how much there is when
        nothing fits."""
        need = _round_up(max(1, nbytes))
        candidates = reversed(list(enumerate(self._free))) if top else enumerate(self._free)
        for i, (addr, length) in candidates:
            if length >= need:
                at = addr + length - need if top else addr
                if length == need:
                    del self._free[i]
                elif top:
                    self._free[i] = (addr, length - need)
                else:
                    self._free[i] = (addr + need, length - need)
                return Block(self, at, need, what)
        raise DeviceMemoryError(
            f"cannot allocate {nbytes:,} bytes for {what}: the chip's external memory has "
            f"{self.size:,} bytes, {self.free_bytes:,} free, the largest free block "
            f"{self.largest_free:,} bytes")

    def _release(self, addr, length):
        i = bisect.bisect_left(self._free, (addr, 0))
        self._free.insert(i, (addr, length))
        # Coalesce with the neighbours on both sides.
        if i + 1 < len(self._free) and addr + length == self._free[i + 1][0]:
            self._free[i] = (addr, length + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == addr:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]
