"""Where `mxu generate`'s wall time per decode token goes, for each weight
mode: SmolLM2-135M-Instruct on the ``llm`` preset (fast MAC), one greedy
generation per mode, back to back in this process, and the split of a
decode step's wall time between the simulator and the host (compiling the
programs whose KV length changed, copying, host ops). The chip cycles are
those of `mxu generate`; "sim cycles/s" is the simulator's rate alone.

    .venv/bin/python bench/decode_wall.py [--max-new-tokens 4] [--weights gguf,bf16]

The machine is shared: the load average before and after each mode is
printed, and an A/B only counts when the two are alike. "CPU s / token"
is this process's CPU time in the decode steps (simulation and host), which
a busy machine inflates less than the wall time.
"""

import argparse
import os
import time

from mxu.sim.models import CausalLM
from mxu.sim.report import Results

PROMPT = "The capital of France is"


def _load():
    return f"{os.getloadavg()[0]:.1f}"


def _timed(step, cpu):
    """`step` (the model's `ChipLlama.step`), appending the CPU seconds of
    each call to `cpu`: the first is the prefill, the others decode steps."""
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return step(*args, **kwargs)
        finally:
            cpu.append(time.process_time() - start)
    return timed


def _mode(weights, max_new_tokens):
    """One generation with `weights`: the row of the table and the wall
    seconds per decode token."""
    before = _load()
    cpu = []
    with CausalLM(weights=weights) as lm:
        lm.model.step = _timed(lm.model.step, cpu)
        lm.generate(PROMPT, max_new_tokens=max_new_tokens)
        d = lm.last_stats.decode
    n = d.tokens
    row = [weights, n, f"{d.cycles / d.steps:,.0f}", f"{d.wall_seconds / n:.2f}",
           f"{d.run.sim_seconds / n:.2f}", f"{d.run.host_seconds / n:.2f}",
           f"{sum(cpu[1:]) / n:.2f}", f"{d.cycles / d.run.sim_seconds:,.0f}",
           f"{before} / {_load()}"]
    return row, d.wall_seconds / n, sum(cpu[1:]) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=4,
                        help="tokens per generation (decode steps: one fewer; default 4)")
    parser.add_argument("--weights", default="gguf,bf16", help="modes, in order (default gguf,bf16)")
    args = parser.parse_args()
    if args.max_new_tokens < 2:
        raise SystemExit("--max-new-tokens must be at least 2 (one decode step)")
    rows, wall, cpu = [], {}, {}
    for weights in args.weights.split(","):
        row, wall[weights], cpu[weights] = _mode(weights, args.max_new_tokens)
        rows.append(row)
    results = Results("decode_wall")
    results.table(f"mxu generate's decode steps, SmolLM2-135M-Instruct on the llm preset, "
                  f"{args.max_new_tokens} new tokens of {PROMPT!r}",
                  ["weights", "decode tokens", "cycles / step", "wall s / token", "sim s / token",
                   "host s / token", "CPU s / token", "sim cycles/s", "load before / after"],
                  rows)
    if "gguf" in wall and "bf16" in wall:
        print(f"bf16 / gguf per decode token: wall {wall['bf16'] / wall['gguf']:.2f}x, "
              f"CPU {cpu['bf16'] / cpu['gguf']:.2f}x")
    results.write()


if __name__ == "__main__":
    main()
