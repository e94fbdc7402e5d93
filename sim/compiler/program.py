"""The assembler: build an mxu program in Python, one method per instruction.

>>> p = Program()
>>> p.load(vmem_row=0, ext_addr=0x1000, rows=16, row_bytes=32, ext_stride=768, push_next=True)
>>> p.loadw(vmem_row=0, k_rows=16, pop_prev=True)
>>> p.matmul(act_row=16, m_rows=128, out_row=0, new_weights=True, push_next=True)
>>> p.store(acc_row=0, ext_addr=0x8000, rows=128, row_bytes=64, ext_stride=64, pop_prev=True)
>>> p.halt()
>>> image = p.to_bytes()

Encodings come from `mxu.hdl.isa`, the single definition the decoder also uses.
Dependency flags are keyword arguments on every method: ``pop_prev``,
``pop_next``, ``push_prev``, ``push_next`` (see docs/isa.md for the engines'
neighbours). On a chip with the vector unit, ``vector=True`` on a compute
instruction (LOADW, MATMUL, SYNC "compute") takes its *next* tokens from and
gives them to the vector engine instead of the store engine, and on a store
instruction (STORE, SYNC "store") its *prev* tokens:

>>> p.matmul(act_row=0, m_rows=16, out_row=0, push_next=True, vector=True)
>>> p.vector("exp", a_row=0, rows=16, dst_row=0, pop_prev=True, push_next=True)
>>> p.store(acc_row=0, ext_addr=0x8000, rows=16, row_bytes=64, pop_prev=True, vector=True)
"""

import numpy as np

from mxu.hdl import isa
from mxu.hdl.isa import BMode, Engine, Opcode, SeedMode, VpuOp
from mxu.hdl.quant import QuantFormat, quant_format

__all__ = ["Program", "FrozenProgram"]

_DEP_NAMES = ("pop_prev", "pop_next", "push_prev", "push_next")
_DEP_SET = frozenset(_DEP_NAMES)


class _Nested:
    """A LOOP body's instruction in a listing, formatted (indented) when read."""
    __slots__ = ("entry",)

    def __init__(self, entry):
        self.entry = entry


def _render(entry):
    if isinstance(entry, _Nested):
        return f"  {_render(entry.entry)}"
    if not isinstance(entry, tuple):
        return entry
    opcode, fields, deps = entry
    shown = ", ".join(f"{k}={v}" for k, v in fields.items())
    flags = " ".join(k for k, v in deps.items() if v)
    return f"{opcode.name} {shown}" + (f" [{flags}]" if flags else "")


class Listing(list):
    """A program's text, one string per instruction, made when it is read: a
    model's programs hold hundreds of thousands of instructions, and formatting
    each as it is emitted cost seconds that only an error message or a profile
    ever looks at. Slices and ``+=`` move the unformatted entries."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Listing(list.__getitem__(self, index))
        return _render(list.__getitem__(self, index))

    def __iter__(self):
        return map(_render, list.__iter__(self))

    def entry(self, index):
        """Entry `index` unformatted: to move it into another listing."""
        return list.__getitem__(self, index)

    def extend(self, other):
        list.extend(self, list.__iter__(other) if isinstance(other, Listing) else other)

    def __iadd__(self, other):
        self.extend(other)
        return self

    def __repr__(self):
        return repr(list(self))

    def __eq__(self, other):
        return list(self) == list(other)

    __hash__ = None


# Words already packed, by their fields: the compiler builds many steps'
# instructions more than once (a LOOP's iterations to find its deltas, then
# its body), and looking a word up costs a fraction of packing it again.
_WORDS = {}
_WORDS_HELD = 1 << 17


def _encode(opcode, deps, fields, key=None):
    """`isa.encode` of an instruction, memoized (`_WORDS`) when its values
    can be a key. `key`: a tuple of the instruction's values made by its
    method (the array's instructions, most of a compiled program's, make
    theirs without walking the fields), its first item a string of its own."""
    if key is None:
        key = (opcode, tuple(deps.items()),
               tuple([(k, tuple(v.items()) if isinstance(v, dict) else v)
                      for k, v in fields.items()]))
    else:
        key = (key, tuple(deps.items()))
    try:
        word = _WORDS.get(key)
    except TypeError:       # an unhashable value: packed (or refused) as given
        key = word = None
    if word is None:
        word = isa.encode(opcode, deps={k: int(bool(v)) for k, v in deps.items()}, **fields)
        if key is not None:
            if len(_WORDS) >= _WORDS_HELD:
                _WORDS.clear()
            _WORDS[key] = word
    return word


class _Image:
    """What `Program` and `FrozenProgram` derive from their `to_bytes` and `text`."""

    __slots__ = ()

    def to_array(self):
        return np.frombuffer(self.to_bytes(), np.uint8)

    def listing(self):
        return "\n".join(f"{i:5d}  {t}" for i, t in enumerate(self.text))


class Program(_Image):
    """A list of encoded instructions; `to_bytes` gives the image the chip fetches."""

    def __init__(self):
        self.words = []
        self.text = Listing()

    def __len__(self):
        return len(self.words)

    def _emit(self, opcode, deps, key=None, **fields):
        if not _DEP_SET.issuperset(deps):
            raise TypeError(f"unknown dependency flags {sorted(set(deps) - _DEP_SET)}")
        word = _encode(opcode, deps, fields, key)
        self.words.append(word)
        self.text.append((opcode, fields, deps))
        return self

    def load(self, *, ext_addr, rows, row_bytes, ext_stride=None, vmem_row=None, acc_row=None,
             format=QuantFormat.NONE, **deps):
        """LOAD rows external rows into VMEM (`vmem_row`) or the accumulator (`acc_row`);
        with a `format`, `rows` weight rows expanded from tile-blocks of `row_bytes`
        (docs/memory.md, "Quantized loads")."""
        space, row = self._space(vmem_row, acc_row)
        plain = format is None or format is QuantFormat.NONE or format in (0, "NONE")
        flags = {"space": space, **({} if plain else {"quant": quant_format(format).value})}
        return self._emit(Opcode.LOAD, deps, flags=flags, ext_addr=ext_addr,
                          ext_stride=row_bytes if ext_stride is None else ext_stride,
                          chip_row=row, rows=rows, row_bytes=row_bytes)

    def store(self, *, ext_addr, rows, row_bytes, ext_stride=None, vmem_row=None, acc_row=None,
              to_bf16=False, relu=False, vector=False, **deps):
        """STORE rows on-chip rows to external memory (fp32 -> bf16 and ReLU optional)."""
        space, row = self._space(vmem_row, acc_row)
        return self._emit(Opcode.STORE, deps,
                          flags={"space": space, "to_bf16": int(to_bf16), "relu": int(relu),
                                 "vector": int(vector)},
                          ext_addr=ext_addr,
                          ext_stride=row_bytes if ext_stride is None else ext_stride,
                          chip_row=row, rows=rows, row_bytes=row_bytes)

    def send(self, *, link, rows, row_bytes, vmem_row=None, acc_row=None, to_bf16=False,
             relu=False, vector=False, **deps):
        """SEND rows on-chip rows out on link `link` (a STORE's options; docs/pod.md)."""
        space, row = self._space(vmem_row, acc_row)
        return self._emit(Opcode.SEND, deps,
                          flags={"space": space, "to_bf16": int(to_bf16), "relu": int(relu),
                                 "vector": int(vector)},
                          link=link, chip_row=row, rows=rows, row_bytes=row_bytes)

    def recv(self, *, link, rows, row_bytes, vmem_row=None, acc_row=None, **deps):
        """RECV: the next rows rows arriving on link `link` into VMEM or the accumulator."""
        space, row = self._space(vmem_row, acc_row)
        return self._emit(Opcode.RECV, deps, flags={"space": space}, link=link, chip_row=row,
                          rows=rows, row_bytes=row_bytes)

    def loadw(self, *, vmem_row, k_rows, vector=False, **deps):
        """LOADW: stage the weight tile in VMEM rows vmem_row..vmem_row+k_rows-1."""
        return self._emit(Opcode.LOADW, deps, ("LOADW", vmem_row, k_rows, int(vector)),
                          flags={"vector": int(vector)}, vmem_row=vmem_row, k_rows=k_rows)

    def matmul(self, *, act_row, m_rows, out_row, seed=SeedMode.ZERO, seed_row=0,
               new_weights=False, vector=False, **deps):
        """MATMUL m_rows activation rows into accumulator rows out_row.. (see docs/isa.md)."""
        if not isinstance(seed, SeedMode):     # (SeedMode(member) is slow)
            seed = SeedMode[seed.upper()] if isinstance(seed, str) else SeedMode(seed)
        key = ("MATMUL", act_row, m_rows, out_row, seed._value_, seed_row, int(new_weights),
               int(vector))
        return self._emit(Opcode.MATMUL, deps, key,
                          flags={"seed_mode": seed, "new_weights": int(new_weights),
                                 "vector": int(vector)},
                          act_row=act_row, m_rows=m_rows, out_row=out_row, seed_row=seed_row)

    def sync(self, engine, vector=False, **deps):
        """SYNC on `engine` ("load", "compute", "store" or "vector"): tokens only."""
        engine = Engine[engine.upper()] if isinstance(engine, str) else Engine(engine)
        return self._emit(Opcode.SYNC, deps, flags={"engine": engine, "vector": int(vector)})

    def vector(self, op, *, a_row, rows, dst_row, b_row=None, broadcast=False, scalar=None,
               to_vmem=False, transpose=False, swap=False, **deps):
        """VECTOR: ``dst[dst_row + i] = op(acc[a_row + i], b_i)`` for i < rows
        (docs/vpu.md). `op` is a `VpuOp` or its name ("add", "exp", "rsum", ...).
        ``b_i`` is accumulator row ``b_row + i``, or row `b_row` for every i with
        `broadcast`, or the fp32 number `scalar` in every lane; unary ops take
        none. `to_vmem` writes bf16 VMEM rows, `transpose` their columns.
        `swap` reads lanes (2i, 2i+1) of ``a`` as (-a[2i+1], a[2i]) (RoPE)."""
        op = VpuOp[op.upper()] if isinstance(op, str) else VpuOp(op)
        if scalar is not None and b_row is not None:
            raise TypeError("give at most one of b_row and scalar")
        if broadcast and b_row is None:
            raise TypeError("broadcast needs b_row")
        mode = BMode.SCALAR if scalar is not None else (
            BMode.BROADCAST if broadcast else BMode.ROW)
        imm = 0 if scalar is None else int(np.float32(scalar).view(np.uint32))
        return self._emit(Opcode.VECTOR, deps,
                          flags={"b_mode": mode, "to_vmem": int(to_vmem),
                                 "transpose": int(transpose), "swap": int(swap)},
                          op=op, a_row=a_row, b_row=b_row or 0, dst_row=dst_row, rows=rows,
                          imm=imm)

    def halt(self):
        return self._emit(Opcode.HALT, {})

    def loop(self, count, body, deltas):
        """LOOP: issue ``body.words[j] + i * deltas[j]`` for i = 0..count-1 (the
        loop expander, docs/isa.md). `body` is a `Program`; `deltas` one integer
        per body instruction (negative steps are fine: sums are modulo 2^128)."""
        if len(deltas) != len(body):
            raise ValueError(f"a loop body of {len(body)} instructions needs as many deltas, "
                             f"not {len(deltas)}")
        mask = (1 << isa.INSTR_BITS) - 1
        self._emit(Opcode.LOOP, {}, count=count, body=len(body))
        for word, entry, delta in zip(body.words, list.__iter__(body.text), deltas):
            self.words += [word, delta & mask]
            self.text += [_Nested(entry), "  (delta)"]
        return self

    def loop_between(self, count, first, second):
        """LOOP over `count` iterations whose first two are the `Program`s
        `first` and `second` (the same instructions, fields moved by a constant
        step): the deltas are their differences."""
        if len(first) != len(second):
            raise ValueError("both iterations of a loop must have the same instructions")
        return self.loop(count, first, [b - a for a, b in zip(first.words, second.words)])

    def extend(self, other):
        """Append the instructions of `other`."""
        self.words += other.words
        self.text += other.text
        return self

    def concat(self, other):
        """A new program: these instructions, then those of `other`."""
        return Program().extend(self).extend(other)

    def raw(self, word, note="raw"):
        """Append an arbitrary 128-bit word (for testing the decoder's error paths)."""
        self.words.append(int(word))
        self.text.append(note)
        return self

    @staticmethod
    def _space(vmem_row, acc_row):
        if (vmem_row is None) == (acc_row is None):
            raise TypeError("give exactly one of vmem_row and acc_row")
        return (0, vmem_row) if acc_row is None else (1, acc_row)

    def to_bytes(self):
        return b"".join(w.to_bytes(isa.INSTR_BYTES, "little") for w in self.words)

    def frozen(self):
        """This program as a `FrozenProgram`: its image alone."""
        return FrozenProgram(self.to_bytes())


def _render_word(word):
    """An instruction's listing line from its word: the layout's fields, but
    the opcode, the reserved bits and the dependency flags (shown as
    ``[flags]`` as `Program` does)."""
    try:
        opcode, fields = isa.decode(word)
    except ValueError as error:
        return f"raw {word:#034x} ({error})"

    shown = {}
    for name, value in fields.items():
        if isinstance(value, dict):     # flag structs: the flags that are set
            value = {k: v for k, v in value.items() if v and k != "reserved"}
        if name not in ("opcode", "deps", "reserved") and value != {}:
            shown[name] = value
    return _render((opcode, shown, fields.get("deps", {})))


class _WordListing:
    """A `FrozenProgram`'s listing, each line rendered from its word when read
    as `Program` lists it: a LOOP's body indented (two spaces a level), each
    body word followed by its delta."""

    def __init__(self, program):
        self._words = program.words
        # Per word: 2 x its LOOP depth, plus 1 for a delta. An inner LOOP's
        # words are an outer body's, each followed by its outer delta
        # (docs/isa.md, "Loops nest two deep"): its pairs are 2 words apart.
        self._kinds = kinds = bytearray(len(program))
        for i, word in enumerate(self._words):
            if kinds[i] in (0, 2) and word & 0xF == Opcode.LOOP.value:
                inner, stride = kinds[i] + 2, kinds[i] // 2 + 1
                body = isa.field_value(word, Opcode.LOOP, "body")
                end = min(len(kinds), i + 1 + stride * 2 * body)
                for first, kind in ((i + stride, inner), (i + 2 * stride, inner + 1)):
                    kinds[first:end:2 * stride] = bytes([kind]) * len(range(first, end, 2 * stride))

    def __len__(self):
        return len(self._kinds)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        depth, delta = divmod(self._kinds[index], 2)
        return "  " * depth + ("(delta)" if delta else _render_word(self._words[index]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class FrozenProgram(_Image):
    """A compiled program held for reuse (the runtime's program cache,
    docs/runtime.md): its image, 16 bytes an instruction, where a `Program`
    also holds each instruction's fields for its listing (some 400 bytes an
    instruction). `words`, `text`, `listing` and `to_bytes` read as a
    `Program`'s; the listing is rendered from the words (every field of the
    layout, LOOP bodies not indented), so it names the same values."""

    __slots__ = ("_image",)

    def __init__(self, image):
        if len(image) % isa.INSTR_BYTES:
            raise ValueError(f"a program image is whole {isa.INSTR_BYTES}-byte instructions, "
                             f"not {len(image)} bytes")
        self._image = bytes(image)

    def __len__(self):
        return len(self._image) // isa.INSTR_BYTES

    @property
    def words(self):
        return _Words(self._image, isa.INSTR_BYTES)

    @property
    def text(self):
        return _WordListing(self)

    def to_bytes(self):
        return self._image


class _Words:
    """A `FrozenProgram`'s words as a read-only sequence of integers."""

    __slots__ = ("_image", "_n")

    def __init__(self, image, n):
        self._image, self._n = image, n

    def __len__(self):
        return len(self._image) // self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("program word index out of range")
        return int.from_bytes(self._image[index * self._n:(index + 1) * self._n], "little")

    def __iter__(self):
        n = self._n
        return (int.from_bytes(self._image[i:i + n], "little")
                for i in range(0, len(self._image), n))
