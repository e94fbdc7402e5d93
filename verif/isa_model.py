"""The functional model of the ISA: what a program does to external memory, VMEM
and the accumulator, instruction by instruction (docs/isa.md).

Engines are modelled as in-order queues of `queue_depth` instructions fed in
program order, with token counters between neighbours; any engine whose head
instruction has its tokens executes it whole. A program whose tokens order every
conflicting access (a race-free program) has exactly one outcome, which is what
the RTL must produce. LOAD/STORE go through `DmaModel`; MATMUL through the golden
numerics, one sequential fp32 dot product per output (docs/numerics.md).
"""

from dataclasses import dataclass, field

import numpy as np

from mxu.hdl import isa
from mxu.hdl.dma import DmaDir, DmaError, DmaSpace
from mxu.hdl.quant import QuantFormat
from mxu.hdl.isa import (BINARY_VPU_OPS, TOKEN_BITS, TOKEN_LINKS, BMode, Engine, ErrorCode,
                         Opcode, SeedMode, VpuOp)
from mxu.verif import golden
from mxu.verif.dma_model import Descriptor, DmaModel, check_descriptor

__all__ = ["IsaModel", "ModelResult", "check_instruction", "expand_loops", "token_counters",
           "vector_accesses"]


def token_counters(engine, side, f):
    """(counter pushed, counter popped) on `side` of `engine` for an instruction
    with fields `f` (its vector link flag picks the counters), or None."""
    flags = f.get("flags")
    link = flags.get("vector", 0) if isinstance(flags, dict) else 0
    return TOKEN_LINKS.get((engine, side, link)) or TOKEN_LINKS.get((engine, side, 0))


@dataclass
class ModelResult:
    error: ErrorCode
    pc: int                      # instruction index of the error (or of HALT)
    matmul_rows: int = 0         # activation rows streamed (for utilisation)
    vector_rows: int = 0         # rows through the vector unit
    dma_bytes: dict = field(default_factory=lambda: {"read": 0, "written": 0})


def check_instruction(config, word):
    """(ErrorCode, opcode, fields) of one instruction word, from decoding and static
    checks alone (what the RTL checks before an instruction starts)."""
    try:
        opcode, f = isa.decode(word)
    except ValueError:
        return ErrorCode.ILLEGAL_INSTR, None, None
    deps = f["deps"]
    if _reserved_set(f) or (opcode is Opcode.VECTOR and not config.vpu):
        return ErrorCode.ILLEGAL_INSTR, opcode, f
    if opcode in (Opcode.SEND, Opcode.RECV) and f["flags"]["quant"]:
        return ErrorCode.ILLEGAL_INSTR, opcode, f      # reserved on a link
    engine = _engine(opcode, f, config)
    if opcode is Opcode.HALT:
        bad = any(deps.values()) or f["flags"] != 0
    elif engine is None:
        bad = True
    else:
        link = isinstance(f["flags"], dict) and f["flags"].get("vector", 0)
        bad = ((deps["pop_prev"] or deps["push_prev"]) and engine is Engine.LOAD) or \
              ((deps["pop_next"] or deps["push_next"]) and engine is Engine.STORE) or \
              (opcode is Opcode.LOADW and (deps["push_prev"] or deps["push_next"])) or \
              (link and not (config.vpu and engine in (Engine.COMPUTE, Engine.STORE)))
        if opcode is Opcode.VECTOR:
            fl = f["flags"]
            bad = bad or f["op"] > VpuOp.RMAX.value or fl["b_mode"] > BMode.SCALAR.value \
                or (fl["transpose"] and not fl["to_vmem"]) \
                or (fl["swap"] and config.cols % 2)
    if bad:
        return ErrorCode.ILLEGAL_INSTR, opcode, f
    if opcode is Opcode.LOADW:
        if f["k_rows"] > config.rows:
            return ErrorCode.ILLEGAL_INSTR, opcode, f
        if f["vmem_row"] + f["k_rows"] > config.vmem_rows:
            return ErrorCode.VMEM_RANGE, opcode, f
    if opcode is Opcode.MATMUL:
        m, mode = f["m_rows"], f["flags"]["seed_mode"]
        if m == 0 or mode > SeedMode.BIAS.value:
            return ErrorCode.ILLEGAL_INSTR, opcode, f
        if f["act_row"] + m > config.vmem_rows:
            return ErrorCode.VMEM_RANGE, opcode, f
        seed_end = f["seed_row"] + (m if mode == SeedMode.ACC.value else 1)
        if f["out_row"] + m > config.acc_rows or (mode != SeedMode.ZERO.value and seed_end > config.acc_rows):
            return ErrorCode.ACC_RANGE, opcode, f
    if opcode is Opcode.VECTOR:
        return _vector_error(config, f), opcode, f
    if opcode in (Opcode.SEND, Opcode.RECV) and f["link"] >= config.links:
        return ErrorCode.LINK_INDEX, opcode, f
    if opcode in (Opcode.LOAD, Opcode.STORE) and f["flags"]["quant"] and not config.quant_formats:
        return ErrorCode.DMA_DESCRIPTOR, opcode, f     # no expander on this chip
    return ErrorCode.NONE, opcode, f


def vector_accesses(config, f):
    """The row ranges a legal VECTOR reads and writes: (a, b or None, dst, dst
    space "acc" or "vmem"), each range a (first, end) pair."""
    n, fl = f["rows"], f["flags"]
    a = (f["a_row"], f["a_row"] + n)
    b = None
    if VpuOp(f["op"]) in BINARY_VPU_OPS and fl["b_mode"] != BMode.SCALAR.value:
        b = (f["b_row"], f["b_row"] + (n if fl["b_mode"] == BMode.ROW.value else 1))
    written = config.cols if fl["transpose"] else n
    return a, b, (f["dst_row"], f["dst_row"] + written), "vmem" if fl["to_vmem"] else "acc"


def _vector_error(config, f):
    """VECTOR's static checks after the legality of its fields (docs/isa.md)."""
    n = f["rows"]
    if n == 0:
        return ErrorCode.ILLEGAL_INSTR
    if f["flags"]["transpose"] and n > config.vmem_row_elems:
        return ErrorCode.ILLEGAL_INSTR
    a, b, dst, space = vector_accesses(config, f)
    if space == "acc":
        # The rows written must be the rows read (in place) or apart from them.
        for r in (a, b):
            if r is not None and r[0] < dst[1] and dst[0] < r[1] and r != dst:
                return ErrorCode.ILLEGAL_INSTR
    if any(r is not None and r[1] > config.acc_rows for r in (a, b)) or \
            (space == "acc" and dst[1] > config.acc_rows):
        return ErrorCode.ACC_RANGE
    if space == "vmem" and dst[1] > config.vmem_rows:
        return ErrorCode.VMEM_RANGE
    return ErrorCode.NONE


def _reserved_set(fields):
    for name, value in fields.items():
        if isinstance(value, dict):
            if _reserved_set(value):
                return True
        elif name == "reserved" and value:
            return True
    return False


def _engine(opcode, f, config):
    if opcode is Opcode.SYNC:
        e = Engine(f["flags"]["engine"])
        return e if e in isa.engines_of(config) else None
    return isa.ENGINE_OF.get(opcode)


def _expand(config, stream, length):
    """One loop expander (`mxu.hdl.loop`) on a stream of (pc, word)."""
    mask = (1 << isa.INSTR_BITS) - 1
    for pc, word in stream:
        if word is not None and word & 0xF == Opcode.LOOP.value:
            f = isa.decode(word)[1]
            body = f["body"]
            if (f["count"] and 1 <= body <= config.loop_body_instrs and not any(f["deps"].values())
                    and not f["flags"] and not f["reserved"] and pc + 2 * body < length):
                items = [next(stream) for _ in range(2 * body)]
                pairs = [(items[2 * j][0], items[2 * j][1], items[2 * j + 1][1]) for j in range(body)]
                for i in range(f["count"]):
                    for ipc, instr, delta in pairs:
                        yield ipc, (instr + i * delta) & mask
                continue
        yield pc, word


def expand_loops(config, words):
    """(pc, word) of every instruction the controller sees, LOOPs expanded as the
    chip's two loop expanders in a row do (so loops nest two deep); then
    (len(words), None) for ever. An illegal LOOP is passed on as it is (the
    decoder rejects it)."""
    def fetched():
        yield from enumerate(words)
        while True:
            yield len(words), None
    stream = fetched()
    for _ in range(2):
        stream = _expand(config, stream, len(words))
    return stream


class IsaModel:
    """External memory, VMEM, accumulator and array state, and the engines.

    Parameters
    ----------
    config : ChipConfig
    ext_bytes : int or None
        Size of the modelled external memory (defaults to the config's).
    queue_depth : int
        Instructions each engine's queue holds (the RTL's ``config.cmd_queue_depth``).
    loopback : dict or None
        For SEND/RECV: ``{link: link}``, the link whose incoming bytes are
        what this chip sends on the key (one chip wired to itself, as the
        loopback tests wire the RTL). A RECV waits until its bytes are there.
    """

    def __init__(self, config, ext_bytes=None, queue_depth=None, loopback=None):
        self.config = config
        self.loopback = dict(loopback or {})
        self.link_bytes = {link: bytearray() for link in range(config.links)}
        self.dma = DmaModel(config, ext_bytes)
        self.queue_depth = queue_depth or config.cmd_queue_depth
        self.staged = []                                   # weight tiles waiting
        self.weights = np.zeros((config.rows, config.cols), np.float32)

    @property
    def ext(self):
        return self.dma.ext

    @property
    def vmem(self):
        return self.dma.vmem

    @property
    def acc(self):
        return self.dma.acc

    def run(self, program_bytes, base=0):
        """Run a program placed at `base`; returns a `ModelResult`."""
        words = [int.from_bytes(program_bytes[i:i + isa.INSTR_BYTES], "little")
                 for i in range(0, len(program_bytes), isa.INSTR_BYTES)]
        if base % isa.INSTR_BYTES or base + len(program_bytes) > self.ext.size:
            return ModelResult(ErrorCode.FETCH_ERROR, 0)
        queues = {e: [] for e in Engine}
        tokens = {name: 0 for pair in TOKEN_LINKS.values() for name in pair}
        result = ModelResult(ErrorCode.NONE, 0)
        stream = expand_loops(self.config, words)
        pc, word = next(stream)
        halted = False
        while True:
            progress = False
            if not halted:
                if word is None:
                    return ModelResult(ErrorCode.ILLEGAL_INSTR, pc)
                error, opcode, f = check_instruction(self.config, word)
                if error is not ErrorCode.NONE:
                    result.error, result.pc = error, pc
                    return result
                if opcode is Opcode.HALT:
                    halted, result.pc, progress = True, pc, True
                else:
                    queue = queues[_engine(opcode, f, self.config)]
                    if len(queue) < self.queue_depth:
                        queue.append((pc, opcode, f))
                        pc, word = next(stream)
                        progress = True
            for engine, queue in queues.items():
                while queue and self._can_pop(engine, queue[0][2], tokens):
                    ipc, opcode, f = queue.pop(0)
                    self._tokens(engine, f, tokens, "pop", -1)
                    error = self._execute(opcode, f, result)
                    if error is not ErrorCode.NONE:
                        result.error, result.pc = error, ipc
                        return result
                    if not self._tokens(engine, f, tokens, "push", +1):
                        result.error, result.pc = ErrorCode.TOKEN_OVERFLOW, ipc
                        return result
                    progress = True
            if halted and not any(queues.values()):
                return result
            if not progress:
                result.error = ErrorCode.DEADLOCK
                return result

    def _can_pop(self, engine, f, tokens):
        if f.get("link") is not None and engine is Engine.LOAD and not self._recv_ready(f):
            return False
        for side in ("prev", "next"):
            if f["deps"][f"pop_{side}"] and tokens[token_counters(engine, side, f)[1]] == 0:
                return False
        return True

    @staticmethod
    def _tokens(engine, f, tokens, kind, step):
        """Pop or push the instruction's tokens; False if a push overflows its
        counter (TOKEN_BITS wide, docs/isa.md)."""
        for side in ("prev", "next"):
            if f["deps"][f"{kind}_{side}"]:
                name = token_counters(engine, side, f)[kind == "pop"]
                if tokens[name] + step >= 1 << TOKEN_BITS:
                    return False
                tokens[name] += step
        return True

    def _recv_ready(self, f):
        """A RECV starts when its bytes are there, or at once if its descriptor
        fails (the DMA rejects it before any transfer)."""
        fl = f["flags"]
        d = Descriptor(dir=DmaDir.LOAD, space=DmaSpace(fl["space"]), ext_base=0,
                       rows=f["rows"], row_bytes=f["row_bytes"], ext_stride=f["row_bytes"],
                       chip_row=f["chip_row"], to_bf16=bool(fl["to_bf16"]), relu=bool(fl["relu"]))
        if check_descriptor(self.config, d) is not DmaError.OK:
            return True
        return len(self.link_bytes[f["link"]]) >= self._link_length(f)

    def _link_length(self, f):
        """Bytes a SEND/RECV moves: its rows' bytes in whole flits."""
        flit = self.config.link_flit_bytes
        return -(-f["rows"] * f["row_bytes"] // flit) * flit

    def _execute(self, opcode, f, result):
        if opcode in (Opcode.LOAD, Opcode.STORE):
            return self._dma(opcode, f, result)
        if opcode in (Opcode.SEND, Opcode.RECV):
            return self._link(opcode, f, result)
        if opcode is Opcode.LOADW:
            if self.staged:
                return ErrorCode.WEIGHT_OVERFLOW
            rows = self.vmem[f["vmem_row"]:f["vmem_row"] + f["k_rows"]]
            tile = np.zeros((self.config.rows, self.config.cols), np.float32)
            tile[:f["k_rows"]] = golden.bf16_to_f32(
                np.ascontiguousarray(rows).view(np.uint16)[:, :self.config.cols].copy())
            self.staged.append(tile)
        elif opcode is Opcode.MATMUL:
            return self._matmul(f, result)
        elif opcode is Opcode.VECTOR:
            self._vector(f, result)
        return ErrorCode.NONE

    def _vector(self, f, result):
        """VECTOR through the golden vector unit (`mxu.verif.vpu.vector_alu`)."""
        from mxu.verif.vpu import swap_pairs, vector_alu
        c = self.config
        (a0, a1), b, (d0, d1), space = vector_accesses(c, f)
        n = f["rows"]
        acc = self.acc.view(np.uint32)
        a = acc[a0:a1].copy()
        if f["flags"]["swap"]:
            a = swap_pairs(a)
        if b is None:
            bits = np.full((n, c.cols), f["imm"] if f["flags"]["b_mode"] == BMode.SCALAR.value
                           else 0, np.uint32)
        else:
            bits = np.broadcast_to(acc[b[0]:b[1]], (n, c.cols)).copy()
        out = vector_alu(np.full(n, f["op"]), a, bits)
        result.vector_rows += n
        if space == "acc":
            acc[d0:d1] = out
            return
        bf = golden.fp32_to_bf16(out)
        rows = np.zeros((d1 - d0, c.vmem_row_elems), np.uint16)
        if f["flags"]["transpose"]:
            rows[:, :n] = bf.T
        else:
            rows[:, :c.cols] = bf
        self.vmem.view(np.uint16)[d0:d1] = rows

    def _link(self, opcode, f, result):
        """SEND/RECV as a STORE/LOAD through a scratch external memory that
        holds the link's bytes (the RTL moves them through the DMA likewise)."""
        n = self._link_length(f)
        scratch = DmaModel(self.config, max(n, 1))
        scratch.vmem, scratch.acc = self.dma.vmem, self.dma.acc
        window = {"ext_addr": 0, "ext_stride": f["row_bytes"]}
        if opcode is Opcode.RECV:
            queue = self.link_bytes[f["link"]]
            got = bytes(queue[:n])          # short only for a descriptor that fails
            scratch.ext[:len(got)] = np.frombuffer(got, np.uint8)
            del queue[:n]
        error = self._dma(Opcode.LOAD if opcode is Opcode.RECV else Opcode.STORE,
                          {**f, **window}, result, scratch)
        if opcode is Opcode.SEND and error is ErrorCode.NONE:
            peer = self.loopback.get(f["link"])
            if peer is None:
                raise ValueError(f"link {f['link']} is not wired (loopback={self.loopback})")
            self.link_bytes[peer] += scratch.ext[:n].tobytes()
        return error

    def _dma(self, opcode, f, result, dma=None):
        flags = f["flags"]
        if flags.get("quant", 0) not in {q.value for q in QuantFormat}:
            return ErrorCode.DMA_DESCRIPTOR          # a format no chip expands
        d = Descriptor(dir=DmaDir.LOAD if opcode is Opcode.LOAD else DmaDir.STORE,
                       space=DmaSpace(flags["space"]), ext_base=f["ext_addr"], rows=f["rows"],
                       row_bytes=f["row_bytes"], ext_stride=f["ext_stride"],
                       chip_row=f["chip_row"], to_bf16=bool(flags["to_bf16"]),
                       relu=bool(flags["relu"]), format=QuantFormat(flags.get("quant", 0)))
        error = (dma or self.dma).execute(d)
        if error in (DmaError.SLVERR, DmaError.DECERR):
            return ErrorCode.AXI_ERROR
        if error is not DmaError.OK:
            return ErrorCode.DMA_DESCRIPTOR
        key = "read" if opcode is Opcode.LOAD else "written"
        result.dma_bytes[key] += d.units * d.row_bytes
        return ErrorCode.NONE

    def _matmul(self, f, result):
        c = self.config
        if f["flags"]["new_weights"]:
            if not self.staged:
                return ErrorCode.NO_WEIGHTS
            self.weights = self.staged.pop(0)
        m, mode = f["m_rows"], SeedMode(f["flags"]["seed_mode"])
        act_bits = np.ascontiguousarray(self.vmem[f["act_row"]:f["act_row"] + m]).view(np.uint16)
        A = golden.bf16_to_f32(act_bits[:, :c.rows].copy())
        acc_f32 = self.acc.view(np.float32)
        if mode is SeedMode.ZERO:
            seed = np.zeros((m, c.cols), np.float32)
        elif mode is SeedMode.ACC:
            seed = acc_f32[f["seed_row"]:f["seed_row"] + m].copy()
        else:
            seed = np.repeat(acc_f32[f["seed_row"]:f["seed_row"] + 1], m, axis=0)
        W = self.weights.astype(golden.bf16)
        rows_out = slice(f["out_row"], f["out_row"] + m)
        seed_lo = f["seed_row"]
        seed_hi = seed_lo + (m if mode is SeedMode.ACC else 1)
        overlap = mode is not SeedMode.ZERO and seed_lo < rows_out.stop and rows_out.start < seed_hi
        if not overlap or (mode is SeedMode.ACC and seed_lo == rows_out.start):
            acc_f32[rows_out] = golden.matmul(A.astype(golden.bf16), W, seed=seed, rows=c.rows)
        else:
            # The RTL reads each seed row after every earlier row's result is
            # written (its row interlock): so does the model, row by row.
            for i in range(m):
                s = seed_lo + (i if mode is SeedMode.ACC else 0)
                acc_f32[f["out_row"] + i] = golden.matmul(
                    A[i:i + 1].astype(golden.bf16), W, seed=acc_f32[s:s + 1].copy(), rows=c.rows)[0]
        result.matmul_rows += m
        return ErrorCode.NONE
