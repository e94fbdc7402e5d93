"""Fused epilogues: a layer op the vector unit applies to each group of a
matmul's output tiles before they are stored, while the array computes the
next group (docs/vpu.md, "Fused epilogues").

`Epilogue` says what (on `MatmulOp.epilogue`); the accumulator and VMEM
rows it needs are laid out by `epilogue_scratch` and its neighbours (for
`plan_op` and the segment's `_Ring`); `emit_epilogue` writes its VECTORs;
`FusedGroups` is the part of the matmul compiler's segment that hands groups
to the vector engine, loads residuals, stores results and paces the
instructions into the program (`Pending`).
"""

import bisect
from dataclasses import dataclass

from mxu.hdl.isa import Opcode, VpuOp, field_value

from .operands import Operand
from .program import Program
from .vector import Tiles, VectorEmitter, flag_instruction, tile_moves

__all__ = ["EPILOGUE_KINDS", "EPILOGUE_BUFFERS", "Epilogue", "epilogue_operands", "epilogue_scratch",
           "epilogue_param_rows", "epilogue_residual_rows", "epilogue_param_loads",
           "transpose_vmem_rows", "emit_epilogue", "Pending", "FusedGroups"]

EPILOGUE_KINDS = ("softmax", "add_layer_norm", "layer_norm", "gelu", "transpose")
# The compiler's own kind: no pass of its own, only the hand-off passes of a
# plain matmul whose result stays in VMEM (docs/compiler.md).
COPY = "copy"


def epilogue_operands(kind, M, N, cols, bias=True):
    """{operand name: (rows, cols)} an epilogue of `kind` on an M x N result
    reads (fp32); `bias`: whether a softmax has its bias row. A softmax
    without one needs N a multiple of `cols` (ValueError): the bias masks a
    partial tile's spare lanes."""
    if kind == "softmax" and not bias:
        if N % cols:
            raise ValueError(f"a softmax without a bias row (other) needs N ({N}) to be a "
                             f"multiple of the chip's cols ({cols})")
        return {}
    return {"softmax": {"other": (1, -(-N // cols) * cols)},
            "layer_norm": {"params": (3, N)},
            "add_layer_norm": {"other": (M, N), "params": (3, N)},
            "gelu": {}, "transpose": {}, COPY: {}}[kind]


@dataclass(frozen=True)
class Epilogue:
    """A layer op the vector unit applies to a matmul's fp32 result in the
    accumulator, group by group, before it is stored (docs/vpu.md, "Fused
    epilogues"): the results are those of the matmul to an fp32 tensor
    followed by the `VectorOp` of the same kind, bit for bit.

    kind : "softmax" (``softmax(r * scale + other)``: `other` is one bias row,
        ``count*cols`` wide, -inf past N, for every row; None when nothing is
        masked and N is a multiple of cols -- adding a row of zeros changes no
        result, see docs/vpu.md), "layer_norm"
        (`params`: gamma, beta, ones, 3 x N), "add_layer_norm"
        (``layer_norm(r + other)``: `other` the M x N fp32 residual), "gelu",
        "transpose" (the op's c is the bf16 ``(r * scale).T``, N x M: VECTOR
        transposes into VMEM, stored from there).
    extra : a second output besides the op's c (e.g. the bf16 copy of an fp32
        result), or None.
    """
    kind: str
    extra: Operand = None
    other: Operand = None
    params: Operand = None
    scale: float = 1.0
    eps: float = 0.0

    @property
    def row_wise(self):
        """Whether a row's result needs the whole row (the group is every N tile)."""
        return self.kind not in ("gelu", "transpose", COPY)

    @property
    def reads(self):
        return tuple(o for o in (self.other, self.params) if o is not None)

    def check(self, config, M, N):
        if not config.vpu:
            raise ValueError("a matmul epilogue needs a chip with the vector unit (vpu=True)")
        if self.kind not in EPILOGUE_KINDS + (COPY,):
            raise ValueError(f"Epilogue kind must be one of {EPILOGUE_KINDS}, not {self.kind!r}")
        want = epilogue_operands(self.kind, M, N, config.cols, self.other is not None)
        for name in ("other", "params"):
            operand = getattr(self, name)
            if (operand is None) != (name not in want):
                raise ValueError(f"a {self.kind} epilogue {'needs' if name in want else 'takes no'} "
                                 f"{name}")
            if operand is not None:
                operand.check(name, config.ext_mem_bytes)
                if (operand.rows, operand.cols) != want[name] or operand.dtype != "fp32":
                    raise ValueError(f"{name} must be {want[name][0]}x{want[name][1]} fp32, not "
                                     f"{operand.rows}x{operand.cols} {operand.dtype}")
        if self.extra is not None:
            if self.kind == "transpose":
                raise ValueError("a transpose epilogue has no extra output")
            self.extra.check("extra", config.ext_mem_bytes)
            if (self.extra.rows, self.extra.cols) != (M, N):
                raise ValueError(f"extra must be {M}x{N}, not {self.extra.rows}x{self.extra.cols}")


# Output buffers a fused segment cycles through: a third lets the array run a
# whole group ahead of the vector unit; the LayerNorms' wide rows (every N
# tile, and a residual per buffer) leave room for two.
EPILOGUE_BUFFERS = {"softmax": 3, "gelu": 3, "transpose": 3, "layer_norm": 2, "add_layer_norm": 2,
                    COPY: 3}


def epilogue_scratch(kind, count, G, Mb):
    """{region: (offset, rows)} of the vector unit's working rows for an
    epilogue on groups of G tiles of Mb rows (count: the op's N tiles), and
    their total. One such region serves a whole segment: the vector engine
    runs one group at a time."""
    sizes = {"softmax": (("spare", Mb), ("scratch", count * Mb)),
             "layer_norm": (("spare", Mb), ("sq", count * Mb)),
             "gelu": (("scratch", 4 * G * Mb + 4),), "transpose": (), COPY: ()}
    sizes["add_layer_norm"] = sizes["layer_norm"]
    layout, at = {}, 0
    for name, rows in sizes[kind]:
        layout[name] = (at, rows)
        at += rows
    return layout, at


def epilogue_param_rows(kind, count):
    """Accumulator rows of an epilogue's parameters: the softmax bias row or
    LayerNorm's gamma, beta and ones, a row per tile each."""
    return {"softmax": count, "layer_norm": 3 * count, "add_layer_norm": 3 * count}.get(kind, 0)


def epilogue_residual_rows(kind, count, Mb):
    """Accumulator rows of one residual buffer (add_layer_norm)."""
    return count * Mb if kind == "add_layer_norm" else 0


def epilogue_param_loads(ep, base, cols):
    """The LOADs (as keyword dicts) of an epilogue's parameter rows (softmax
    bias, LayerNorm gamma/beta/ones) into accumulator rows from `base`."""
    if ep.kind == "softmax" and ep.other is not None:
        count = ep.other.cols // cols
        return [dict(acc_row=base, ext_addr=ep.other.addr, rows=count, row_bytes=4 * cols,
                     ext_stride=4 * cols)]
    if ep.kind in ("layer_norm", "add_layer_norm"):
        count = -(-ep.params.cols // cols)
        loads = []
        for i in range(3):
            row = Operand(ep.params.addr + i * ep.params.stride, 1, ep.params.cols,
                          ep.params.stride, "fp32")
            loads += tile_moves(row, 0, 1, Tiles(base + i * count, 1, row.cols, cols))
        return loads
    return []


def transpose_vmem_rows(config, G, Mb):
    """VMEM rows a transpose epilogue's group lands in: per tile, a block of
    `cols` rows for every ``vmem_row_elems`` result rows."""
    return G * -(-Mb // config.vmem_row_elems) * config.cols


def emit_epilogue(config, ep, prog, x, params, scratch, residual, vmem=None, **first):
    """The VECTORs of `ep` on the group `x` (a `Tiles` in the accumulator,
    updated in place): `params`, `scratch` and `residual` are the accumulator
    rows of its parameters (`epilogue_param_rows`), working rows
    (`epilogue_scratch`) and the group's residual rows (add_layer_norm);
    `vmem`: the VMEM row a transpose's blocks start at (`transpose_vmem_rows`),
    None when they go nowhere but to hand-offs.
    `first`: flags of the first instruction."""
    count = -(-x.n // x.cols)
    layout, _ = epilogue_scratch(ep.kind, count, x.count, x.m)
    at = {name: scratch + off for name, (off, _) in layout.items()}
    emit = VectorEmitter(prog, config).begin(**first)
    if ep.scale != 1.0 and ep.kind in ("softmax", "transpose"):
        emit.map(VpuOp.MUL, x, x, scalar=ep.scale)     # x * 1 is x: no pass
    if ep.kind == "softmax":
        bias = Tiles(params, 1, x.n, x.cols) if ep.other is not None else None
        emit.softmax(x, bias, x, x.like(at["scratch"]), at["spare"])
    elif ep.kind == "gelu":
        emit.gelu(x, x, [x.like(at["scratch"] + i * (x.rows + 1) + 1) for i in range(4)], split=2)
    elif ep.kind == "transpose" and vmem is not None:
        E, blocks = config.vmem_row_elems, -(-x.m // config.vmem_row_elems)
        for t in range(x.count):
            for blk in range(blocks):
                emit.op(VpuOp.PASS, x.tile(t) + blk * E, min(E, x.m - blk * E),
                        vmem + (t * blocks + blk) * config.cols, to_vmem=True, transpose=True)
    elif ep.kind not in (COPY, "transpose"):   # only the caller's hand-off passes
        if ep.kind == "add_layer_norm":
            emit.map(VpuOp.ADD, x, x, b_row=residual)
        gamma, beta, ones = (Tiles(params + i * count, 1, x.n, x.cols) for i in range(3))
        # x - mean overwrites x: the same values as a separate matrix, in fewer rows.
        emit.layer_norm(x, gamma, beta, ep.eps, x, (x, x.like(at["sq"])), at["spare"], ones)
    return emit


class Pending:
    """A group's epilogue instructions on their way into the program: due
    between steps `first` and `last`, in proportion to their rows."""

    def __init__(self, program, first, last):
        self.words, self.text = program.words, program.text
        self.first, self.last, self.done = first, last, 0
        self.cumulative, total = [], 0
        for word in self.words:
            if word & 0xF == Opcode.VECTOR.value:
                total += field_value(word, Opcode.VECTOR, "rows")
            self.cumulative.append(total)
        self.total = total


class FusedGroups:
    """The fused-epilogue part of the compiler's segment (`_Segment` in
    `mxu.sim.compiler.matmul`, which provides ``config``, ``placed``,
    ``groups``, ``buffers``, ``ring``, ``W``, ``pending``, `locate` and
    `out_row`)."""

    def residual_loads(self, n):
        """The residual rows an add_layer_norm epilogue loads with step n's
        batch: group i's with its first step while i < buffers; else with
        step ``start + W``, whose loads wait for i's first MATMUL, which waits
        for the stores of group i - buffers, the last reader of that slot."""
        loads = []
        for m in (n, n - self.W):
            if m < 0:
                continue
            grp, _, _ = self.locate(m)
            p = self.placed[grp.op]
            ep = p.op.epilogue
            early = grp.index < self.buffers
            if (m != grp.start or ep.kind != "add_layer_norm" or (m == n) != early
                    or p.residual is not None):
                continue
            if n >= grp.end:
                raise AssertionError("a residual load lands after its group (plan_op prevents this)")
            loads += tile_moves(ep.other, grp.m0, grp.mrows,
                                self.epilogue_tiles(grp).like(self.residual_row(grp)))
        return loads

    def residual_row(self, grp):
        residual = self.placed[grp.op].residual
        if residual is not None:           # handed off: in its region for good
            return residual.residual_row(grp.m0)
        return self.ring.res_base + self.ring.res_slot * (grp.index % self.buffers)

    def epilogue_tiles(self, grp):
        """The group's output buffer as `Tiles` (tile stride Mb: a short last
        block computes its spare rows too, and stores only its own)."""
        p = self.placed[grp.op]
        n = p.op.N if p.op.epilogue.row_wise else grp.size * self.config.cols
        return Tiles(self.out_row(grp, 0), p.plan.Mb, n, self.config.cols)

    def epilogue_program(self, grp, push_store):
        """Group `grp`'s epilogue: its VECTORs (the first pops the compute
        token, the last pushes the store's), then its STOREs, then the store
        token that frees the buffer (`push_store`)."""
        cfg, p = self.config, self.placed[grp.op]
        op, ring = p.op, self.ring
        x = self.epilogue_tiles(grp)
        ep_prog = Program()
        # A transpose's VMEM slot, like the output buffer, was last read by the
        # stores of group i - buffers: they precede the store SYNC that group
        # i's first MATMUL waits for, and the vector engine waits for group i.
        vmem = ring.t_base + (grp.index % self.buffers) * ring.t_slot
        stored = op.c not in p.unstored
        emit = emit_epilogue(cfg, op.epilogue, ep_prog, x, p.ep_base, ring.scratch_base,
                             self.residual_row(grp), vmem if stored else None, pop_prev=True)
        for handoff, source in p.handoffs:
            for jj in range(grp.size):
                for off, rows, row in handoff.pieces(source, grp.m0, grp.mrows, grp.j0 + jj):
                    emit.op(VpuOp.PASS, x.tile(jj) + off, rows, row, to_vmem=handoff.to_vmem,
                            transpose=source.transposed)
        if emit.emitted:
            flag_instruction(ep_prog, len(ep_prog) - 1, push_next=True)
        else:
            # A copy epilogue with nothing to hand off in this group: the
            # vector engine passes the tokens on.
            ep_prog.sync("vector", pop_prev=True, push_next=True)
        if op.transposed and stored:
            self.transposed_stores(ep_prog, grp, x, vmem)
        elif op.transposed or not self.result_stores(ep_prog, grp, x, p.unstored):
            # Nothing left to store: the store engine takes the vector
            # engine's token all the same, to hand it on.
            ep_prog.sync("store", pop_prev=True, vector=True)
        if push_store:
            ep_prog.sync("store", push_prev=True)
        return ep_prog

    def result_stores(self, prog, grp, x, unstored=()):
        """The group's outputs to external memory, except the `unstored`
        ones (handed off, not needed there); whether any STORE was emitted."""
        op, c = self.placed[grp.op].op, self.config.cols
        first = dict(pop_prev=True, vector=True)
        for out in (o for o in op.writes if o not in unstored):
            for jj in range(grp.size):
                j = grp.j0 + jj
                prog.store(acc_row=x.tile(jj), ext_addr=out.addr + grp.m0 * out.stride + out.elem * j * c,
                           rows=grp.mrows, row_bytes=out.elem * min(c, op.N - j * c),
                           ext_stride=out.stride, to_bf16=out.dtype == "bf16", **first)
                first = {}
        return not first

    def transposed_stores(self, prog, grp, x, vmem):
        """The transposed blocks in VMEM (`emit_epilogue`) to rows j*cols.. of
        the op's c, columns m0.. ."""
        op, cfg = self.placed[grp.op].op, self.config
        c, E = cfg.cols, cfg.vmem_row_elems
        blocks = -(-x.m // E)
        first = dict(pop_prev=True, vector=True)
        for jj in range(grp.size):
            j = grp.j0 + jj
            for blk in range(-(-grp.mrows // E)):
                prog.store(vmem_row=vmem + (jj * blocks + blk) * c, rows=min(c, op.N - j * c),
                           row_bytes=2 * min(E, grp.mrows - blk * E),
                           ext_addr=op.c.addr + j * c * op.c.stride + 2 * (grp.m0 + blk * E),
                           ext_stride=op.c.stride, **first)
                first = {}

    def drain(self, prog, n=None):
        """Emit the pending epilogue instructions due by step n (all with
        None). A group's instructions are spread over the next group's steps
        in proportion to their rows, so that the vector engine's queue holds
        about the work the array does meanwhile: the chip issues in program
        order, and a full queue would hold up the array's instructions."""
        while self.pending:
            entry = self.pending[0]
            if n is None or n >= entry.last:
                due = len(entry.words)
            else:
                share = entry.total * (n - entry.first + 1) / (entry.last - entry.first + 1)
                due = bisect.bisect_right(entry.cumulative, share)
            if due > entry.done:
                prog.words += entry.words[entry.done:due]
                prog.text += entry.text[entry.done:due]
                entry.done = due
            if entry.done < len(entry.words):
                return
            self.pending.popleft()
