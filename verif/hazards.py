"""A happens-before hazard checker for mxu programs (docs/compiler.md).

The ISA functional model runs each engine's head as soon as its tokens are
there, so a program whose tokens leave two engines unordered can still give
the right numbers there while the chip, whose engines overlap, races. This
checker finds such programs from the instruction stream alone:

* per engine, instructions start in order and complete in order;
* a push happens after its instruction completes, a pop before its instruction
  starts, and the k-th pop of a token counter pairs with its k-th push;
* two accesses to the same resource (a VMEM row, an accumulator row, two bytes
  of external memory) by different engines, at least one a write, must be
  ordered: the first completes before the second starts.

Accesses by one engine are ordered by the engine itself (in-order DMA, the
compute engine's row interlock). `races(config, program)` returns the unordered
pairs; an empty list means the program's outcome cannot depend on timing.
"""

from mxu.hdl.isa import TOKEN_LINKS, Engine, Opcode, SeedMode
from mxu.hdl.quant import QUANT_INFO, QuantFormat

from .isa_model import _engine, check_instruction, expand_loops, token_counters, vector_accesses

__all__ = ["races", "accesses"]

_ENGINES = tuple(Engine)
_CHAIN = {(e, phase): n for n, (e, phase) in
          enumerate((e, p) for e in _ENGINES for p in ("start", "complete"))}


def _issued(config, program):
    """(pc, opcode, fields) of every instruction the engines run, loops expanded."""
    code = program.to_bytes()
    words = [int.from_bytes(code[i:i + 16], "little") for i in range(0, len(code), 16)]
    out = []
    for pc, word in expand_loops(config, words):
        if word is None:
            break
        error, opcode, fields = check_instruction(config, word)
        if error.name != "NONE":
            raise ValueError(f"instruction {pc} is illegal ({error.name})")
        if opcode is Opcode.HALT:
            break
        out.append((pc, opcode, fields))
    return out


def accesses(opcode, f, config=None):
    """[(kind "r" or "w", resource)] of one instruction (VECTOR needs `config`)."""
    out = []
    if opcode is Opcode.VECTOR:
        a, b, dst, space = vector_accesses(config, f)
        for r in (a, b):
            if r is not None:
                out += [("r", ("acc", i)) for i in range(*r)]
        return out + [("w", (space, i)) for i in range(*dst)]
    if opcode in (Opcode.LOAD, Opcode.STORE):
        space = "acc" if f["flags"]["space"] else "vmem"
        chip = [(space, f["chip_row"] + i) for i in range(f["rows"])]
        ext = []
        # A quantized load's external units are its tile-blocks, one per
        # block of rows (docs/isa.md).
        quant = f["flags"].get("quant", 0)
        units = f["rows"] // QUANT_INFO[QuantFormat(quant)].block if quant else f["rows"]
        for i in range(units):
            a = f["ext_addr"] + i * f["ext_stride"]
            ext += [("ext", x) for x in range(a // 2, (a + f["row_bytes"] + 1) // 2)]
        written, read = (chip, ext) if opcode is Opcode.LOAD else (ext, chip)
        out += [("w", k) for k in written] + [("r", k) for k in read]
    elif opcode is Opcode.LOADW:
        out += [("r", ("vmem", f["vmem_row"] + i)) for i in range(f["k_rows"])]
    elif opcode is Opcode.MATMUL:
        m, mode = f["m_rows"], f["flags"]["seed_mode"]
        out += [("r", ("vmem", f["act_row"] + i)) for i in range(m)]
        if mode == SeedMode.ACC.value:
            out += [("r", ("acc", f["seed_row"] + i)) for i in range(m)]
        elif mode == SeedMode.BIAS.value:
            out.append(("r", ("acc", f["seed_row"])))
        out += [("w", ("acc", f["out_row"] + i)) for i in range(m)]
    return out


def _clocks(per):
    """Vector clocks of every instruction's start and completion (over the
    chains: each engine's starts and completions)."""
    pushers = {name: [] for pair in TOKEN_LINKS.values() for name in pair}
    for e in _ENGINES:
        for i, (_, _, f) in enumerate(per[e]):
            for side in ("prev", "next"):
                if f["deps"][f"push_{side}"]:
                    pushers[token_counters(e, side, f)[0]].append((e, i))
    popped = {name: 0 for name in pushers}
    start, done = {e: [] for e in _ENGINES}, {e: [] for e in _ENGINES}
    order, progress = [], True
    while progress:
        progress = False
        for e in _ENGINES:
            while len(start[e]) < len(per[e]):
                i = len(start[e])
                f = per[e][i][2]
                waits, take = [], {}
                for side in ("prev", "next"):
                    if f["deps"][f"pop_{side}"]:
                        counter = token_counters(e, side, f)[1]
                        k = popped[counter] + take.get(counter, 0)
                        take[counter] = take.get(counter, 0) + 1
                        if k >= len(pushers[counter]):
                            raise ValueError(f"{e.name} instruction {per[e][i][0]} pops {counter} "
                                             f"that nothing pushes")
                        waits.append(pushers[counter][k])
                if any(pi >= len(done[pe]) for pe, pi in waits):
                    break
                for counter, n in take.items():
                    popped[counter] += n
                vs = list(start[e][i - 1]) if i else [0] * len(_CHAIN)
                for pe, pi in waits:
                    vs = [max(a, b) for a, b in zip(vs, done[pe][pi])]
                vs[_CHAIN[(e, "start")]] = i + 1
                vc = [max(a, b) for a, b in zip(vs, done[e][i - 1])] if i else list(vs)
                vc[_CHAIN[(e, "complete")]] = i + 1
                start[e].append(vs)
                done[e].append(vc)
                order.append((e, i))
                progress = True
    stuck = [e.name for e in _ENGINES if len(start[e]) != len(per[e])]
    if stuck:
        raise ValueError(f"the program deadlocks: {', '.join(stuck)} wait for tokens forever")
    return start, order


def races(config, program, limit=5):
    """Up to `limit` unordered pairs of accesses in `program` (a `Program`):
    (resource, "write-then-read" or ..., first pc, first opcode, second pc,
    second opcode). Raises ValueError for illegal or deadlocking programs."""
    per = {e: [] for e in _ENGINES}
    for pc, opcode, f in _issued(config, program):
        per[_engine(opcode, f, config)].append((pc, opcode, f))
    start, order = _clocks(per)

    def before(x, y):   # x completes before y starts
        (ex, ix), (ey, iy) = x, y
        return start[ey][iy][_CHAIN[(ex, "complete")]] >= ix + 1

    last_write, last_read, found = {}, {}, []
    for e, i in order:
        pc, opcode, f = per[e][i]
        for kind, key in accesses(opcode, f, config):
            for other in _ENGINES:
                if other is e:
                    continue
                earlier = [("write", last_write.get((key, other)))]
                if kind == "w":
                    earlier.append(("read", last_read.get((key, other))))
                for what, x in earlier:
                    if x is not None and not before(x, (e, i)):
                        xpc, xop = per[other][x[1]][:2]
                        found.append((key, f"{what}-then-{'write' if kind == 'w' else 'read'}",
                                      xpc, xop.name, pc, opcode.name))
                        if len(found) >= limit:
                            return found
            (last_write if kind == "w" else last_read)[(key, e)] = (e, i)
    return found
