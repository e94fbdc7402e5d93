"""Accuracy of the vector unit's functions (docs/vpu.md): max and mean ulp error
of `exp`, `reciprocal` and `rsqrt` against float64 references, on every
`--stride`-th fp32 bit pattern (stride 1: all 2**32 of them), and the share of
results that are not correctly rounded.

    python bench/vpu.py [--stride 97] [--rtl N]

`--rtl N` also runs N bit patterns spread evenly over all 2**32 through the RTL
`VectorLane` (Verilator) and reports mismatches against the golden model.
"""

import argparse
import time

import numpy as np

from mxu.sim.report import format_table
from mxu.verif.vpu import vpu_function

FLT_MAX = float(np.finfo(np.float32).max)

REFERENCES = {
    "exp": (np.exp, lambda v: np.isfinite(v)),
    "reciprocal": (lambda v: 1 / v, lambda v: np.isfinite(v) & (v != 0)),
    "rsqrt": (lambda v: 1 / np.sqrt(v), lambda v: np.isfinite(v) & (v > 0)),
}


def ulp_error(got_bits, reference):
    got = got_bits.view(np.float32).astype(np.float64)
    ulp = np.maximum(np.spacing(np.abs(reference.astype(np.float32))).astype(np.float64),
                     2.0 ** -149)
    return np.abs(got - reference) / ulp


def sweep(name, stride, chunk=1 << 24):
    """(inputs checked, max ulp, argmax input, sum of ulps, not correctly rounded,
    overflow results that are not inf) over the strided sweep, in chunks."""
    reference, domain = REFERENCES[name]
    worst, worst_x, total, count, wrong, bad_inf = 0.0, None, 0.0, 0, 0, 0
    for start in range(0, 1 << 32, chunk * stride):
        x = np.arange(start, min(start + chunk * stride, 1 << 32), stride,
                      dtype=np.uint64).astype(np.uint32)
        xf = x.view(np.float32)
        x = x[domain(xf)]
        with np.errstate(all="ignore"):
            ref = reference(x.view(np.float32).astype(np.float64))
        got = vpu_function(name, x)
        over = np.abs(ref) > FLT_MAX
        bad_inf += int(np.count_nonzero(got[over] & 0x7FFFFFFF != 0x7F800000))
        got, ref, x = got[~over], ref[~over], x[~over]
        err = ulp_error(got, ref)
        if err.size:
            i = int(np.argmax(err))
            if err[i] > worst:
                worst, worst_x = float(err[i]), float(x.view(np.float32)[i])
            total += float(err.sum())
            count += err.size
            wrong += int(np.count_nonzero(err > 0.5))
    return count, worst, worst_x, total / max(count, 1), wrong, bad_inf


def rtl_check(name, stride, n):
    from mxu.sim.backends.units import simulate_vpu_lane
    x = np.arange(0, 1 << 32, max(1, (1 << 32) // n), dtype=np.uint64).astype(np.uint32)[:n]
    op = {"exp": "exp", "reciprocal": "recip", "rsqrt": "rsqrt"}[name]
    return int(np.count_nonzero(simulate_vpu_lane(op, x) != vpu_function(name, x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=97,
                        help="check every STRIDE-th fp32 bit pattern (1: all of them)")
    parser.add_argument("--rtl", type=int, default=0, metavar="N",
                        help="also compare N patterns, spread over all 2**32, against the RTL lane")
    args = parser.parse_args()
    if args.stride < 1:
        parser.error("--stride must be >= 1")
    rows = []
    for name in REFERENCES:
        t = time.perf_counter()
        count, worst, worst_x, mean, wrong, bad_inf = sweep(name, args.stride)
        row = [name, f"{count:,}", f"{worst:.3f}", f"{worst_x:.7g}", f"{mean:.4f}",
               f"{100 * wrong / max(count, 1):.2f} %", bad_inf]
        if args.rtl:
            row.append(rtl_check(name, args.stride, args.rtl))
        row.append(f"{time.perf_counter() - t:.0f} s")
        rows.append(row)
    header = ["function", "inputs", "max ulp", "at x", "mean ulp", "> 0.5 ulp",
              "overflow not inf"]
    if args.rtl:
        header.append(f"RTL mismatches ({args.rtl:,} patterns)")
    header.append("time")
    print(f"every {args.stride}th fp32 bit pattern in each function's domain "
          f"(float64 reference; results beyond FLT_MAX must be inf)")
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
