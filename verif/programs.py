"""Programs that the chip-level tests share: the native tests in `tests/` and the
cocotb testbench `tb_chip` run the same ones and compare with `IsaModel`."""

import numpy as np

from mxu.hdl.isa import BINARY_VPU_OPS, TOKEN_BITS, ErrorCode, Opcode, VpuOp, encode
from mxu.sim import Program
from mxu.verif import golden

__all__ = ["every_instruction", "loop_program", "random_program", "random_image", "bf16_bits",
           "error_programs", "run_both", "vector_program", "vector_error_programs", "fp32_operands",
           "EVERY_INSTRUCTION_OUTPUTS", "LOOP_OUTPUTS", "loadw_bound_program"]

# External byte ranges `every_instruction` writes.
EVERY_INSTRUCTION_OUTPUTS = [(0x1000, 0x1080), (0x2000, 0x2030), (0x3000, 0x3030)]


def run_both(chip, program, image, base=0x80000):
    """Run `program` with external memory `image` ({address: array}) on `chip`
    (a `mxu.sim.Chip`) and on a fresh `IsaModel` of its config; returns (the
    chip's result, the model, the model's `ModelResult`)."""
    from mxu.verif.isa_model import IsaModel
    model = IsaModel(chip.config)
    for addr, data in image.items():
        data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
        model.ext[addr:addr + data.size] = data
    code = program.to_bytes()
    model.ext[base:base + len(code)] = np.frombuffer(code, np.uint8)
    expected = model.run(code, base)
    return chip.run(program, image, base=base), model, expected


def bf16_bits(rng, shape):
    return rng.standard_normal(shape).astype(golden.bf16).view(np.uint16)


def every_instruction(config, rng):
    """(program, image): every opcode, seed mode, space and store option once.
    Written for a 4x4 array (rows of 8 bytes in VMEM, 16 in the accumulator)."""
    assert (config.rows, config.cols) == (4, 4), "every_instruction is written for 4x4"
    acts = bf16_bits(rng, (6, 4))
    weights = bf16_bits(rng, (3, 4))
    bias = rng.standard_normal((2, 4)).astype(np.float32)
    p = Program()
    p.load(vmem_row=0, ext_addr=0x000, rows=6, row_bytes=8)                  # activations
    p.load(vmem_row=8, ext_addr=0x100, rows=3, row_bytes=8)                  # 3 of 4 weight rows
    p.load(acc_row=20, ext_addr=0x200, rows=2, row_bytes=16, push_next=True)  # bias rows
    p.loadw(vmem_row=8, k_rows=3, pop_prev=True)
    p.matmul(act_row=0, m_rows=6, out_row=0, seed="bias", seed_row=20, new_weights=True)
    p.matmul(act_row=0, m_rows=6, out_row=8, seed="acc", seed_row=0)          # same weights
    p.matmul(act_row=2, m_rows=2, out_row=16, seed="zero", push_next=True)
    p.store(acc_row=0, ext_addr=0x1000, rows=6, row_bytes=16, pop_prev=True)
    p.store(acc_row=16, ext_addr=0x1060, rows=2, row_bytes=16)
    p.store(acc_row=8, ext_addr=0x2000, rows=6, row_bytes=8, to_bf16=True, relu=True)
    p.store(vmem_row=0, ext_addr=0x3000, rows=6, row_bytes=8, relu=True, push_prev=True)
    p.sync("compute", pop_next=True, push_prev=True)
    p.sync("load", pop_next=True)
    p.halt()
    return p, {0x000: acts, 0x100: weights, 0x200: bias}


# External byte range `loop_program` writes.
LOOP_OUTPUTS = (0x1000, 0x1000 + 6 * 64)


def loop_program(config, rng):
    """(program, image): three LOOPs -- six activation loads, six LOADW/MATMUL
    pairs, six stores -- whose addresses step by a stride, and a LOOP whose
    body has one instruction. Written for a 4x4 array."""
    assert (config.rows, config.cols) == (4, 4), "loop_program is written for 4x4"
    image = {0x000: bf16_bits(rng, (4, 4)), 0x100: bf16_bits(rng, (24, 4))}
    p = Program().load(vmem_row=0, ext_addr=0x000, rows=4, row_bytes=8)

    def iteration(i, engine):
        q = Program()
        if engine == "load":
            q.load(vmem_row=16 + 4 * i, ext_addr=0x100 + 32 * i, rows=4, row_bytes=8,
                   push_next=True)
        elif engine == "compute":
            q.loadw(vmem_row=0, k_rows=4, pop_prev=True)
            q.matmul(act_row=16 + 4 * i, m_rows=4, out_row=4 * i, new_weights=True,
                     push_next=True)
        else:
            q.store(acc_row=4 * i, ext_addr=0x1000 + 64 * i, rows=4, row_bytes=16, pop_prev=True)
        return q

    for engine in ("load", "compute"):
        p.loop_between(6, iteration(0, engine), iteration(1, engine))
    # The stores as a loop of two iterations around a loop of three.
    def stores(outer):
        q = Program()
        return q.loop_between(3, iteration(3 * outer, "store"), iteration(3 * outer + 1, "store"))
    p.loop_between(2, stores(0), stores(1))
    p.loop_between(3, Program().sync("load"), Program().sync("load"))
    return p.halt(), image


def random_image(config, rng):
    """The external-memory image `random_program` reads: finite bf16 rows at 0 and
    fp32 accumulator rows at 0x200."""
    finite = rng.standard_normal(1024).astype(golden.bf16).view(np.uint16)
    return {0: finite, 0x200: rng.standard_normal(32 * config.acc_row_bytes // 4).astype(np.float32)}


def random_program(config, rng):
    """Random instructions with random fields, fenced with tokens so that every
    instruction that shares data with another is ordered after it (a race-free
    program has exactly one outcome, the model's)."""
    ROW_B, ACC_B = config.vmem_row_bytes, config.acc_row_bytes
    p = Program()
    # Define every on-chip row the program may read: memories keep their contents
    # across runs, and the model starts from this image.
    p.load(vmem_row=0, ext_addr=0, rows=32, row_bytes=ROW_B)
    p.load(acc_row=0, ext_addr=0x200, rows=32, row_bytes=ACC_B, push_next=True)
    p.sync("compute", pop_prev=True)
    staged = 0
    for _ in range(int(rng.integers(8, 20))):
        kind = rng.choice(["load_v", "load_a", "loadw", "matmul", "store_a", "store_v"])
        if kind == "loadw" and staged:
            kind = "matmul"           # a second unused tile is WEIGHT_OVERFLOW
        if kind in ("load_v", "load_a"):
            acc = kind == "load_a"
            rows = int(rng.integers(1, 9))
            row_bytes = int(rng.integers(1, (ACC_B if acc else ROW_B) // 2 + 1)) * 2
            row_bytes -= row_bytes % (4 if acc else 2)
            row_bytes = max(row_bytes, 4 if acc else 2)
            where = {"acc_row": int(rng.integers(0, 24))} if acc else {"vmem_row": int(rng.integers(0, 24))}
            p.sync("compute", push_prev=True)      # earlier compute work is done
            p.load(**where, ext_addr=int(rng.integers(0, 64)) * 4, rows=rows, row_bytes=row_bytes,
                   ext_stride=row_bytes + 4 * int(rng.integers(0, 3)), pop_next=True,
                   push_next=True)
            p.sync("compute", pop_prev=True, push_prev=True)
            p.sync("load", pop_next=True)
        elif kind == "loadw":
            p.loadw(vmem_row=int(rng.integers(0, 28)), k_rows=int(rng.integers(0, 5)))
            staged += 1
        elif kind == "matmul":
            mode = rng.choice(["zero", "acc", "bias"])
            switch = staged == 1 and bool(rng.integers(0, 2))
            p.matmul(act_row=int(rng.integers(0, 28)), m_rows=int(rng.integers(1, 6)),
                     out_row=int(rng.integers(0, 26)), seed=mode, seed_row=int(rng.integers(0, 26)),
                     new_weights=switch)
            staged -= switch
        else:
            acc = kind == "store_a"
            where = {"acc_row": int(rng.integers(0, 28))} if acc else {"vmem_row": int(rng.integers(0, 28))}
            to_bf16 = acc and bool(rng.integers(0, 2))
            width = (ACC_B // 2 if to_bf16 else ACC_B) if acc else ROW_B
            p.sync("compute", push_next=True)
            p.store(**where, ext_addr=0x4000 + int(rng.integers(0, 64)) * 4,
                    rows=int(rng.integers(1, 5)), row_bytes=width, ext_stride=width + 8,
                    to_bf16=to_bf16, relu=bool(rng.integers(0, 2)), pop_prev=True, push_prev=True)
            p.sync("compute", pop_next=True)
    p.sync("compute", push_next=True)
    p.store(acc_row=0, ext_addr=0x6000, rows=32, row_bytes=ACC_B, pop_prev=True)
    return p.halt()


def error_programs(config):
    """name -> (program, expected ErrorCode, expected error pc or None): one
    program per error code the decoder and the engines raise on their own."""
    ok_load = dict(vmem_row=0, ext_addr=0, rows=1, row_bytes=8)
    cases = {}
    cases["illegal opcode"] = (Program().raw(encode(Opcode.HALT) & ~0xF | 14).halt(),
                               ErrorCode.ILLEGAL_INSTR, 0)
    cases["reserved bits"] = (Program().load(**ok_load).raw(encode(Opcode.HALT) | 1 << 100),
                              ErrorCode.ILLEGAL_INSTR, 1)
    cases["no halt"] = (Program().load(**ok_load), ErrorCode.ILLEGAL_INSTR, 1)
    cases["flag the engine lacks"] = (Program().load(**ok_load, pop_prev=True).halt(),
                                      ErrorCode.ILLEGAL_INSTR, 0)
    cases["vmem range"] = (Program().loadw(vmem_row=config.vmem_rows - 2, k_rows=4).halt(),
                           ErrorCode.VMEM_RANGE, 0)
    cases["acc range"] = (Program().matmul(act_row=0, m_rows=4, out_row=config.acc_rows - 2).halt(),
                          ErrorCode.ACC_RANGE, 0)
    cases["no weights"] = (Program().matmul(act_row=0, m_rows=1, out_row=0, new_weights=True).halt(),
                           ErrorCode.NO_WEIGHTS, 0)
    cases["misaligned dma"] = (Program().load(vmem_row=0, ext_addr=1, rows=1, row_bytes=8).halt(),
                               ErrorCode.DMA_DESCRIPTOR, 0)
    cases["dma chip range"] = (Program().load(vmem_row=config.vmem_rows - 1, ext_addr=0, rows=2,
                                              row_bytes=8).halt(), ErrorCode.DMA_DESCRIPTOR, 0)
    cases["weight overflow"] = (Program().loadw(vmem_row=0, k_rows=4).loadw(vmem_row=0, k_rows=4)
                                .halt(), ErrorCode.WEIGHT_OVERFLOW, 1)
    # 65,536 SYNCs on load push a token each onto load -> compute, which pops none.
    push = Program().sync("load", push_next=True)
    cases["token overflow"] = (Program().loop(1 << TOKEN_BITS, push, [0]).halt(),
                               ErrorCode.TOKEN_OVERFLOW, 1)
    cases["deadlock"] = (Program().loadw(vmem_row=0, k_rows=4, pop_prev=True).halt(),
                         ErrorCode.DEADLOCK, None)
    one = Program().sync("load")
    cases["loop of zero iterations"] = (Program().loop(0, one, [0]).halt(), ErrorCode.ILLEGAL_INSTR, 0)
    too_long = Program()
    for _ in range(config.loop_body_instrs + 1):
        too_long.sync("load")
    cases["loop body too long"] = (Program().loop(2, too_long, [0] * len(too_long)).halt(),
                                   ErrorCode.ILLEGAL_INSTR, 0)
    cases["loop past the end"] = (Program().sync("load").raw(encode(Opcode.LOOP, count=2, body=2)),
                                  ErrorCode.ILLEGAL_INSTR, 1)
    inner = Program().loop(2, one, [0])
    middle = Program().loop(2, inner, [0] * len(inner))
    cases["loops three deep"] = (Program().sync("load").loop(2, middle, [0] * len(middle)).halt(),
                                 ErrorCode.ILLEGAL_INSTR, 4)
    cases["loop with flags"] = (Program().raw(encode(Opcode.LOOP, count=1, body=1, flags=1))
                                .raw(one.words[0]).raw(0).halt(), ErrorCode.ILLEGAL_INSTR, 0)
    return cases


_SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001,
                      0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xC2B00000],
                     np.uint32)


def fp32_operands(rng, shape, specials=0.1):
    """fp32 bit patterns: normal numbers of several magnitudes, and a share of
    special values (signed zeros, infinities, NaN, subnormals, extremes)."""
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 7, shape))).astype(np.float32)
    bits = x.view(np.uint32).copy()
    pick = rng.random(shape) < specials
    bits[pick] = rng.choice(_SPECIALS, int(pick.sum()))
    return bits


def vector_program(config, rng, n=6):
    """(program, image, outputs): every VECTOR op in every ``b`` mode, in place
    and out of place, to the accumulator, to VMEM and transposed, back to back
    (the engine's interlock), then a MATMUL whose weights are a transposed
    VECTOR result and whose activations another (vector -> compute tokens),
    all stored (vector -> store and compute -> store tokens). For any shape;
    `outputs` are the external byte ranges written."""
    c = config
    assert c.vpu, "vector_program needs a chip with the vector unit"
    acc_bytes, vmem_bytes = c.acc_row_bytes, c.vmem_row_bytes
    a_bits, b_bits = fp32_operands(rng, (n, c.cols)), fp32_operands(rng, (n, c.cols))
    image = {0x000: a_bits, 0x4000: b_bits}
    p = Program()
    p.load(acc_row=0, ext_addr=0x000, rows=n, row_bytes=acc_bytes)
    p.load(acc_row=n, ext_addr=0x4000, rows=n, row_bytes=acc_bytes, push_next=True)
    p.sync("compute", pop_prev=True, push_next=True, vector=True)
    dst, first = 2 * n, True
    for op in VpuOp:
        modes = ([dict(b_row=n), dict(b_row=n + 1, broadcast=True), dict(scalar=-1.75)]
                 if op in BINARY_VPU_OPS else [{}])
        for mode in modes:
            p.vector(op, a_row=0, rows=n, dst_row=dst, pop_prev=first, **mode)
            first, dst = False, dst + n
    if c.cols % 2 == 0:
        # RoPE's lane swap of a, with each b mode and a unary op.
        for mode in (dict(b_row=n), dict(b_row=n + 1, broadcast=True), dict(scalar=0.5)):
            p.vector("mul", a_row=0, rows=n, dst_row=dst, swap=True, **mode)
            dst += n
        p.vector("pass", a_row=0, rows=n, dst_row=dst, swap=True)
        dst += n
    # A chain through one block of rows: each instruction reads the last one's
    # result (the interlock), in place, with the same rows as a and b.
    chain = dst
    p.vector("pass", a_row=0, rows=n, dst_row=chain)
    p.vector("exp", a_row=chain, rows=n, dst_row=chain)
    p.vector("mul", a_row=chain, b_row=chain, rows=n, dst_row=chain)
    p.vector("rsum", a_row=chain, rows=n, dst_row=chain + n)
    p.vector("recip", a_row=chain + n, rows=n, dst_row=chain + n)
    p.vector("mul", a_row=chain, b_row=chain + n, rows=n, dst_row=chain)
    acc_end = chain + 2 * n
    # VMEM results: plain rows (the activations) and a transposed block (the weights).
    p.vector("mul", a_row=0, rows=n, dst_row=0, scalar=0.5, to_vmem=True)
    p.vector("add", a_row=n, rows=min(n, c.rows), dst_row=n, scalar=0.25, to_vmem=True,
             transpose=True, push_prev=True, push_next=True)
    p.loadw(vmem_row=n, k_rows=min(c.rows, c.cols), pop_next=True, vector=True)
    p.matmul(act_row=0, m_rows=n, out_row=acc_end, new_weights=True, push_next=True)
    p.store(acc_row=0, ext_addr=0x8000, rows=acc_end, row_bytes=acc_bytes, pop_prev=True,
            vector=True)
    p.store(acc_row=acc_end, ext_addr=0xC000, rows=n, row_bytes=acc_bytes, pop_prev=True)
    p.store(vmem_row=0, ext_addr=0xE000, rows=n + c.cols, row_bytes=vmem_bytes)
    p.halt()
    outputs = [(0x8000, 0x8000 + acc_end * acc_bytes), (0xC000, 0xC000 + n * acc_bytes),
               (0xE000, 0xE000 + (n + c.cols) * vmem_bytes)]
    return p, image, outputs


def vector_error_programs(config):
    """name -> (program, expected ErrorCode, pc): the VECTOR instruction's static
    errors and the vector link's, on a chip with the vector unit."""
    c = config
    word = Program().vector("add", a_row=0, b_row=8, rows=4, dst_row=16).words[0]
    field = lambda name, value, base=word: _with_field(base, name, value)
    cases = {
        "unknown vector op": (field("op", 11), ErrorCode.ILLEGAL_INSTR),
        "b mode 3": (field("flags.b_mode", 3), ErrorCode.ILLEGAL_INSTR),
        "transpose to the accumulator": (field("flags.transpose", 1), ErrorCode.ILLEGAL_INSTR),
        "vector reserved flag": (field("flags.reserved", 4), ErrorCode.ILLEGAL_INSTR),
        "zero rows": (field("rows", 0), ErrorCode.ILLEGAL_INSTR),
        "partial overlap with a": (field("dst_row", 2), ErrorCode.ILLEGAL_INSTR),
        "partial overlap with b": (field("dst_row", 10), ErrorCode.ILLEGAL_INSTR),
        "a beyond the accumulator": (field("a_row", c.acc_rows - 3), ErrorCode.ACC_RANGE),
        "b beyond the accumulator": (field("b_row", c.acc_rows - 2), ErrorCode.ACC_RANGE),
        "dst beyond the accumulator": (field("dst_row", c.acc_rows - 1), ErrorCode.ACC_RANGE),
        "dst beyond VMEM": (Program().vector("pass", a_row=0, rows=4, dst_row=c.vmem_rows - 3,
                                             to_vmem=True).words[0], ErrorCode.VMEM_RANGE),
        "transpose beyond VMEM": (Program().vector("pass", a_row=0, rows=2, to_vmem=True,
                                                   transpose=True,
                                                   dst_row=c.vmem_rows - c.cols + 1).words[0],
                                  ErrorCode.VMEM_RANGE),
        "transpose taller than a VMEM row": (
            Program().vector("pass", a_row=0, rows=c.vmem_row_elems + 1, to_vmem=True,
                             transpose=True, dst_row=0).words[0], ErrorCode.ILLEGAL_INSTR),
        "vector link on a load": (
            Program().load(acc_row=0, ext_addr=0, rows=1, row_bytes=4).words[0] | 1 << 15,
            ErrorCode.ILLEGAL_INSTR),
        "vector link on a vector sync": (Program().sync("vector").words[0] | 1 << 15,
                                         ErrorCode.ILLEGAL_INSTR),
    }
    if c.cols % 2:
        cases["lane swap on an odd row"] = (field("flags.swap", 1), ErrorCode.ILLEGAL_INSTR)
    ok = Program().vector("pass", a_row=0, rows=1, dst_row=1)
    return {name: (Program().extend(ok).raw(w, name).halt(), code, 1)
            for name, (w, code) in cases.items()}


def _with_field(word, name, value):
    """`word` (a VECTOR) with one field, dotted for flags, set to `value`."""
    from mxu.hdl.isa import VectorInstr
    from mxu.hdl.fields import struct_layout
    layout, offset = VectorInstr.as_shape(), 0
    for part in name.split("."):
        field = layout[part]
        offset += field.offset
        layout = struct_layout(field.shape) or layout
    mask = ((1 << field.width) - 1) << offset
    return (word & ~mask) | (value << offset)


def loadw_bound_program(config, rng, tiles, used):
    """(program, image, out_addr, expected): M = 1 matmuls whose weights are in VMEM
    already, so that the weight path bounds every tile. One LOAD brings
    `tiles` weight tiles and an activation row into VMEM, then `used` (<=
    `tiles`) LOADW + MATMUL pairs in one LOOP (seed zero, accumulator row t
    for tile t); `tiles` accumulator rows are stored at `out_addr`, of which
    the first `used` are results (`expected`: their fp32 values, from the
    golden model). Only the LOOP's count depends on `used`. The LOOP issues
    one instruction every two cycles, a pair every four: the weight path is
    the bound when a tile takes more (`weight_load_cycles` > 4). Everything
    lies in the first bytes of external memory, after each other."""
    rows, elems = config.rows, config.vmem_row_elems
    W = rng.standard_normal((tiles * rows, config.cols)).astype(golden.bf16)
    a = rng.standard_normal((1, rows)).astype(golden.bf16)
    w_addr = 0x0
    a_addr = -(-tiles * rows * config.vmem_row_bytes // 4096) * 4096
    out_addr = a_addr + 4096
    act_row = tiles * rows
    image = {w_addr: np.pad(W.view(np.uint16), ((0, 0), (0, elems - config.cols))),
             a_addr: np.pad(a.view(np.uint16), ((0, 0), (0, elems - rows)))}
    p = Program()
    p.load(vmem_row=0, ext_addr=w_addr, rows=tiles * rows, row_bytes=config.vmem_row_bytes)
    p.load(vmem_row=act_row, ext_addr=a_addr, rows=1, row_bytes=config.vmem_row_bytes,
           push_next=True)
    p.sync("compute", pop_prev=True)

    def pair(t):
        return (Program().loadw(vmem_row=t * rows, k_rows=rows)
                .matmul(act_row=act_row, m_rows=1, out_row=t, new_weights=True))
    p.loop_between(used, pair(0), pair(1))
    p.sync("compute", push_next=True)
    p.store(acc_row=0, ext_addr=out_addr, rows=tiles, row_bytes=config.acc_row_bytes,
            pop_prev=True)
    p.halt()
    expected = np.concatenate([
        golden.matmul(a.astype(np.float32), W[t * rows:(t + 1) * rows].astype(np.float32),
                      rows=rows) for t in range(used)])
    return p, image, out_addr, expected
