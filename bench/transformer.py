"""all-MiniLM-L6-v2 on the simulated 16x16 chip: one 128-token input and a batch
of eight short sentences, with the layer ops on the host or on the chip's
vector unit, with the fast MAC model and all-RTL.

    .venv/bin/python bench/transformer.py [--no-rtl] [--vector-ops host,chip] [--no-handoffs]
                                          [--only-long] [--tokens N]

Prints chip cycles, utilization and MFU (model MACs / (cycles * 256): padding
is not model work, and the cycles include the vector unit's on a "chip" run)
by the chip's own counters, the vector unit's busy share (rows it took over
cycles), the programs run, the bytes the DMA read and wrote, wall seconds, simulated MAC/s, and the share of wall
time spent on the host (layer ops on a "host" run, transposes, uploads and
read-backs, compiling).
"""

import argparse

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import SentenceEncoder
from mxu.sim.report import Results

SHORT = ["The cat sits on the mat.", "A kitten is resting on a rug.",
         "Matrix multiplication on a systolic array.", "bf16 in, fp32 out.",
         "The weather is lovely today.", "Stock prices fell sharply.",
         "Where is the nearest train station?", "I like green tea."]
LONG = ("A tensor processing unit multiplies matrices with a systolic array: a grid of "
        "processing elements, each of which multiplies an activation by a stationary weight "
        "and adds the product to a partial sum flowing down its column. Weights load into "
        "shadow registers while the previous tile streams, so the array never waits. ") * 4


def inputs(encoder, tokens=128):
    """The long input (a real text cut to exactly `tokens` tokens) and the batch."""
    ids = encoder.tokenize([LONG])[0]
    sep = encoder.tokenizer.token_to_id("[SEP]")
    return [ids[:tokens - 1] + [sep]], encoder.tokenize(SHORT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-rtl", action="store_true", help="skip the all-RTL runs")
    parser.add_argument("--vector-ops", default="host,chip",
                        help="comma-separated backends of the layer ops: host, chip")
    parser.add_argument("--only-long", action="store_true", help="only the long input")
    parser.add_argument("--tokens", type=int, default=128,
                        help="tokens of the long input, 2 to 128 (results of another length "
                             "go to bench/results/transformer_<N>.json)")
    parser.add_argument("--no-handoffs", action="store_true",
                        help="every intermediate through external memory (docs/compiler.md)")
    args = parser.parse_args()
    if not 2 <= args.tokens <= 128:
        parser.error(f"--tokens must be 2 to 128, not {args.tokens}")
    rows = []
    for backend in args.vector_ops.split(","):
        for fast in (True,) if args.no_rtl else (True, False):
            chip = Chip(ChipConfig.preset("vpu" if backend == "chip" else "default"), fast_mac=fast,
                        handoffs=not args.no_handoffs)
            encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=chip, vector_ops=backend)
            long_ids, short_ids = inputs(encoder, args.tokens)
            cases = [(f"1 x {args.tokens} tokens", long_ids)]
            if not args.only_long:
                cases.append(("8 short sentences", short_ids))
            for name, ids in cases:
                encoder.encode_tokens(ids, show_progress_bar=False)
                s = encoder.last_stats
                rows.append([name, backend, "fast MAC" if fast else "RTL",
                             f"{s.model_macs / 1e9:.3f}", f"{s.cycles:,}",
                             f"{100 * s.utilization:.1f} %", f"{100 * s.mfu:.1f} %",
                             f"{100 * s.vector_busy:.1f} %", f"{s.programs}",
                             f"{s.dma_read_bytes / 1e6:.1f}", f"{s.dma_write_bytes / 1e6:.1f}",
                             f"{s.wall_seconds:.1f}", f"{s.macs / s.sim_seconds / 1e6:.1f}",
                             f"{100 * s.host_seconds / s.wall_seconds:.1f} %"])
    results = Results("transformer" if args.tokens == 128 else f"transformer_{args.tokens}")
    results.table("all-MiniLM-L6-v2 on the 16x16 chip (chip counters; MFU counts real tokens only)",
                  ["input", "layer ops", "PEs", "model GMAC", "chip cycles", "utilization", "MFU",
                   "VPU busy", "programs", "DMA MB in", "DMA MB out", "wall s", "sim M MAC/s",
                   "host share"], rows)
    results.write()


if __name__ == "__main__":
    main()
