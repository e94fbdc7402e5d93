"""A pod of simulated chips on Ray (docs/pod.md): what its collectives and its
sharded work cost, in chip cycles and in wall time.

    .venv/bin/python bench/pod.py [--chips 4] [--quick] [--no-check]

Tables:

* ring all-reduce busbw against message size (NCCL's busbw,
  `mxu.sim.runtime.pod.busbw`: the algorithm's bytes, 2 (n-1)/n of the
  message, over the collective's cycles on the links, from the first flit
  sent to the last one received; "of a link" is `PodStats.busbw_fraction`,
  over what one link carries a cycle, at most one 64-byte flit);
* the same 1 MiB all-reduce against the links' bandwidth and latency;
* a K-sharded matmul against the number of chips: each chip's partial
  product, then the all-reduce of the partials (cycles of the slowest chip's
  matmul plus the all-reduce's whole programs);
* a tensor-parallel MiniLM layer (`TensorParallelLayer`) on 1, 2 and 4 chips
  at links of 16, 64 and 256 bytes a cycle, against one chip's fused layer;
* data-parallel all-MiniLM-L6-v2 on a corpus: sentences per million pod
  cycles (the busiest chip's) and per wall second, against the chips.

Every result is checked bit for bit against the golden pod form
(`golden.ring_reduce`) unless --no-check. The pod runs on the "pod" preset
(docs/pod.md): 16x16 vpu chips with a 64-byte bus.
"""

import argparse
import time

import numpy as np

from mxu.sim import Pod
from mxu.sim.report import Results
from mxu.verif import golden

KIB = 1024


def _message(pod, nbytes, rng):
    cols = pod.config.cols
    rows = nbytes // (4 * cols)
    return rng.standard_normal((pod.n_chips, rows, cols)).astype(np.float32)


def _all_reduce(pod, xs, check, bidirectional=False):
    start = time.perf_counter()
    out = pod.all_reduce(list(xs), bidirectional=bidirectional)
    wall = time.perf_counter() - start
    if check:
        want = golden.ring_reduce(xs, bidirectional=bidirectional)
        for i in range(pod.n_chips):
            golden.assert_bits_equal(out[i], want, f"chip {i}'s all-reduce")
    return pod.last_stats, wall


def _row(label, stats, wall):
    return [label, f"{stats.cycles:,}", f"{stats.link_cycles:,}", f"{stats.busbw:.1f}",
            f"{100 * stats.busbw_fraction:.1f} %", f"{wall:.2f}"]


HEADER = ["", "cycles", "link cycles", "busbw B/cycle", "of a link", "wall s"]


def sizes_table(results, chips, sizes, check):
    rng = np.random.default_rng(1)
    rows = []
    with Pod(chips) as pod:
        for nbytes in sizes:
            stats, wall = _all_reduce(pod, _message(pod, nbytes, rng), check)
            rows.append(_row(f"{nbytes // KIB} KiB", stats, wall))
    results.table(f"\nRing all-reduce on {chips} chips, 64 B/cycle links, latency 500 cycles",
                  ["message"] + HEADER[1:], rows)


def links_table(results, chips, nbytes, check):
    rng = np.random.default_rng(2)
    rows = []
    for bandwidth, latency, both in ((16, 500, False), (16, 500, True), (64, 500, False),
                                     (64, 500, True), (256, 500, False), (64, 100, False),
                                     (64, 2000, False)):
        with Pod(chips, link_bytes_per_cycle=bandwidth, link_latency=latency) as pod:
            stats, wall = _all_reduce(pod, _message(pod, nbytes, rng), check, both)
            rows.append(_row(f"{bandwidth} B/cycle, {latency}{', both ways' if both else ''}",
                             stats, wall))
    results.table(f"\nRing all-reduce of {nbytes // KIB} KiB on {chips} chips against the links "
                  f"(a link carries at most one 64-byte flit a cycle: 'of a link' is of "
                  f"min(bandwidth, 64 B), one direction; 'both ways': half the message each way)",
                  ["bandwidth, latency"] + HEADER[1:], rows)


def matmul_table(results, max_chips, M, K, N, check):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    rows = []
    counts = [c for c in (1, 2, 4, 8) if c <= max_chips]
    for chips in counts:
        with Pod(chips) as pod:
            start = time.perf_counter()
            C = pod.matmul(A, B, shard="k")
            wall = time.perf_counter() - start
            if check:
                parts = np.array_split(np.arange(K), chips)
                partials = [golden.matmul(A[:, p], B[p], rows=pod.config.rows) for p in parts]
                want = golden.ring_reduce_arrays(partials, pod.config.cols)
                golden.assert_bits_equal(C, want, "shard='k'")
            reduce = pod.last_stats
            total = pod.last_matmul_cycles + reduce.cycles
            rows.append([chips, f"{pod.last_matmul_cycles:,}", f"{reduce.cycles:,}",
                         f"{total:,}", f"{wall:.2f}"])
    base = int(rows[0][3].replace(",", ""))
    for row in rows:
        row.insert(4, f"{base / int(row[3].replace(',', '')):.2f}x")
    results.table(f"\nK-sharded matmul {M}x{K}x{N}: partial products, then their ring all-reduce",
                  ["chips", "matmul cycles", "all-reduce cycles", "total", "speed-up", "wall s"],
                  rows)


def tp_table(results, max_chips, tokens, check):
    """A MiniLM-sized encoder layer (hidden 384, 12 heads, FFN 1536; random
    weights) at `tokens` tokens, tensor-parallel on 1, 2 and 4 chips at
    three link bandwidths, against the same layer as one fused program on one
    chip (`ChipEncoderLayer`)."""
    from mxu.hdl.dtypes import bfloat16
    from mxu.sim import Chip
    from mxu.sim.models.encoder import ChipEncoderLayer, EncoderConfig, LayerWeights
    from mxu.sim.models.parallel import TensorParallelLayer
    from mxu.sim.runtime.pod import pod_config
    from mxu.sim.runtime.vector import softmax_bias
    from mxu.verif.transformer import golden_tensor_parallel_layer
    cfg = EncoderConfig(hidden=384, heads=12, ffn=1536, layers=1)
    w = LayerWeights.random(cfg, np.random.default_rng(4))
    x = np.random.default_rng(5).standard_normal((tokens, cfg.hidden)).astype(np.float32)
    mask = np.ones((1, tokens), bool)
    chip = Chip(pod_config(None, "ring"), fast_mac=True)
    fused = ChipEncoderLayer(chip, cfg, w)
    xd, xb = chip.upload(x), chip.upload(x, dtype=bfloat16)
    _, _, stats = fused(xd, xb, softmax_bias(chip, mask), 1, tokens, unmasked={0})
    rows = [["1 (one fused program)", "-", f"{stats.cycles:,}", "", "", "", "1.00x", ""]]
    counts = [c for c in (1, 2, 4, 8) if c <= max_chips]
    for chips in counts:
        for bandwidth in ((64,) if chips == 1 else (16, 64, 256)):
            with Pod(chips, link_bytes_per_cycle=bandwidth) as pod:
                layer = TensorParallelLayer(pod, cfg, w)
                start = time.perf_counter()
                out = layer(x, mask)
                wall = time.perf_counter() - start
                if check:
                    want = golden_tensor_parallel_layer(w, cfg, x, mask, pod.config.rows,
                                                        pod.config.cols, chips)
                    golden.assert_bits_equal(out, want, f"tensor-parallel layer on {chips}")
                ph = layer.last_phases
                reduce = sum(v for k, v in ph.items() if "-" in k)     # the collectives
                compute = layer.last_cycles - reduce
                rows.append([chips, bandwidth, f"{layer.last_cycles:,}", f"{compute:,}",
                             f"{reduce:,}", f"{100 * reduce / layer.last_cycles:.1f} %",
                             f"{stats.cycles / layer.last_cycles:.2f}x", f"{wall:.1f}"])
    results.table(f"\nTensor-parallel MiniLM layer, {tokens} tokens (speed-up against the fused "
                  f"one-chip layer)",
                  ["chips", "link B/cycle", "layer cycles", "chip phases", "collectives",
                   "share", "speed-up", "wall s"], rows)


def corpus(count, rng):
    """`count` short sentences made of a fixed vocabulary (5 to 14 words)."""
    words = ("the chip a pod ring link flit credit matrix unit systolic array vector lane "
             "token layer norm sum row column tile window cycle bus memory data model").split()
    return [" ".join(rng.choice(words, rng.integers(5, 15))).capitalize() + "."
            for _ in range(count)]


def corpus_table(results, max_chips, sentences, batch_size, check):
    """Data parallel: all-MiniLM-L6-v2 on a corpus, batches spread over the
    chips (`SentenceEncoder(pod=...)`); embeddings checked bit-identical to
    one chip's."""
    from mxu.sim.models.sentence import SentenceEncoder
    texts = corpus(sentences, np.random.default_rng(6))
    rows, first = [], None
    for chips in [c for c in (1, 2, 4, 8) if c <= max_chips]:
        with Pod(chips) as pod:
            enc = SentenceEncoder(pod=pod, batch_size=batch_size, vector_ops="chip")
            start = time.perf_counter()
            emb = enc.encode(texts, show_progress_bar=False)
            wall = time.perf_counter() - start
        if first is None:
            first = emb
        elif check:
            golden.assert_bits_equal(emb, first, f"{chips}-chip encode vs one chip")
        cycles = enc.last_pod_cycles
        rows.append([chips, f"{cycles:,}", f"{sentences / cycles * 1e6:.2f}",
                     f"{sentences / wall:.2f}", f"{100 * enc.last_stats.mfu:.1f} %"])
    results.table(f"\nData-parallel all-MiniLM-L6-v2: {sentences} sentences of 5-14 words, "
                  f"batches of {batch_size} (bit-identical to one chip)",
                  ["chips", "pod cycles", "sentences / M cycles", "sentences / wall s", "MFU"],
                  rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="smaller messages and matmuls")
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    check = not args.no_check
    sizes = [16 * KIB, 64 * KIB] if args.quick else [16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB]
    results = Results("pod")
    sizes_table(results, args.chips, sizes, check)
    links_table(results, args.chips, 64 * KIB if args.quick else 1024 * KIB, check)
    shape = (64, 256, 64) if args.quick else (256, 2048, 256)
    matmul_table(results, args.chips, *shape, check)
    tp_table(results, args.chips, 32 if args.quick else 128, check)
    corpus_table(results, args.chips, 8 if args.quick else 32, 4 if args.quick else 8, check)
    results.write()


if __name__ == "__main__":
    main()
