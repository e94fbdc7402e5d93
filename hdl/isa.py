"""The mxu instruction set, defined once: the decoder in `mxu.hdl.controller` and
the assembler in `mxu.sim.compiler.program` both read these layouts.

Every instruction is 128 bits (16 bytes, little-endian in memory). The low 16 bits
are the same for all: opcode, four dependency flags and eight opcode-specific
flag bits. Unused bits are ``reserved`` and must be zero; the decoder reports
anything else as an illegal instruction. docs/isa.md has one table per
instruction, generated from these classes (`field_table`).

Engines and dependency tokens (as in VTA): LOAD runs on the load engine, LOADW
and MATMUL on the compute engine, STORE and SEND on the store engine, RECV on
the load engine, VECTOR on the
vector engine (chips with ``config.vpu``), and SYNC on the engine it names. The
engines run concurrently; ordering between them is explicit. Each engine has a
*prev* and a *next* neighbour (load -> compute -> store);
``pop_prev``/``pop_next`` wait for and take a token from that neighbour before
the instruction starts, ``push_prev``/``push_next`` give it one after the
instruction has completed. The vector engine sits between compute and store
(its prev is compute, its next is store): a compute instruction with the
``vector`` flag (flag bit 7, `VECTOR_LINK_BIT`) pops and pushes its *next*
tokens from and to the vector engine instead of the store engine, and a store
instruction with it its *prev* tokens (docs/isa.md).
"""

from amaranth.lib import data, enum

from .fields import field_plan, struct_layout, pack_fields, unpack_fields
from .quant import QuantFormat

__all__ = [
    "INSTR_BITS", "INSTR_BYTES", "Opcode", "Engine", "SeedMode", "Deps", "Header",
    "DmaInstr", "LinkInstr", "LoadWInstr", "MatmulInstr", "SyncInstr", "HaltInstr", "LoopInstr", "VpuOp",
    "BMode", "BINARY_VPU_OPS", "TOKEN_LINKS", "TOKEN_BITS", "engines_of", "VectorFlags", "VectorInstr", "Pushes", "VECTOR_LINK_BIT", "INSTRUCTIONS", "ENGINE_OF", "ErrorCode",
    "encode", "decode", "field_table",
]

INSTR_BITS = 128
INSTR_BYTES = INSTR_BITS // 8


class Opcode(enum.Enum, shape=4):
    """Instruction opcodes. 0 is illegal on purpose: running into zeroed memory
    stops with an error instead of doing something."""
    ILLEGAL = 0
    LOAD = 1     # load engine: external memory -> VMEM or accumulator (DMA)
    STORE = 2    # store engine: accumulator or VMEM -> external memory (DMA)
    LOADW = 3    # compute engine: stage a weight tile from VMEM into the array
    MATMUL = 4   # compute engine: stream activation rows through the array
    SYNC = 5     # the named engine: only dependency tokens
    LOOP = 6     # the loop expander: repeat the next instructions with strides
    VECTOR = 7   # vector engine: an element-wise op or row reduction on accumulator rows
    SEND = 8     # store engine: VMEM or accumulator rows -> an inter-chip link
    RECV = 9     # load engine: rows arriving on an inter-chip link -> VMEM or accumulator
    HALT = 15    # end of program, once every engine is idle


class Engine(enum.Enum, shape=2):
    LOAD = 0
    COMPUTE = 1
    STORE = 2
    VECTOR = 3


class SeedMode(enum.Enum, shape=2):
    """Where MATMUL's partial sums start (docs/numerics.md)."""
    ZERO = 0     # +0.0
    ACC = 1      # accumulator row seed_row + i (accumulate over K tiles)
    BIAS = 2     # accumulator row seed_row for every i (a broadcast bias row)


class ErrorCode(enum.Enum, shape=4):
    """The chip's status error code. The first error wins; the chip then drains
    what is in flight and stops with ``done`` set."""
    NONE = 0
    ILLEGAL_INSTR = 1    # bad opcode, reserved bits set, or a flag the engine lacks
    VMEM_RANGE = 2       # LOADW/MATMUL rows beyond VMEM
    ACC_RANGE = 3        # MATMUL rows beyond the accumulator memory
    NO_WEIGHTS = 4       # MATMUL switches to new weights that no LOADW staged
    DMA_DESCRIPTOR = 5   # LOAD/STORE rejected by the DMA (options, alignment, ranges)
    AXI_ERROR = 6        # SLVERR/DECERR on a DMA transfer
    FETCH_ERROR = 7      # SLVERR/DECERR, or a program outside external memory / misaligned
    DEADLOCK = 8         # every engine waits for a token that nothing can give
    WEIGHT_OVERFLOW = 9  # LOADW while an earlier LOADW's tile is still unused
    TOKEN_OVERFLOW = 10  # a push onto a token counter that already holds 2**TOKEN_BITS - 1
    LINK_INDEX = 11      # SEND/RECV on a link at or beyond config.links


class Deps(data.Struct):
    pop_prev: 1
    pop_next: 1
    push_prev: 1
    push_next: 1


TOKEN_BITS = 16
"""Width of each dependency-token counter: at most 65,535 tokens outstanding
on one link (docs/isa.md)."""

VECTOR_LINK_BIT = 15
"""Bit of the instruction word (flag bit 7) that links a compute instruction's
*next* side, or a store instruction's *prev* side, to the vector engine."""


def engines_of(config):
    """The engines a chip has: load, compute, store, and vector with ``config.vpu``."""
    return tuple(e for e in Engine if e is not Engine.VECTOR or config.vpu)


TOKEN_LINKS = {
    # (engine, side, vector link flag) -> (token counter it pushes, counter it pops)
    (Engine.LOAD, "next", 0): ("l2c", "c2l"),
    (Engine.COMPUTE, "prev", 0): ("c2l", "l2c"),
    (Engine.COMPUTE, "next", 0): ("c2s", "s2c"),
    (Engine.COMPUTE, "next", 1): ("c2v", "v2c"),
    (Engine.VECTOR, "prev", 0): ("v2c", "c2v"),
    (Engine.VECTOR, "next", 0): ("v2s", "s2v"),
    (Engine.STORE, "prev", 0): ("s2c", "c2s"),
    (Engine.STORE, "prev", 1): ("s2v", "v2s"),
}
"""The dependency-token counters between neighbouring engines (docs/isa.md)."""


class Pushes(data.Struct):
    """What an engine reports when an instruction completes: its push flags, and
    whether its compute-next / store-prev side is linked to the vector engine."""
    deps: Deps
    vector: 1


class Header(data.Struct):
    opcode: Opcode
    deps: Deps
    flags: 8


class DmaFlags(data.Struct):
    space: 1        # 0 VMEM, 1 accumulator
    to_bf16: 1      # STORE from the accumulator: convert fp32 -> bf16 (RNE)
    relu: 1         # STORE: max(x, +0) before conversion
    quant: QuantFormat    # LOAD to VMEM: tile-blocks of this GGUF format, expanded to bf16
                          # weight rows (docs/memory.md, "Quantized loads"); NONE: bytes as they are
    vector: 1       # STORE: the prev-side tokens are the vector engine's


class DmaInstr(data.Struct):
    """LOAD and STORE: a 2-D strided block, one external row per on-chip row.
    A LOAD with a ``flags.quant`` format writes ``rows`` expanded weight rows instead, from
    ``rows / block`` tile-blocks of ``row_bytes`` bytes, tile-block i at
    ``ext_addr + i * ext_stride`` (docs/memory.md, "Quantized loads")."""
    opcode: Opcode
    deps: Deps
    flags: DmaFlags
    ext_addr: 32     # byte address of row 0 in external memory
    ext_stride: 32   # bytes between external rows
    chip_row: 20     # first VMEM / accumulator row
    rows: 16         # number of rows
    row_bytes: 12    # bytes per external row


class LinkInstr(data.Struct):
    """SEND and RECV (chips with links, docs/pod.md): rows ``chip_row ..
    chip_row + rows - 1`` go out on link ``link`` (SEND, with the flags of a
    STORE), or the next ``rows`` rows that arrive on it are written there
    (RECV, with those of a LOAD). The rows travel as a byte stream of
    ``rows * row_bytes`` bytes in whole flits; a SEND and the RECV that takes
    it give the same ``rows * row_bytes``. The fields after ``link`` sit where
    DmaInstr has them. ``flags.quant`` is reserved (zero)."""
    opcode: Opcode
    deps: Deps
    flags: DmaFlags
    link: 8
    reserved: 56
    chip_row: 20
    rows: 16
    row_bytes: 12


class LoadWFlags(data.Struct):
    reserved: 7
    vector: 1       # the next-side token (pop_next) is the vector engine's


class LoadWInstr(data.Struct):
    """LOADW: weight rows k = 0..k_rows-1 from VMEM rows vmem_row + k (the first
    ``cols`` bf16 of each); rows k_rows..rows-1 of the tile are zero."""
    opcode: Opcode
    deps: Deps
    flags: LoadWFlags
    vmem_row: 20
    k_rows: 16
    reserved: 76


class MatmulFlags(data.Struct):
    seed_mode: SeedMode
    new_weights: 1   # row 0 switches the array to the next staged weight tile
    reserved: 4
    vector: 1        # the next-side tokens are the vector engine's


class MatmulInstr(data.Struct):
    """MATMUL: for i in 0..m_rows-1, acc[out_row + i] = seed_i + act[act_row + i] @ W."""
    opcode: Opcode
    deps: Deps
    flags: MatmulFlags
    act_row: 20      # first VMEM row of activations (the first ``rows`` bf16 of each)
    m_rows: 16       # number of activation rows, >= 1
    out_row: 20      # first accumulator row written
    seed_row: 20     # first accumulator row read (SeedMode.ACC / BIAS)
    reserved: 36


class SyncFlags(data.Struct):
    engine: Engine
    reserved: 5
    vector: 1        # compute: next side, store: prev side linked to the vector engine


class SyncInstr(data.Struct):
    """SYNC: takes and gives tokens on `engine` and does nothing else."""
    opcode: Opcode
    deps: Deps
    flags: SyncFlags
    reserved: 112


class HaltInstr(data.Struct):
    """HALT: stop fetching; ``done`` rises once every engine is idle."""
    opcode: Opcode
    deps: Deps
    flags: 8
    reserved: 112


class LoopInstr(data.Struct):
    """LOOP: the next ``2 * body`` words are ``body`` pairs (instruction, delta);
    the loop expander issues ``instruction + i * delta`` (128-bit sums) for
    i = 0..count-1, the pairs in order (`mxu.hdl.loop`). Legal only with
    count >= 1, 1 <= body <= ``config.loop_body_instrs``, the whole body inside
    the program, and deps, flags and reserved bits zero."""
    opcode: Opcode
    deps: Deps
    flags: 8
    count: 32        # iterations
    body: 16         # instruction/delta pairs that follow
    reserved: 64


class VpuOp(enum.Enum, shape=4):
    """Element operations of the vector unit: ``y = op(a, b)`` (docs/vpu.md)."""
    ADD = 0      # a + b
    SUB = 1      # a - b
    MUL = 2      # a * b
    MAX = 3      # max(a, b), NaN if either is, -0 < +0
    MIN = 4      # min(a, b), likewise
    EXP = 5      # vecmath.exp(a)
    RECIP = 6    # vecmath.reciprocal(a)
    RSQRT = 7    # vecmath.rsqrt(a)
    PASS = 8     # a (a copy, e.g. for fp32 -> bf16 stores)
    RSUM = 9     # the sum of row a's elements in tree order, in every lane (VectorAlu only)
    RMAX = 10    # the maximum of row a's elements, likewise


BINARY_VPU_OPS = (VpuOp.ADD, VpuOp.SUB, VpuOp.MUL, VpuOp.MAX, VpuOp.MIN)
"""The ops that read ``b``."""


class BMode(enum.Enum, shape=2):
    """Where VECTOR's ``b`` operand of row i comes from (binary ops only)."""
    ROW = 0          # accumulator row b_row + i
    BROADCAST = 1    # accumulator row b_row, for every i
    SCALAR = 2       # imm, in every lane


class VectorFlags(data.Struct):
    b_mode: BMode
    to_vmem: 1       # write VMEM rows (fp32 -> bf16, RNE) instead of accumulator rows
    transpose: 1     # with to_vmem: the result rows become VMEM columns
    swap: 1          # a's lanes in pairs (2i, 2i+1) read as (-a[2i+1], a[2i]): RoPE's rotation
    reserved: 3


class VectorInstr(data.Struct):
    """VECTOR: for i in 0..rows-1, dst[dst_row + i] = op(acc[a_row + i], b_i)
    (docs/vpu.md). With ``transpose`` (rows <= vmem_row_elems), VMEM row
    dst_row + j holds element j of every result row instead, row i in
    element i. With ``swap`` (chips with an even number of columns), lane
    2i of ``a`` reads ``-a[2i+1]`` and lane 2i+1 reads ``a[2i]`` (the pair
    rotation of RoPE, docs/llm.md)."""
    opcode: Opcode
    deps: Deps
    flags: VectorFlags
    op: VpuOp
    a_row: 20        # first accumulator row of a
    b_row: 20        # first accumulator row of b (BMode.ROW / BROADCAST)
    dst_row: 20      # first accumulator or VMEM row written
    rows: 16         # number of rows, >= 1
    imm: 32          # fp32 bit pattern of b (BMode.SCALAR)


INSTRUCTIONS = {
    Opcode.LOAD: DmaInstr, Opcode.STORE: DmaInstr, Opcode.LOADW: LoadWInstr,
    Opcode.MATMUL: MatmulInstr, Opcode.SYNC: SyncInstr, Opcode.HALT: HaltInstr,
    Opcode.LOOP: LoopInstr, Opcode.VECTOR: VectorInstr, Opcode.SEND: LinkInstr,
    Opcode.RECV: LinkInstr,
}

ENGINE_OF = {
    Opcode.LOAD: Engine.LOAD, Opcode.LOADW: Engine.COMPUTE, Opcode.MATMUL: Engine.COMPUTE,
    Opcode.STORE: Engine.STORE, Opcode.VECTOR: Engine.VECTOR, Opcode.SEND: Engine.STORE,
    Opcode.RECV: Engine.LOAD,
}

# The layouts as shapes, once: `as_shape` is slow, and a model's programs hold
# hundreds of thousands of instructions.
_LAYOUTS = {opcode: instr.as_shape() for opcode, instr in INSTRUCTIONS.items()}

for _layout in (Header, *INSTRUCTIONS.values()):
    assert _layout.as_shape().size == (16 if _layout is Header else INSTR_BITS), _layout


def encode(opcode, **fields):
    """The 128-bit integer of one instruction. Fields are named as in the layouts;
    nested flag structs take dicts (``flags={"space": 1}``) and the dependency flags
    may be given as ``deps={"pop_prev": 1}``. Values that do not fit raise."""
    opcode = opcode if isinstance(opcode, Opcode) else Opcode(opcode)
    return pack_fields(_LAYOUTS[opcode], {"opcode": opcode.value, **fields})


def field_value(word, opcode, name):
    """One top-level field of an instruction word of a known opcode, without
    decoding the rest (the compiler reads fields of many thousand words)."""
    offset, width, _ = field_plan(_LAYOUTS[Opcode(opcode)])[name]
    return (int(word) >> offset) & ((1 << width) - 1)


def decode(word):
    """(Opcode, dict of fields, nested dicts for flag structs) of a 128-bit integer;
    raises ValueError for an illegal opcode."""
    try:
        opcode = Opcode(word & 0xF)
    except ValueError:
        raise ValueError(f"illegal opcode {word & 0xF}") from None
    if opcode is Opcode.ILLEGAL:
        raise ValueError("illegal opcode 0")
    return opcode, unpack_fields(_LAYOUTS[opcode], word)


def field_table(instr):
    """Markdown rows (bits, field, width) of an instruction layout, for docs/isa.md."""
    rows = []

    def walk(layout, prefix, base):
        for name, field in layout:
            nested = struct_layout(field.shape)
            if nested is not None:
                walk(nested, f"{prefix}{name}.", base + field.offset)
            else:
                lo = base + field.offset
                hi = lo + field.width - 1
                rows.append(f"| {hi}:{lo} | `{prefix}{name}` | {field.width} |")
    walk(instr.as_shape(), "", 0)
    return "\n".join(["| bits | field | width |", "|---|---|---|", *rows])
