"""Packed prefill against one prompt at a time (docs/llm.md, "Packed prefill"):
the prefill cycles of `--prompts` prompts of 5 to 20 tokens (seeded random
ids) in SmolLM2-135M-Instruct on the llm preset chip, packed into steps of at
most `pack_tokens` tokens and one by one; the first tokens must agree.

    .venv/bin/python bench/packed_prefill.py                 # 16 prompts, every layer
    .venv/bin/python bench/packed_prefill.py --layers 2      # the first two layers only
"""

import argparse
import dataclasses
import time

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import CausalLM
from mxu.sim.models.causal_lm import PACK_TOKENS
from mxu.sim.models.registry import find_decoder
from mxu.sim.models.llama import read_gguf
from mxu.sim.report import Results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--layers", type=int, default=None,
                        help="keep only the first N layers (default: all 30)")
    parser.add_argument("--pack-tokens", type=int, default=PACK_TOKENS)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    weights, _ = read_gguf(find_decoder("SmolLM2-135M-Instruct")[1])
    if args.layers:
        weights = dataclasses.replace(weights, config=dataclasses.replace(
            weights.config, layers=args.layers), layers=weights.layers[:args.layers])
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(2, weights.config.vocab, rng.integers(5, 21)).tolist()
               for _ in range(args.prompts)]
    with Chip(ChipConfig.preset("llm"), fast_mac=True) as chip:
        lm = CausalLM.from_weights(weights, chip=chip, name="SmolLM2-135M-Instruct")
        rows, first = [], {}
        for label, budget in (("one by one", 1),
                              (f"packed, <= {args.pack_tokens} tokens a step", args.pack_tokens)):
            start = time.perf_counter()
            first[label] = lm.generate_ids(prompts, max_new_tokens=1, pack_tokens=budget)
            p = lm.last_stats.prefill
            rows.append([label, f"{p.steps}", f"{p.tokens}", f"{p.cycles:,}",
                         f"{p.cycles / p.tokens:,.0f}", f"{100 * p.mfu:.1f} %",
                         f"{time.perf_counter() - start:.0f}"])
    results = Results("packed_prefill" if args.layers is None else
                      f"packed_prefill_{weights.config.layers}layers")
    results.table(f"{args.prompts} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
                  f"tokens ({sum(map(len, prompts))} in all), SmolLM2-135M-Instruct "
                  f"{weights.config.layers} layers, llm preset chip, fast MAC",
                  ["prefill", "steps", "tokens", "cycles", "cycles/token", "MFU", "wall s"], rows)
    results.write()
    a, b = first.values()
    print("same first tokens: " + ("yes" if a == b else f"NO: {a} vs {b}"))


if __name__ == "__main__":
    main()
