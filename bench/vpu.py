"""Accuracy of the vector unit's functions (docs/vpu.md): max and mean ulp error
of `exp`, `reciprocal` and `rsqrt` against float64 references, on every
`--stride`-th fp32 bit pattern (stride 1: all 2**32 of them), and the share of
results that are not correctly rounded.

    python bench/vpu.py [--stride 97] [--rtl N] [--minilm]

`--rtl N` also runs N bit patterns spread evenly over all 2**32 through the RTL
`VectorLane` (Verilator) and reports mismatches against the golden model.
`--minilm` also runs all-MiniLM-L6-v2 on the sentences of bench/transformer.py
with the layer operations in their VPU form (the golden forward, NumPy) and
prints each sentence embedding's cosine to the float32 reference, beside the
host form's.
"""

import argparse
import time

import numpy as np

from mxu.sim.report import Results
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


def minilm_table(results):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from transformer import LONG, SHORT
    from mxu.sim.models.sentence import load_minilm
    from mxu.hdl import hostops
    from mxu.verif.transformer import golden_forward, reference_forward

    weights, tokenizer, _ = load_minilm()
    rows = []
    for text in [LONG] + SHORT:
        ids = tokenizer.encode(text).ids[:128]
        ids = np.asarray(ids)[None]
        mask = np.ones(ids.shape, bool)
        pooled = lambda x: hostops.l2_normalize(hostops.mean_pool(x, mask))[0]
        ref = pooled(reference_forward(weights, ids[0])[None])
        row = [text[:40] + ("..." if len(text) > 40 else ""), ids.shape[1]]
        for form in ("host", "vpu"):
            t = time.perf_counter()
            got = pooled(golden_forward(weights, ids, mask, rows=16, vector_ops=form))
            row += [f"{float(np.dot(got, ref)):.7f}", f"{time.perf_counter() - t:.1f} s"]
        rows.append(row)
    results.table("all-MiniLM-L6-v2, golden forward (16-row chip numerics): cosine of the "
                  "sentence embedding to the float32 reference",
                  ["sentence", "tokens", "host ops", "time", "VPU ops", "time"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=97,
                        help="check every STRIDE-th fp32 bit pattern (1: all of them)")
    parser.add_argument("--rtl", type=int, default=0, metavar="N",
                        help="also compare N patterns, spread over all 2**32, against the RTL lane")
    parser.add_argument("--minilm", action="store_true",
                        help="also the MiniLM accuracy with the layer ops in VPU form")
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
    results = Results("vpu")
    results.table(f"every {args.stride}th fp32 bit pattern in each function's domain "
                  f"(float64 reference; results beyond FLT_MAX must be inf)", header, rows)
    if args.minilm:
        minilm_table(results)
    results.write()


if __name__ == "__main__":
    main()
