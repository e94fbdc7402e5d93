"""SmolLM2-135M-Instruct on the chip (docs/llm.md): prefill MFU by prompt
length, decode cycles per step by batch with their share of the roofline,
wall time and simulated cycles per second.

    python bench/llm.py                       # the llm preset (256-bit bus)
    python bench/llm.py --bus 128,512         # the same chip with other buses
    python bench/llm.py --prefill 16 --batch 1,16

The roofline of a step is max(bytes / bus bytes per cycle, MACs / PEs), the
bytes being every weight once and each sequence's KV cache (docs/llm.md).
Decode steps run on caches of `--context` positions: a sequence is
prefilled with one real prompt, and the other sequences of a batch have
their caches' positions marked as filled without a prefill of their own
(their K and V rows hold what the first sequence's prefill left in memory
of their own cache: zeros). A step's cycles do not depend on the values,
only on the shapes, so the timing is that of a real batch; the tokens they
produce are not meaningful and are not reported.
"""

import argparse

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import CausalLM
from mxu.sim.models.causal_lm import PhaseStats
from mxu.sim.report import format_table


def _int_list(text):
    return [int(x) for x in text.split(",") if x]


def _phase_row(label, bus, phase, cycles_s):
    return [label, f"{bus}", f"{phase.tokens}", f"{phase.cycles:,}",
            f"{phase.cycles / max(1, phase.steps):,.0f}", f"{100 * phase.mfu:.1f} %",
            f"{100 * phase.roofline_share:.1f} %", f"{phase.wall_seconds:.1f}",
            f"{cycles_s / 1e3:,.0f}k"]


def run(bus, prefills, batches, context, steps):
    config = ChipConfig.preset("llm").replace(axi_data_bits=bus)
    lm = CausalLM("SmolLM2-135M-Instruct", chip=Chip(config, fast_mac=True))
    tok = lm.tokenizer
    text = ("A tensor processing unit multiplies matrices with a systolic array of "
            "multiply-accumulate cells, streaming weights from its high-bandwidth memory "
            "while the vector unit applies the layer's nonlinearities. ") * 8
    ids = tok.encode(text)
    rows = []
    for n in prefills:
        seq = lm._new_sequence(n)
        try:
            logits, stats = lm.model.step([seq], [ids[:n]])
            phase = PhaseStats()
            lm._account(phase, stats, [seq], [n])
        finally:
            seq.free()
        rows.append(_phase_row(f"prefill {n} tokens", bus, phase, stats.cycles / stats.sim_seconds))
    for b in batches:
        seqs = [lm._new_sequence(context + steps) for _ in range(b)]
        try:
            prompt = ids[:context]
            lm.model.step([seqs[0]], [prompt])
            for s in seqs[1:]:
                s.length = context
            phase = PhaseStats()
            token = [[int(t)] for t in ids[context:context + b]]
            for _ in range(steps):
                logits, stats = lm.model.step(seqs, token)
                lm._account(phase, stats, seqs, [1] * b)
            rows.append(_phase_row(f"decode batch {b}", bus, phase,
                                   phase.cycles / phase.run.sim_seconds))
        finally:
            for s in seqs:
                s.free()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bus", type=_int_list, default=[256], help="AXI widths in bits")
    parser.add_argument("--prefill", type=_int_list, default=[16, 64, 256],
                        help="prompt lengths of the prefill rows")
    parser.add_argument("--batch", type=_int_list, default=[1, 4, 16, 32],
                        help="batch sizes of the decode rows")
    parser.add_argument("--context", type=int, default=16,
                        help="positions in each cache before the decode steps")
    parser.add_argument("--steps", type=int, default=1, help="decode steps per batch")
    args = parser.parse_args()
    rows = []
    for bus in args.bus:
        rows += run(bus, args.prefill, args.batch, args.context, args.steps)
        print(format_table(["phase", "bus bits", "tokens", "chip cycles", "cycles per step", "MFU",
                            "roofline share", "wall s", "sim cycles/s"], rows), flush=True)
        rows = []


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
