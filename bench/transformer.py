"""all-MiniLM-L6-v2 on the simulated 16x16 chip: one 128-token input and a batch
of eight short sentences, with the fast MAC model and all-RTL.

    .venv/bin/python bench/transformer.py [--no-rtl]

Prints chip cycles, utilization and MFU (model MACs / (cycles * 256): padding
is not model work) by the chip's own counters, wall seconds, simulated MAC/s,
and the share of wall time spent in host operations (softmax, LayerNorm, GELU,
residual adds, transposes, uploads and read-backs).
"""

import argparse

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import SentenceEncoder
from mxu.sim.report import format_table

SHORT = ["The cat sits on the mat.", "A kitten is resting on a rug.",
         "Matrix multiplication on a systolic array.", "bf16 in, fp32 out.",
         "The weather is lovely today.", "Stock prices fell sharply.",
         "Where is the nearest train station?", "I like green tea."]
LONG = ("A tensor processing unit multiplies matrices with a systolic array: a grid of "
        "processing elements, each of which multiplies an activation by a stationary weight "
        "and adds the product to a partial sum flowing down its column. Weights load into "
        "shadow registers while the previous tile streams, so the array never waits. ") * 4


def inputs(encoder):
    """The 128-token input (a real text cut to exactly 128 tokens) and the batch."""
    ids = encoder.tokenize([LONG])[0]
    sep = encoder.tokenizer.token_to_id("[SEP]")
    return [ids[:127] + [sep]], encoder.tokenize(SHORT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-rtl", action="store_true", help="skip the all-RTL runs")
    args = parser.parse_args()
    rows = []
    for fast in (True,) if args.no_rtl else (True, False):
        encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=Chip(ChipConfig(), fast_mac=fast))
        long_ids, short_ids = inputs(encoder)
        for name, ids in (("1 x 128 tokens", long_ids), ("8 short sentences", short_ids)):
            encoder.encode_tokens(ids, show_progress_bar=False)
            s = encoder.last_stats
            rows.append([name, "fast MAC" if fast else "RTL", f"{s.model_macs / 1e9:.3f}",
                         f"{s.cycles:,}", f"{100 * s.utilization:.1f} %", f"{100 * s.mfu:.1f} %",
                         f"{s.wall_seconds:.1f}", f"{s.macs / s.sim_seconds / 1e6:.1f}",
                         f"{100 * s.host_seconds / s.wall_seconds:.1f} %"])
    print("all-MiniLM-L6-v2 on the 16x16 chip (chip counters; MFU counts real tokens only)")
    print(format_table(["input", "PEs", "model GMAC", "chip cycles", "utilization", "MFU",
                        "wall s", "sim M MAC/s", "host share"], rows))


if __name__ == "__main__":
    main()
