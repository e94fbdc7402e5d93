"""The ``mxu`` command line.

    mxu demo                  the main job on the simulated chip, checked bit-exact
    mxu mac --vectors N       stream N random MACs through the RTL MacUnit
"""

import argparse
import sys
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.synth.ecp5 import format_table
from mxu.verif import golden, vectors

from .units import simulate_mac


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


def run_mac_table(n, seed, stages, simulator="verilator", out=sys.stdout):
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


def cmd_demo(args):
    return 0 if run_mac_table(args.vectors, args.seed, ChipConfig().mac_stages) else 1


def cmd_mac(args):
    return 0 if run_mac_table(args.vectors, args.seed, args.stages, args.simulator) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mxu", description="mxu: a bf16/fp32 matrix unit")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job on the simulated chip")
    demo.add_argument("--vectors", type=int, default=1_000_000)
    demo.add_argument("--seed", type=int, default=1)
    demo.set_defaults(func=cmd_demo)
    mac = sub.add_parser("mac", help="stream random MACs through the RTL MacUnit")
    mac.add_argument("--vectors", type=int, default=1_000_000)
    mac.add_argument("--seed", type=int, default=1)
    mac.add_argument("--stages", type=int, default=ChipConfig().mac_stages)
    mac.add_argument("--simulator", default="verilator", choices=["verilator", "icarus", "amaranth"])
    mac.set_defaults(func=cmd_mac)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
