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
from mxu.hdl.isa import Engine, ErrorCode, Opcode, SeedMode
from mxu.verif import golden
from mxu.verif.dma_model import Descriptor, DmaModel

__all__ = ["IsaModel", "ModelResult", "check_instruction", "expand_loops"]

_TOKENS = {  # (engine, "prev"/"next") -> token counter name
    (Engine.LOAD, "next"): ("l2c", "c2l"),      # push l2c, pop c2l
    (Engine.COMPUTE, "prev"): ("c2l", "l2c"),
    (Engine.COMPUTE, "next"): ("c2s", "s2c"),
    (Engine.STORE, "prev"): ("s2c", "c2s"),
}


@dataclass
class ModelResult:
    error: ErrorCode
    pc: int                      # instruction index of the error (or of HALT)
    matmul_rows: int = 0         # activation rows streamed (for utilisation)
    dma_bytes: dict = field(default_factory=lambda: {"read": 0, "written": 0})


def check_instruction(config, word):
    """(ErrorCode, opcode, fields) of one instruction word, from decoding and static
    checks alone (what the RTL checks before an instruction starts)."""
    try:
        opcode, f = isa.decode(word)
    except ValueError:
        return ErrorCode.ILLEGAL_INSTR, None, None
    deps = f["deps"]
    if _reserved_set(f):
        return ErrorCode.ILLEGAL_INSTR, opcode, f
    engine = _engine(opcode, f)
    if opcode is Opcode.HALT:
        bad = any(deps.values()) or f["flags"] != 0
    elif engine is None:
        bad = True
    else:
        bad = ((deps["pop_prev"] or deps["push_prev"]) and engine is Engine.LOAD) or \
              ((deps["pop_next"] or deps["push_next"]) and engine is Engine.STORE) or \
              (opcode is Opcode.LOADW and (deps["push_prev"] or deps["push_next"]))
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
    return ErrorCode.NONE, opcode, f


def _reserved_set(fields):
    for name, value in fields.items():
        if isinstance(value, dict):
            if _reserved_set(value):
                return True
        elif name == "reserved" and value:
            return True
    return False


def _engine(opcode, f):
    if opcode is Opcode.SYNC:
        e = f["flags"]["engine"]
        return Engine(e) if e <= Engine.STORE.value else None
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
    """

    def __init__(self, config, ext_bytes=None, queue_depth=None):
        self.config = config
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
        tokens = {"l2c": 0, "c2l": 0, "c2s": 0, "s2c": 0}
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
                    queue = queues[_engine(opcode, f)]
                    if len(queue) < self.queue_depth:
                        queue.append((pc, opcode, f))
                        pc, word = next(stream)
                        progress = True
            for engine, queue in queues.items():
                while queue and self._can_pop(engine, queue[0][2]["deps"], tokens):
                    ipc, opcode, f = queue.pop(0)
                    self._pop(engine, f["deps"], tokens)
                    error = self._execute(opcode, f, result)
                    if error is not ErrorCode.NONE:
                        result.error, result.pc = error, ipc
                        return result
                    self._push(engine, f["deps"], tokens)
                    progress = True
            if halted and not any(queues.values()):
                return result
            if not progress:
                result.error = ErrorCode.DEADLOCK
                return result

    @staticmethod
    def _can_pop(engine, deps, tokens):
        for side in ("prev", "next"):
            if deps[f"pop_{side}"] and tokens[_TOKENS[(engine, side)][1]] == 0:
                return False
        return True

    @staticmethod
    def _pop(engine, deps, tokens):
        for side in ("prev", "next"):
            if deps[f"pop_{side}"]:
                tokens[_TOKENS[(engine, side)][1]] -= 1

    @staticmethod
    def _push(engine, deps, tokens):
        for side in ("prev", "next"):
            if deps[f"push_{side}"]:
                tokens[_TOKENS[(engine, side)][0]] += 1

    def _execute(self, opcode, f, result):
        if opcode in (Opcode.LOAD, Opcode.STORE):
            return self._dma(opcode, f, result)
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
        return ErrorCode.NONE

    def _dma(self, opcode, f, result):
        flags = f["flags"]
        d = Descriptor(dir=DmaDir.LOAD if opcode is Opcode.LOAD else DmaDir.STORE,
                       space=DmaSpace(flags["space"]), ext_base=f["ext_addr"], rows=f["rows"],
                       row_bytes=f["row_bytes"], ext_stride=f["ext_stride"],
                       chip_row=f["chip_row"], to_bf16=bool(flags["to_bf16"]),
                       relu=bool(flags["relu"]))
        error = self.dma.execute(d)
        if error in (DmaError.SLVERR, DmaError.DECERR):
            return ErrorCode.AXI_ERROR
        if error is not DmaError.OK:
            return ErrorCode.DMA_DESCRIPTOR
        key = "read" if opcode is Opcode.LOAD else "written"
        result.dma_bytes[key] += d.rows * d.row_bytes
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
