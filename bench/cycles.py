"""The cycle guard (docs/testing.md, "The cycle guard"): the exact chip cycles
of a fixed set of short workloads, recorded in `bench/cycles.json`.

    .venv/bin/python bench/cycles.py            # measure, print, compare with the file
    .venv/bin/python bench/cycles.py --update   # measure and rewrite the file

Cycles are deterministic (they depend on the programs and the shapes, not on
the values or the machine), so `tests/test_bench_cycles.py` holds every
workload to its recorded count exactly. A change that moves cycles on
purpose runs ``--update`` and says in its commit message which workloads
moved and why.

The workloads run on the chips the test suite builds anyway (the default
16x16 chip and the llm preset, fast MAC; the pod preset's chips), each in
seconds. A group is one chip (or pod) and the workloads on it:

* ``default``: the 128x384x384 matmul; all-MiniLM-L6-v2's forward of one
  125-token text with the layer ops on the host;
* ``llm``: the same forward with the layer ops on the vector unit; SmolLM2's
  sizes on two layers (random weights, a vocabulary of 1024 for the logits):
  one decode step at batch 1 and at batch 16 on caches of 64 positions, and
  a 64-token prefill;
* ``pod``: a ring all-reduce of 16 KiB per chip on 4 chips (the pod preset).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

FILE = Path(__file__).with_name("cycles.json")
MINILM_TOKENS = 125
LLM_LAYERS, LLM_VOCAB, LLM_CONTEXT, LLM_PREFILL = 2, 1024, 64, 64
POD_CHIPS, POD_BYTES = 4, 16 << 10


def _minilm_ids(encoder, n):
    """A text of `n` tokens ([CLS] ... [SEP]): cycles depend on its length only."""
    text = "A systolic array multiplies matrices one wave of partial sums at a time. " * 12
    ids = encoder.tokenize([text])[0]
    return [ids[:n - 1] + [encoder.tokenizer.token_to_id("[SEP]")]]


def _minilm(chip, vector_ops):
    from mxu.sim.models import SentenceEncoder
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=chip, vector_ops=vector_ops)
    encoder.encode_tokens(_minilm_ids(encoder, MINILM_TOKENS), show_progress_bar=False)
    return encoder.last_stats.cycles


def default_group():
    """The default 16x16 chip: the matmul and MiniLM with host layer ops."""
    from mxu.hdl import ChipConfig
    from mxu.sim import Chip
    chip = Chip(ChipConfig(), fast_mac=True)
    rng = np.random.default_rng(1)
    A = rng.standard_normal((128, 384)).astype(np.float32)
    B = rng.standard_normal((384, 384)).astype(np.float32)
    chip.matmul(A, B)
    yield "matmul 128x384x384 (default)", chip.last_stats.cycles
    yield f"MiniLM {MINILM_TOKENS} tokens, host ops (default)", _minilm(chip, "host")


def _smollm2_sizes():
    """SmolLM2-135M's sizes from its GGUF's metadata, on `LLM_LAYERS` layers and
    a vocabulary of `LLM_VOCAB`."""
    import dataclasses

    import gguf

    from mxu.sim.models.llama import LlamaConfig
    from mxu.sim.models.registry import find_decoder
    config = LlamaConfig.from_gguf(gguf.GGUFReader(find_decoder("SmolLM2-135M-Instruct")[1]))
    return dataclasses.replace(config, layers=LLM_LAYERS, vocab=LLM_VOCAB)


def _llm_step(lm, batch, n):
    """Chip cycles of one step: `batch` sequences of `n` new tokens each, on
    caches already holding `LLM_CONTEXT` positions (decode) or none (prefill).
    Cycles depend on the shapes, not on the cache's values."""
    seqs = [lm._new_sequence(LLM_CONTEXT + n) for _ in range(batch)]
    try:
        for s in seqs:
            s.length = LLM_CONTEXT if n == 1 else 0
        _, stats = lm.model.step(seqs, [[5] * n for _ in seqs])
        return stats.cycles
    finally:
        for s in seqs:
            s.free()


def llm_group():
    """The llm preset (the vpu chip the decoder's and MiniLM's tests share):
    MiniLM on the vector unit, SmolLM2-sized decode steps and a prefill."""
    from mxu.hdl import ChipConfig
    from mxu.sim import Chip
    from mxu.sim.models import CausalLM
    from mxu.sim.models.llama import LlamaWeights
    chip = Chip(ChipConfig.preset("llm"), fast_mac=True)
    yield f"MiniLM {MINILM_TOKENS} tokens, vector unit (llm)", _minilm(chip, "chip")
    lm = CausalLM.from_weights(LlamaWeights.random(_smollm2_sizes(), seed=0), chip=chip)
    where = f"SmolLM2 sizes, {LLM_LAYERS} layers, vocab {LLM_VOCAB} (llm)"
    for batch in (1, 16):
        yield (f"decode step, batch {batch}, {LLM_CONTEXT} cached, {where}",
               _llm_step(lm, batch, 1))
    yield f"prefill {LLM_PREFILL} tokens, {where}", _llm_step(lm, 1, LLM_PREFILL)


def pod_group():
    """A ring all-reduce on a pod of the pod preset's chips."""
    from mxu.sim import Pod
    rng = np.random.default_rng(1)
    with Pod(POD_CHIPS) as pod:
        rows = POD_BYTES // (4 * pod.config.cols)
        xs = rng.standard_normal((POD_CHIPS, rows, pod.config.cols)).astype(np.float32)
        pod.all_reduce(list(xs))
        yield f"all-reduce {POD_BYTES >> 10} KiB, {POD_CHIPS} chips (pod)", pod.last_stats.cycles


GROUPS = {"default": default_group, "llm": llm_group, "pod": pod_group}


def measure(group):
    """{workload: cycles} of one group."""
    return dict(GROUPS[group]())


def load(path=FILE):
    """The recorded {group: {workload: cycles}}."""
    return json.loads(Path(path).read_text())


def compare(recorded, measured):
    """The differences between two {workload: cycles} of a group, one line
    each ("<workload>: <old> -> <new> cycles"); empty when they agree."""
    lines = []
    for name in sorted(set(recorded) | set(measured)):
        old, new = recorded.get(name), measured.get(name)
        if old != new:
            fmt = lambda c: "absent" if c is None else f"{c:,}"
            lines.append(f"{name}: {fmt(old)} -> {fmt(new)} cycles")
    return lines


def check(recorded, measured):
    """Raise AssertionError naming every workload whose cycles differ from the
    recorded ones (old -> new)."""
    changes = compare(recorded, measured)
    if changes:
        raise AssertionError("chip cycles changed (a change on purpose runs `python "
                             "bench/cycles.py --update` and says why in its commit message):\n"
                             + "\n".join(changes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {FILE.name}")
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"comma-separated groups of {', '.join(GROUPS)}")
    args = parser.parse_args()
    groups = [g for g in args.groups.split(",") if g]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown groups {unknown}; choose from {sorted(GROUPS)}")
    recorded = load() if FILE.exists() else {}
    changes = []
    for group in groups:
        measured = measure(group)
        for name, cycles in measured.items():
            print(f"{group:8s} {name:70s} {cycles:>12,}", flush=True)
        changes += compare(recorded.get(group, {}), measured)
        recorded[group] = measured
    if args.update:
        FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FILE}")
    elif changes:
        print("\n".join(["cycles changed:"] + changes))
        sys.exit(1)


if __name__ == "__main__":
    main()
