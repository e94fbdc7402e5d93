"""The matmul compiler: ``C = relu?(A @ B + bias)`` as an mxu program, with
double buffering so that the array streams while the next operands load and the
previous results store (docs/compiler.md).

Schedule. K is cut into ``rows``-deep tiles (t), N into ``cols``-wide tiles (j),
M into blocks of ``Mb`` rows (mb). N tiles are taken ``G`` at a time (a group):

    for mb: for group: for t: for j in group: LOADW W(t, j); MATMUL A(mb, t) -> C(mb, j)

Each step's weight tile lives in a ring of ``W`` VMEM slots; the activation tile
A(mb, t) (Mb rows) is loaded at its first use and stays in VMEM for the block;
the fp32 partial sums of a group stay in the accumulator (seeded from zero, a
bias row, or a bias block for t = 0, then from themselves) and are stored once
the last K tile is in. Output and bias blocks are double-buffered per group,
activation blocks per M block.

Tokens (docs/isa.md). Every push comes before its pop in program order, so the
program cannot deadlock on the engines' queues, and each pop waits for the
instruction that frees what it overwrites:

* load -> compute: the last load of step s pushes; LOADW s pops;
* compute -> load: MATMUL n pushes; the first load of step n + W pops (the ring
  slot it refills was read by step n; activation and bias buffers were last read
  at least W steps earlier, which `_plan` guarantees);
* compute -> store: the MATMUL of the last K tile pushes; its STORE pops;
* store -> compute: the last STORE of a group pushes; the first MATMUL of the
  group two later (which reuses its output buffer) pops.
"""

from dataclasses import dataclass

from mxu.hdl.isa import SeedMode

from .program import Program

__all__ = ["MatmulPlan", "plan_matmul", "compile_matmul"]

RING_SLOTS = 4


def _ceil(a, b):
    return -(-a // b)


@dataclass(frozen=True)
class MatmulPlan:
    """Tiling and on-chip placement of one matmul (all sizes in rows)."""
    M: int
    K: int
    N: int
    KT: int          # K tiles
    NT: int          # N tiles
    Mb: int          # rows per M block
    G: int           # N tiles per group
    W: int           # weight ring slots
    a_buffers: int   # activation block buffers (1: a single M block)
    vmem_rows: int   # VMEM rows used
    acc_rows: int    # accumulator rows used

    @property
    def steps(self):
        return _ceil(self.M, self.Mb) * self.KT * self.NT


def plan_matmul(config, M, K, N, bias="none"):
    """Choose Mb, G and W so that everything fits; ValueError if nothing does."""
    r, c = config.rows, config.cols
    KT, NT = _ceil(K, r), _ceil(N, c)
    bb = config.axi_data_bytes
    w_beats = r * _ceil(2 * c, bb)
    bias_rows = NT if bias == "row" else 0

    def fits(Mb, G, W):
        blocks = _ceil(M, Mb)
        a_buf = 1 if blocks == 1 else 2
        vmem = a_buf * Mb * KT + W * r
        acc = (4 if bias == "matrix" else 2) * G * Mb + bias_rows
        # Buffers freed W steps before their reuse: enough steps per block/group.
        spaced = blocks == 1 or KT * NT >= W
        spaced &= bias != "matrix" or KT * G >= W or _ceil(NT, G) * blocks <= 2
        ok = vmem <= config.vmem_rows and acc <= config.acc_rows and spaced
        return ok, a_buf, vmem, acc

    W = min(RING_SLOTS, KT * NT)
    Mb = M
    while Mb >= 1:
        act_beats = Mb * _ceil(2 * r, bb)
        G = min(NT, max(1, _ceil(act_beats, max(1, Mb - w_beats))))
        while G >= 1:
            ok, a_buf, vmem, acc = fits(Mb, G, W)
            if ok:
                return MatmulPlan(M, K, N, KT, NT, Mb, G, W, a_buf, vmem, acc)
            G -= 1
        Mb = Mb // 2 if Mb > 1 else 0
    raise ValueError(
        f"a {M}x{K} @ {K}x{N} matmul does not fit the chip: even one activation row of "
        f"K={K} needs {KT} VMEM rows next to a {W}-tile weight ring "
        f"(VMEM has {config.vmem_rows} rows of {config.vmem_row_elems} bf16)")


def compile_matmul(config, plan, *, a_addr, b_addr, c_addr, bias="none", bias_addr=0,
                   out_bf16=False, relu=False):
    """The `Program` for `plan` with operands at the given external addresses.

    A is M x K bf16 and B is K x N bf16, both row-major; C is M x N fp32 (bf16 if
    `out_bf16`), row-major. `bias` is "none", "row" (N fp32 at `bias_addr`) or
    "matrix" (M x N fp32 at `bias_addr`).
    """
    cfg, P = config, plan
    r, c = cfg.rows, cfg.cols
    M, K, N, KT, NT, Mb, G, W = P.M, P.K, P.N, P.KT, P.NT, P.Mb, P.G, P.W
    out_elem = 2 if out_bf16 else 4
    # VMEM: weight ring, then activation block buffers.
    ring_base, a_base = 0, W * r
    # Accumulator: output buffers (2 groups), bias buffers (matrix), bias rows.
    out_base = 0
    bias_block_base = 2 * G * Mb
    bias_row_base = (4 if bias == "matrix" else 2) * G * Mb

    steps = []
    groups = []           # (mb, first j, group size)
    for mb in range(_ceil(M, Mb)):
        m0, mrows = mb * Mb, min(Mb, M - mb * Mb)
        for g0 in range(0, NT, G):
            gg = len(groups)
            js = list(range(g0, min(NT, g0 + G)))
            groups.append((mb, js))
            for t in range(KT):
                for j in js:
                    steps.append(dict(mb=mb, m0=m0, mrows=mrows, gg=gg, js=js, t=t, j=j,
                                      first_group=(g0 == 0)))

    def a_row(s):
        return a_base + (s["mb"] % P.a_buffers) * Mb * KT + s["t"] * Mb

    def out_row(s):
        return out_base + ((s["gg"] % 2) * G + s["js"].index(s["j"])) * Mb

    def bias_block_row(s):
        return bias_block_base + ((s["gg"] % 2) * G + s["js"].index(s["j"])) * Mb

    p = Program()
    if bias == "row":
        full = N // c
        if full:
            p.load(acc_row=bias_row_base, ext_addr=bias_addr, rows=full, row_bytes=4 * c)
        if N % c:
            p.load(acc_row=bias_row_base + full, ext_addr=bias_addr + 4 * c * full, rows=1,
                   row_bytes=4 * (N % c))

    def batch(n):
        s = steps[n]
        t, j = s["t"], s["j"]
        loads = []
        k_rows = min(r, K - t * r)
        if s["first_group"] and j == s["js"][0]:
            loads.append(dict(vmem_row=a_row(s), ext_addr=a_addr + 2 * (s["m0"] * K + t * r),
                              rows=s["mrows"], row_bytes=2 * k_rows, ext_stride=2 * K))
        if bias == "matrix" and t == 0:
            ncols = min(c, N - j * c)
            loads.append(dict(acc_row=bias_block_row(s),
                              ext_addr=bias_addr + 4 * (s["m0"] * N + j * c), rows=s["mrows"],
                              row_bytes=4 * ncols, ext_stride=4 * N))
        ncols = min(c, N - j * c)
        loads.append(dict(vmem_row=ring_base + (n % W) * r,
                          ext_addr=b_addr + 2 * (t * r * N + j * c), rows=k_rows,
                          row_bytes=2 * ncols, ext_stride=2 * N))
        for i, load in enumerate(loads):
            p.load(**load, pop_next=(i == 0 and n >= W), push_next=(i == len(loads) - 1))

    S = len(steps)
    for n in range(min(W, S)):
        batch(n)
    for n, s in enumerate(steps):
        t, j, gg = s["t"], s["j"], s["gg"]
        k_rows = min(r, K - t * r)
        p.loadw(vmem_row=ring_base + (n % W) * r, k_rows=k_rows, pop_prev=True)
        if t > 0:
            seed, seed_row = SeedMode.ACC, out_row(s)
        elif bias == "row":
            seed, seed_row = SeedMode.BIAS, bias_row_base + j
        elif bias == "matrix":
            seed, seed_row = SeedMode.ACC, bias_block_row(s)
        else:
            seed, seed_row = SeedMode.ZERO, 0
        p.matmul(act_row=a_row(s), m_rows=s["mrows"], out_row=out_row(s), seed=seed,
                 seed_row=seed_row, new_weights=True,
                 pop_next=(t == 0 and j == s["js"][0] and gg >= 2),
                 push_prev=(n + W < S), push_next=(t == KT - 1))
        if t == KT - 1:
            ncols = min(c, N - j * c)
            p.store(acc_row=out_row(s), ext_addr=c_addr + out_elem * (s["m0"] * N + j * c),
                    rows=s["mrows"], row_bytes=out_elem * ncols, ext_stride=out_elem * N,
                    to_bf16=out_bf16, relu=relu, pop_prev=True,
                    push_prev=(j == s["js"][-1] and gg + 2 < len(groups)))
        if n + W < S:
            batch(n + W)
    p.halt()
    return p
