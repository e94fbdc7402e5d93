"""`DeviceTensor`: an array that lives in the chip's external memory
(docs/runtime.md).

A tensor is 1-D or 2-D, bf16 or float32, and has a row stride in bytes, so a
slice of rows or columns (``t[:, 64:96]``) is a view: same memory, another
address, shape and stride, nothing copied. The memory block is freed when the
last tensor or view on it is dropped, or at once with `free()` (after which
every view on it raises).
"""

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..compiler.operands import Operand
from ..driver.chip import CLOSED_NOTE, ChipError

__all__ = ["DeviceTensor", "DTYPES"]

DTYPES = {np.dtype(bfloat16): "bf16", np.dtype(np.float32): "fp32"}


class DeviceTensor:
    """A 1-D or 2-D bf16/float32 array in a chip's external memory.

    Attributes: ``chip`` (the `mxu.sim.Chip` it lives on), ``shape``, ``dtype``
    (``ml_dtypes.bfloat16`` or ``np.float32``), ``addr`` (byte address of
    element [0, 0]), ``stride`` (bytes from one row to the next).
    """

    def __init__(self, chip, block, addr, shape, dtype, stride):
        self.chip, self._block = chip, block
        self.addr, self.shape, self.dtype, self.stride = addr, tuple(shape), np.dtype(dtype), stride
        self._pending = None     # the recording whose output this is, until it has run

    # ---- NumPy-like properties ----------------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def rows(self):
        return self.shape[0] if self.ndim == 2 else 1

    @property
    def cols(self):
        return self.shape[-1]

    @property
    def size(self):
        return int(np.prod(self.shape))

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.itemsize

    @property
    def freed(self):
        return self._block.freed

    def __repr__(self):
        state = "freed" if self.freed else f"at 0x{self.addr:x}, row stride {self.stride}"
        return f"DeviceTensor(shape={self.shape}, dtype={self.dtype.name}, {state})"

    def __len__(self):
        return self.shape[0]

    @property
    def transient(self):
        """Whether the tensor lives only inside the program that writes it
        (``chip.empty(..., transient=True)``)."""
        return self._block.transient

    def _alive(self, rerun=False):
        """Raise unless usable; `rerun`: checking a recording that runs again,
        whose transient tensors it writes itself."""
        if self.chip.closed:
            raise ChipError(f"this {self.shape} device tensor's chip is closed: {CLOSED_NOTE}")
        if self.freed:
            raise ValueError(f"this {self.shape} device tensor was freed")
        if self._block.spent and not rerun:
            raise ValueError(f"this {self.shape} device tensor is transient: it lived on the chip "
                             f"only inside the program that wrote it, which has run")

    # ---- data ---------------------------------------------------------------------------
    def numpy(self):
        """A copy of the data as an ndarray of this shape and dtype."""
        self._alive()
        if self._pending is not None:
            raise ValueError("this tensor is the output of a recording that has not run yet: "
                             "read it after the `with chip.record():` block")
        memory = self.chip.memory
        row_bytes = self.cols * self.itemsize
        rows = np.lib.stride_tricks.as_strided(memory[self.addr:], shape=(self.rows, row_bytes),
                                               strides=(self.stride, 1))
        # Always a copy: a dense tensor's rows are already contiguous, and a view
        # would change with the chip's memory.
        return rows.copy().view(self.dtype).reshape(self.shape)

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        return data if dtype is None else data.astype(dtype)

    def free(self):
        """Give the memory back now; this tensor and every view on it become unusable."""
        self._block.free()

    # ---- views ----------------------------------------------------------------------------
    def __getitem__(self, key):
        """Basic slicing with step 1 (``t[2:5]``, ``t[:, 64:96]``, ``t[3]``): a view."""
        self._alive()
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > self.ndim:
            raise IndexError(f"too many indices for a {self.ndim}-D device tensor")
        key = key + (slice(None),) * (self.ndim - len(key))
        spans, keep = [], []
        for axis, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, (int, np.integer)):
                i = int(k) + n if k < 0 else int(k)
                if not 0 <= i < n:
                    raise IndexError(f"index {k} is out of range for axis {axis} of size {n}")
                spans.append((i, i + 1))
                keep.append(False)
            elif isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step != 1:
                    raise IndexError("device tensors slice with step 1 only (a view is a "
                                     "strided block of rows)")
                if stop <= start:
                    raise IndexError(f"the slice {k} of axis {axis} is empty")
                spans.append((start, stop))
                keep.append(True)
            else:
                raise IndexError(f"device tensors take ints and slices, not {type(k).__name__}")
        if self.ndim == 1:
            (c0, c1), = spans
            addr = self.addr + c0 * self.itemsize
            shape = (c1 - c0,) if keep[0] else (1,)
            return DeviceTensor(self.chip, self._block, addr, shape, self.dtype, self.stride)
        (r0, r1), (c0, c1) = spans
        addr = self.addr + r0 * self.stride + c0 * self.itemsize
        # An int row gives a 1-D row, as in NumPy; an int column gives a block
        # of one column (a 1-D device tensor is always one row).
        shape = {(True, True): (r1 - r0, c1 - c0), (True, False): (r1 - r0, 1),
                 (False, True): (c1 - c0,), (False, False): (1,)}[tuple(keep)]
        return DeviceTensor(self.chip, self._block, addr, shape, self.dtype, self.stride)

    def strided(self, offset, shape, stride):
        """A 2-D view of the same memory: `shape` rows and columns from
        element `offset` of the tensor's first row, rows `stride` elements
        apart (e.g. the heads of one token as rows: ``q.strided(r * q.cols,
        (heads, head_dim), head_dim)``). It must lie inside this tensor's
        memory."""
        self._alive()
        rows, cols = (int(n) for n in shape)
        if rows < 1 or cols < 1 or stride < cols:
            raise ValueError(f"a strided view needs rows, cols >= 1 and a stride >= cols, not "
                             f"{shape} at stride {stride}")
        addr = self.addr + offset * self.itemsize
        end = addr + ((rows - 1) * stride + cols) * self.itemsize
        if offset < 0 or end > self._block.addr + self._block.nbytes:
            raise ValueError(f"a {shape} view at element {offset}, stride {stride}, lies outside "
                             f"the tensor's memory")
        return DeviceTensor(self.chip, self._block, addr, (rows, cols), self.dtype,
                            stride * self.itemsize)

    def operand(self):
        """The compiler's view: a `mxu.sim.compiler.operands.Operand`."""
        self._alive()
        return Operand(self.addr, self.rows, self.cols, self.stride, DTYPES[self.dtype],
                       self._block.transient)
