"""``mxu`` commands that check the chip against the golden model: ``demo``,
``matmul`` and ``mac``; and ``prove``, the formal proofs (`mxu.verif.formal`). They plug into the ``mxu`` command line through the
``mxu.commands`` entry-point group (docs/architecture.md)."""

import sys
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.hdl.mac import MAC_STAGES
from mxu.sim import Chip, simulate_mac
from mxu.sim.cli import (add_command, add_pe_flags, array_size, embed_texts, generate_text,
                         nonnegative_int, output_path, positive_int)
from mxu.sim.report import format_table

from . import golden, vectors

__all__ = ["register"]


def _classes(bits):
    exp = bits & 0x7F800000
    frac = bits & 0x007FFFFF
    return {
        "NaN": int(np.count_nonzero((exp == 0x7F800000) & (frac != 0))),
        "inf": int(np.count_nonzero((exp == 0x7F800000) & (frac == 0))),
        "subnormal": int(np.count_nonzero((exp == 0) & (frac != 0))),
        "zero": int(np.count_nonzero((exp == 0) & (frac == 0))),
    }


def _mac_batches(n, seed):
    rng = np.random.default_rng(seed)
    a, w = vectors.pairs(vectors.special_bf16(), vectors.special_bf16())
    acc = np.resize(vectors.special_fp32(), a.size)
    yield "special classes, pairwise", a, w, acc
    x, y = vectors.directed_add()
    one = np.full(x.size, 0x3F80, np.uint16)
    yield "fp32 ties/cancellation", one, one, x   # 1*1 + x exercises the adder corners
    yield "seeded random", *vectors.mac_vectors(rng, n)


def run_mac_table(n, seed, stages, simulator="verilator", out=None):
    out = out or sys.stdout
    rows, ok = [], True
    for name, a, w, acc in _mac_batches(n, seed):
        start = time.perf_counter()
        got = simulate_mac(a, w, acc, stages=stages, simulator=simulator)
        elapsed = time.perf_counter() - start
        want = golden.mac(a, w, acc)
        bad = int(np.count_nonzero(got != want))
        ok &= bad == 0
        c = _classes(got)
        rows.append([name, f"{a.size:,}", bad, c["NaN"], c["inf"], c["subnormal"], c["zero"],
                     f"{a.size / elapsed:,.0f}"])
    print(f"MacUnit(stages={stages}) on {simulator} vs NumPy float32 golden model (seed {seed})",
          file=out)
    print(format_table(["batch", "vectors", "mismatches", "NaN", "inf", "subnormal", "zero",
                        "vectors/s"], rows), file=out)
    print("bit-exact: " + ("yes" if ok else "NO, see the mismatches column"), file=out)
    return ok


def run_matmul_demo(M, K, N, config, seed, waves=None, fast_mac=False, out=None, **wave_options):
    """A random bf16 matmul on the simulated chip, checked bit-exact; prints stats."""
    from mxu.sim.runtime.matmul import check_matmul_fits
    out = out or sys.stdout
    check_matmul_fits(config, M, K, N)     # before the chip is built and the operands made
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    start = time.perf_counter()
    chip = Chip(config, waves=waves, fast_mac=fast_mac, **wave_options)
    built = time.perf_counter() - start
    start = time.perf_counter()
    C = chip.matmul(A, B)
    wall = time.perf_counter() - start
    want = golden.matmul(A, B, rows=config.rows)
    bad = int(np.count_nonzero(C.view(np.uint32) != want.view(np.uint32)))
    s = chip.last_stats
    rows = [
        ["chip", f"{config.rows}x{config.cols} array, mac_stages={config.mac_stages}, "
                 f"VMEM {config.vmem_bytes >> 10} KiB, accumulator {config.acc_bytes >> 10} KiB"],
        ["PE model", "fast MAC (C float32, same results and cycles)" if fast_mac
         else "RTL (gate-level fp32 datapath)"],
        ["matmul", f"C[{M}x{N}] = A[{M}x{K}] @ B[{K}x{N}], bf16 in, fp32 out"],
        ["cycles", f"{s.cycles:,} (ideal {s.ideal_cycles:,.0f})"],
        ["utilization", f"{100 * s.utilization:.1f} %"],
        ["DMA bytes", f"{s.dma_read_bytes:,} read, {s.dma_write_bytes:,} written"],
        ["stall cycles", ", ".join(f"{k} {v:,}" for k, v in s.stall_cycles.items())],
        ["instructions", f"{s.instructions:,}"],
        ["simulation", f"{wall:.2f} s, {s.cycles / wall:,.0f} cycles/s, "
                       f"{M * K * N / wall / 1e6:,.1f} M MAC/s (model load {built:.1f} s)"],
        ["bit-exact", "yes, every element equals the golden model" if bad == 0
         else f"NO: {bad} of {C.size} elements differ"],
    ]
    print(format_table(["", "mxu"], rows), file=out)
    if waves:
        print(f"waveform written to {waves}", file=out)
    return bad == 0


def cmd_demo(args):
    from mxu.sim.progress import set_mode
    from mxu.sim.runtime.matmul import check_matmul_fits
    if not args.quiet:
        # The tour's builds and generation take minutes: their progress shows
        # in a log too (plain lines), not only on a terminal.
        set_mode("plain")
    check_matmul_fits(ChipConfig(), args.m, args.k, args.n)
    ok_mac = run_mac_table(args.vectors, args.seed, ChipConfig().mac_stages)
    print()
    ok = run_matmul_demo(args.m, args.k, args.n, ChipConfig(), args.seed, fast_mac=not args.rtl)
    if not args.no_embed:
        print()
        print("all-MiniLM-L6-v2, every matmul on the chip (mxu embed):")
        embed_texts(DEMO_TEXTS, ChipConfig(), rtl=args.rtl)
    if not args.no_generate:
        print()
        print("SmolLM2-135M-Instruct, every matmul and layer op on the chip (mxu generate):")
        generate_text(DEMO_PROMPT, max_new_tokens=args.demo_tokens, rtl=args.rtl)
    return 0 if ok and ok_mac else 1


DEMO_PROMPT = "The capital of France is"
DEMO_TEXTS = ("The cat sits on the mat.", "A kitten is resting on a rug.",
              "Matrix multiplication on a systolic array.")


def cmd_matmul(args):
    config = ChipConfig(rows=args.rows, cols=args.cols)
    return 0 if run_matmul_demo(args.m, args.k, args.n, config, args.seed, args.waves,
                                not args.rtl, waves_from=args.waves_from,
                                waves_cycles=args.waves_cycles,
                                waves_depth=args.waves_depth) else 1


def cmd_mac(args):
    return 0 if run_mac_table(args.vectors, args.seed, args.stages, args.simulator) else 1


def _chip_flags(parser):
    parser.add_argument("--rows", type=array_size, default=ChipConfig().rows,
                        help="systolic array rows (the K depth of a weight tile)")
    parser.add_argument("--cols", type=array_size, default=ChipConfig().cols,
                        help="systolic array columns (the N width of a weight tile)")


def _shape_flags(parser, m=None, k=None, n=None):
    for flag, default, what in (("--m", m, "rows of A and C"), ("--k", k, "columns of A, rows of B"),
                                ("--n", n, "columns of B and C")):
        parser.add_argument(flag, type=positive_int, default=default, required=default is None,
                            help=what + (f" (default {default})" if default else ""))


def _common_flags(parser):
    parser.add_argument("--seed", type=nonnegative_int, default=1,
                        help="seed of the random operands")
    add_pe_flags(parser)


def register(sub):
    """Add ``demo``, ``matmul``, ``mac`` and ``prove`` to the ``mxu`` subcommand parser `sub`."""
    demo = add_command(sub, "demo", "the tour: the MacUnit and a matmul checked bit-exact "
                                    "against the golden model, then MiniLM embeddings and "
                                    "SmolLM2 text, all on the simulated chip",
                       "mxu demo --no-generate")
    demo.add_argument("--vectors", type=positive_int, default=200_000,
                      help="random MACs streamed through the RTL MacUnit")
    _shape_flags(demo, 128, 384, 384)
    _common_flags(demo)
    demo.add_argument("--no-embed", action="store_true",
                      help="skip the sentence-embedding part (all-MiniLM-L6-v2 on the chip)")
    demo.add_argument("--no-generate", action="store_true",
                      help="skip the text generation (SmolLM2-135M on the chip)")
    demo.add_argument("--demo-tokens", type=positive_int, default=6,
                      help="tokens the demo generates (default 6)")
    demo.set_defaults(func=cmd_demo, uses_cache=True)

    mm = add_command(sub, "matmul", "a random matmul on a simulated chip of any array size, "
                                    "checked bit-exact against the golden model",
                     "mxu matmul --m 64 --k 96 --n 48 --rows 8 --cols 8 --waves run.vcd")
    _shape_flags(mm)
    _chip_flags(mm)
    _common_flags(mm)
    mm.add_argument("--waves", metavar="FILE", type=output_path("--waves"),
                    help="record a waveform of the run (.vcd, or .fst: smaller; needs zlib1g-dev)")
    mm.add_argument("--waves-from", type=nonnegative_int, default=0, metavar="CYCLE",
                    help="first cycle of the run to record (default 0)")
    mm.add_argument("--waves-cycles", type=positive_int, metavar="N",
                    help="cycles to record (default: to the end of the run)")
    mm.add_argument("--waves-depth", type=positive_int, metavar="LEVELS",
                    help="hierarchy levels to record (default: all)")
    mm.set_defaults(func=cmd_matmul, uses_cache=True)

    mac = add_command(sub, "mac", "stream special and random multiply-adds through the RTL "
                                  "MacUnit, checked bit-exact against NumPy",
                      "mxu mac --vectors 100000 --stages 3")
    mac.add_argument("--vectors", type=positive_int, default=1_000_000,
                     help="number of random vectors (after the special classes)")
    mac.add_argument("--seed", type=nonnegative_int, default=1, help="seed of the random vectors")
    mac.add_argument("--stages", type=int, choices=list(MAC_STAGES), default=ChipConfig().mac_stages,
                     help="MacUnit pipeline depth")
    mac.add_argument("--simulator", default="verilator", choices=["verilator", "icarus", "amaranth"],
                     help="simulator to run the RTL on")
    mac.set_defaults(func=cmd_mac, uses_cache=True)

    from .formal.prove import add_parser
    add_parser(sub)
