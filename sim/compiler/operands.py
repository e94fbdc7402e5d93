"""Operand descriptors: what the compiler knows of a matmul's operands -- where
they are, not what they hold (docs/compiler.md).

An `Operand` is a 2-D block of external memory: ``rows`` rows of ``cols``
elements of ``dtype`` ("bf16" or "fp32"), row i at ``addr + i * stride``. A
`MatmulOp` is ``C = relu?(A @ B + bias)`` on four of them. A *transient*
operand is read only inside the program that writes it, so the compiler may
keep it on the chip and never write it to external memory (docs/compiler.md,
"Hand-offs in VMEM").
"""

from dataclasses import dataclass

from mxu.hdl.quant import QUANT_INFO, tile_block_bytes

# Steps the loads of quantized weights run ahead of the array (`plan.lead`).
# A LOAD brings a chunk of up to ``QUANT_LEAD - rows`` K tiles of one strip
# (`plan.chunk_tiles`), and a group's next chunks load while the array reads
# its current ones, one every chunk's tiles in steps: each load's token must
# already be free when the one before it ends (docs/compiler.md, "Quantized
# weights").
QUANT_LEAD = 48
SHORT_QUANT_LEAD = 16    # on a chip with little VMEM (`quant_lead`)


def quant_lead(config):
    """The lead of quantized weights: `QUANT_LEAD`, or `SHORT_QUANT_LEAD` on
    a chip whose VMEM holds fewer than 256 tiles (the ring's slots grow with
    the lead, and would leave such a chip no room; its chunks are then at
    most ``SHORT_QUANT_LEAD - rows`` tiles)."""
    return QUANT_LEAD if config.vmem_rows >= 256 * config.rows else SHORT_QUANT_LEAD

__all__ = ["quant_lead", "Operand", "QuantOperand", "Scatter", "MatmulOp", "ELEMENT_BYTES"]

ELEMENT_BYTES = {"bf16": 2, "fp32": 4}
_ADDR_LIMIT = 1 << 32      # DmaInstr.ext_addr and ext_stride are 32 bits


@dataclass(frozen=True)
class Operand:
    """A strided 2-D block of external memory."""
    addr: int
    rows: int
    cols: int
    stride: int          # bytes from one row to the next
    dtype: str           # "bf16" or "fp32"
    transient: bool = False   # dead once the program ends

    @property
    def elem(self):
        return ELEMENT_BYTES[self.dtype]

    @property
    def row_bytes(self):
        return self.cols * self.elem

    @property
    def span(self):
        """[first byte, last byte + 1) of the memory the block touches."""
        return self.addr, self.addr + (self.rows - 1) * self.stride + self.row_bytes

    def overlaps(self, other):
        if isinstance(other, Scatter):
            return other.overlaps(self)
        (a0, a1), (b0, b1) = self.span, other.span
        return a0 < b1 and b0 < a1

    def shares_bytes(self, other):
        """Whether the two blocks write a byte in common: exact for blocks of
        one stride whose rows stay within it (column blocks of one matrix,
        e.g. the two pieces of a ring's K^T), else `overlaps`."""
        s = self.stride
        if other.stride != s or self.rows == 1 or other.rows == 1:
            return self.overlaps(other)
        (ra, ca), (rb, cb) = divmod(self.addr, s), divmod(other.addr, s)
        if ca + self.row_bytes > s or cb + other.row_bytes > s:
            return self.overlaps(other)
        return (ra < rb + other.rows and rb < ra + self.rows
                and ca < cb + other.row_bytes and cb < ca + self.row_bytes)

    def check(self, name, ext_mem_bytes):
        """Raise ValueError naming `name` if the block cannot be moved by the DMA."""
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"{name}.dtype must be 'bf16' or 'fp32', not {self.dtype!r}")
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"{name} must have at least one row and column, not "
                             f"{self.rows}x{self.cols}")
        if self.addr % self.elem or self.stride % self.elem:
            raise ValueError(f"{name}: address 0x{self.addr:x} and stride {self.stride} must be "
                             f"multiples of the {self.elem}-byte element")
        if self.rows > 1 and self.stride < self.row_bytes:
            raise ValueError(f"{name}: rows of {self.row_bytes} bytes overlap at stride {self.stride}")
        lo, hi = self.span
        if lo < 0 or hi > min(ext_mem_bytes, _ADDR_LIMIT) or self.stride >= _ADDR_LIMIT:
            raise ValueError(f"{name}: bytes [0x{lo:x}, 0x{hi:x}) lie outside the "
                             f"{ext_mem_bytes}-byte external memory")


@dataclass(frozen=True)
class QuantOperand:
    """Weights (``rows`` = K x ``cols`` = N) kept as GGUF blocks in the chip's
    tile-block layout (docs/memory.md, "Quantized loads"): column group j's
    K x `tile_cols` strip starts at ``addr + j * strip``, and its tile-blocks
    (`block` rows each, ``tile`` bytes) follow each other along K. A
    matmul's weights operand, expanded to bf16 by quantized LOADs."""
    addr: int
    rows: int
    cols: int
    format: object       # `mxu.hdl.quant.QuantFormat`
    strip: int           # bytes from one column group's strip to the next
    tile_cols: int       # columns of a tile-block (the chip's cols at upload)
    transient = False
    dtype = "quant"

    @property
    def block(self):
        return QUANT_INFO[self.format].block

    @property
    def tile(self):
        """Bytes of one tile-block."""
        return tile_block_bytes(self.format, self.tile_cols)

    @property
    def groups(self):
        return -(-self.cols // self.tile_cols)

    def tile_beats(self, rows, bus_bytes):
        """Bus beats of one K tile of `rows` rows of a strip."""
        return -(-self.tile * rows // (self.block * bus_bytes))

    @property
    def nbytes(self):
        """The bytes a matmul reads: every tile-block once."""
        return self.groups * (self.rows // self.block) * self.tile

    @property
    def row_bytes(self):
        return -(-self.nbytes // self.rows)

    @property
    def span(self):
        return self.addr, self.addr + (self.groups - 1) * self.strip + \
            (self.rows // self.block) * self.tile

    def overlaps(self, other):
        if isinstance(other, Scatter):
            return other.overlaps(self)
        (a0, a1), (b0, b1) = self.span, other.span
        return a0 < b1 and b0 < a1

    def rows_of(self, r0, r1):
        """K rows r0 .. r1-1 (whole blocks)."""
        if r0 % self.block or (r1 % self.block and r1 != self.rows):
            raise ValueError(f"quantized weights split at K row {r0}..{r1}: not whole "
                             f"{self.format.name} blocks of {self.block}")
        return QuantOperand(self.addr + r0 // self.block * self.tile, r1 - r0, self.cols,
                            self.format, self.strip, self.tile_cols)

    def check(self, name, config):
        """Raise ValueError naming `name` if the chip cannot load these weights."""
        fmt, r = self.format, config.rows
        if fmt.name not in config.quant_formats:
            raise ValueError(f"{name}: {fmt.name} is not one of this chip's formats "
                             f"{config.quant_formats} (ChipConfig.quant_formats)")
        if self.tile_cols != config.cols:
            raise ValueError(f"{name}: tile-blocks of {self.tile_cols} columns; the chip's "
                             f"are {config.cols}")
        if self.rows % self.block or self.rows < 1 or self.cols < 1:
            raise ValueError(f"{name}: {self.rows} x {self.cols} is not whole {fmt.name} "
                             f"blocks of {self.block} along K")
        if self.block % r and r % self.block:
            raise ValueError(f"{name}: {fmt.name} blocks of {self.block} rows and K tiles of "
                             f"{r} rows do not nest")
        beat = config.axi_data_bytes
        if self.addr % beat or self.strip % beat:
            raise ValueError(f"{name}: address 0x{self.addr:x} and strip {self.strip} must be "
                             f"whole {beat}-byte bus beats")
        lo, hi = self.span
        if lo < 0 or hi > config.ext_mem_bytes:
            raise ValueError(f"{name}: bytes [0x{lo:x}, 0x{hi:x}) lie outside the "
                             f"{config.ext_mem_bytes}-byte external memory")


@dataclass(frozen=True)
class Scatter:
    """A result written in pieces: result rows ``m0 .. m0 + n - 1`` go to a
    piece's operand (its n rows; with a `transposed` result, its n columns).
    How a batch of sequences appends to each one's KV cache (docs/llm.md).
    Its shape is that of the whole result as one operand would hold it."""
    pieces: tuple            # ((m0, Operand), ...), m0 ascending, each result row once
    transposed: bool = False
    transient = False

    def __post_init__(self):
        if not self.pieces:
            raise ValueError("a Scatter needs at least one piece")

    def _length(self, operand):
        return operand.cols if self.transposed else operand.rows

    @property
    def operands(self):
        return tuple(o for _, o in self.pieces)

    @property
    def dtype(self):
        return self.pieces[0][1].dtype

    @property
    def elem(self):
        return ELEMENT_BYTES[self.dtype]

    @property
    def rows(self):
        if self.transposed:
            return self.pieces[0][1].rows
        return sum(o.rows for o in self.operands)

    @property
    def cols(self):
        if self.transposed:
            return sum(o.cols for o in self.operands)
        return self.pieces[0][1].cols

    @property
    def row_bytes(self):
        return self.cols * self.elem

    @property
    def span(self):
        spans = [o.span for o in self.operands]
        return min(a for a, _ in spans), max(b for _, b in spans)

    def overlaps(self, other):
        return any(o.overlaps(other) for o in self.operands)

    def rows_in(self, m0, m1):
        """(first result row, rows, piece operand, offset in the piece) of the
        pieces' parts within result rows m0 .. m1-1."""
        out = []
        for start, operand in self.pieces:
            end = start + self._length(operand)
            a, b = max(m0, start), min(m1, end)
            if a < b:
                out.append((a, b - a, operand, a - start))
        return out

    def check(self, name, ext_mem_bytes):
        at = 0
        for k, (m0, operand) in enumerate(self.pieces):
            operand.check(f"{name} piece {k}", ext_mem_bytes)
            if m0 != at:
                raise ValueError(f"{name}: piece {k} starts at result row {m0}, not {at}: the "
                                 f"pieces must cover the rows in order, each once")
            at += self._length(operand)
        first = self.pieces[0][1]
        for k, (_, operand) in enumerate(self.pieces):
            other = operand.rows if self.transposed else operand.cols
            if operand.dtype != first.dtype or other != (first.rows if self.transposed else first.cols):
                raise ValueError(f"{name}: piece {k} is {operand.rows}x{operand.cols} "
                                 f"{operand.dtype}; every piece has the result's "
                                 f"{'rows' if self.transposed else 'columns'} and dtype")
            for _, later in self.pieces[k + 1:]:
                if operand.shares_bytes(later):
                    raise ValueError(f"{name}: pieces overlap")


@dataclass(frozen=True)
class MatmulOp:
    """``c = relu?(a @ b + bias)``: a (M x K) and b (K x N) bf16, c (M x N) fp32 or
    bf16 (rounded to nearest even), bias fp32: None, one row (1 x N, "row") or
    M x N ("matrix"). A matrix bias may be c itself (read, then overwritten:
    how the runtime chains the chunks of a split K). With an `epilogue` (an
    `Epilogue`, chips with the vector unit) c receives the epilogue's result
    instead, and the matmul's own fp32 result never leaves the chip."""
    a: Operand
    b: Operand
    c: Operand
    bias: Operand = None
    relu: bool = False
    epilogue: object = None

    @property
    def transposed(self):
        """Whether c is the transpose of the result (a "transpose" epilogue)."""
        return self.epilogue is not None and self.epilogue.transposed

    @property
    def out_cols(self):
        """Columns of the stored result: N, or what c holds of a paired
        epilogue's (at most N / 2: its tiles alternate)."""
        if self.epilogue is None or not self.epilogue.is_paired:
            return self.N
        return self.c.rows if self.transposed else self.c.cols

    @property
    def reads(self):
        """The operands the op reads."""
        extra = () if self.epilogue is None else self.epilogue.reads
        return (self.a, self.b) + ((self.bias,) if self.bias is not None else ()) + extra

    @property
    def writes(self):
        """The operands the op writes."""
        extra = self.epilogue.extra if self.epilogue is not None else None
        c = self.c.operands if isinstance(self.c, Scatter) else (self.c,)
        return c + ((extra,) if extra is not None else ())

    @property
    def outputs(self):
        """c and the epilogue's extra output (None without one), as given."""
        return (self.c, self.epilogue.extra if self.epilogue is not None else None)

    def plan_args(self, config):
        """The keyword arguments of `plan_op` that describe this op on `config`."""
        from .plan import lead      # plan imports this module
        ep = self.epilogue
        ring = ({"ring": quant_lead(config), "w_beats": self.b.tile_beats(config.rows, config.axi_data_bytes)}
                if self.quantized else {"ring": lead(self, config)})
        if ep is None:
            return ring
        pieces = len(self.c.pieces) if isinstance(self.c, Scatter) else 1
        head = {"head": ep.params.cols} if ep.desc.head_wise else {}
        return dict(epilogue=ep.kind, transposed=ep.transposed, pieces=pieces,
                    paired=ep.is_paired, row_width=ep.other.cols if ep.desc.row_operand else 0,
                    **head, **ring)

    @property
    def M(self):
        return self.a.rows

    @property
    def K(self):
        return self.a.cols

    @property
    def N(self):
        return self.b.cols

    @property
    def quantized(self):
        """Whether the weights b are GGUF blocks (a `QuantOperand`)."""
        return isinstance(self.b, QuantOperand)

    @property
    def bias_kind(self):
        if self.bias is None:
            return "none"
        return "row" if self.bias.rows == 1 and self.M > 1 else "matrix"

    @property
    def macs(self):
        return self.M * self.K * self.N

    def check(self, config):
        """Raise ValueError if the operands do not describe a matmul the chip runs."""
        for name in ("a", "c") + (("bias",) if self.bias is not None else ()):
            getattr(self, name).check(name, config.ext_mem_bytes)
        if self.quantized:
            self.b.check("b", config)
        else:
            self.b.check("b", config.ext_mem_bytes)
        if self.a.dtype != "bf16" or self.b.dtype not in ("bf16", "quant"):
            raise ValueError(f"a and b must be bf16, not {self.a.dtype} and {self.b.dtype}")
        if self.b.rows != self.K:
            raise ValueError(f"inner dimensions differ: a is {self.M}x{self.K}, "
                             f"b is {self.b.rows}x{self.N}")
        N = self.out_cols
        if self.epilogue is not None and self.epilogue.is_paired and \
                not self.N // 2 - config.cols < N <= self.N // 2:
            raise ValueError(f"a paired epilogue's result is {N} columns: its {self.N} "
                             f"alternate in tiles of {config.cols}, so it holds "
                             f"{self.N // 2 - config.cols + 1} to {self.N // 2}")
        shape = (N, self.M) if self.transposed else (self.M, N)
        if isinstance(self.c, Scatter) and self.c.transposed != self.transposed:
            raise ValueError("a Scatter of a transposed result must say transposed=True, and "
                             "only then")
        if (self.c.rows, self.c.cols) != shape:
            raise ValueError(f"c must be {shape[0]}x{shape[1]}, not {self.c.rows}x{self.c.cols}")
        if self.transposed and self.c.dtype != "bf16":
            raise ValueError("the transposed c of a transpose epilogue is bf16")
        if self.bias is not None:
            if self.bias.dtype != "fp32":
                raise ValueError(f"bias must be fp32, not {self.bias.dtype}")
            if self.bias.cols != self.N or self.bias.rows not in (1, self.M):
                raise ValueError(f"bias must be 1x{self.N} or {self.M}x{self.N}, "
                                 f"not {self.bias.rows}x{self.bias.cols}")
        for name in ("a", "b") + (("bias",) if self.bias not in (None, self.c) else ()):
            if getattr(self, name).overlaps(self.c):
                raise ValueError(f"the output c overlaps the input {name}")
        if self.epilogue is not None:
            if self.relu:
                raise ValueError("a matmul with an epilogue takes no relu")
            self.epilogue.check(config, self.M, self.N, self.out_cols)
            for out in self.writes:
                for read in self.reads:
                    if out.overlaps(read):
                        raise ValueError("an output of the epilogue overlaps one of its inputs")
