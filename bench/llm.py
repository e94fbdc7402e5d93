"""SmolLM2-135M-Instruct on the chip (docs/llm.md): prefill MFU by prompt
length, decode cycles per step by batch with their share of the roofline,
wall time and simulated cycles per second.

    python bench/llm.py                       # the llm preset (128-bit bus)
    python bench/llm.py --bus 128,512         # the same chip with other buses
    python bench/llm.py --prefill 16 --batch 1,16
    python bench/llm.py --weights bf16        # one weight mode only
    python bench/llm.py --model gemma-3-270m --prefill 64 --batch 1   # another decoder

Each phase runs with both weight modes side by side (``CausalLM(...,
weights=)``): "gguf", the file's blocks on the chip, and "bf16". The
roofline of a step is max(bytes / bus bytes per cycle, MACs / PEs), the
bytes being every weight once, as the chip holds it, and each sequence's KV
cache (docs/llm.md).
Decode steps run on caches of `--context` positions: a sequence is
prefilled with one real prompt, and the other sequences of a batch have
their caches' positions marked as filled without a prefill of their own
(their K and V rows hold what the first sequence's prefill left in memory
of their own cache: zeros). A step's cycles do not depend on the values,
only on the shapes, so the timing is that of a real batch; the tokens they
produce are not meaningful and are not reported.
"""

import argparse
import os

import numpy as np

from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import CausalLM
from mxu.sim.models.causal_lm import PhaseStats
from mxu.sim.report import Results


def _int_list(text):
    return [int(x) for x in text.split(",") if x]


def _phase_row(label, mode, bus, phase, cycles_s):
    steps = max(1, phase.steps)
    return [label, mode, f"{bus}", f"{phase.tokens}", f"{phase.cycles:,}",
            f"{phase.cycles / steps:,.0f}", f"{(phase.weight_bytes + phase.kv_bytes) / steps:,.0f}",
            f"{100 * phase.mfu:.1f} %", f"{100 * phase.roofline_share:.1f} %",
            f"{phase.wall_seconds:.1f}", f"{cycles_s / 1e3:,.0f}k"]


HEADER = ["phase", "weights", "bus bits", "tokens", "chip cycles", "cycles per step",
          "bytes per step", "MFU", "roofline share", "wall s", "sim cycles/s"]


def run(bus, prefills, batches, context, steps, modes, model="SmolLM2-135M-Instruct"):
    """The rows of every phase, one per weight mode in `modes`, side by side."""
    runs = [_run(bus, prefills, batches, context, steps, mode, model) for mode in modes]
    rows = [row for phase in zip(*runs) for row in phase]
    formats = [[mode, name, f"{nbytes:,}"] for mode, r in zip(modes, runs)
               for name, nbytes in r.formats.items()]
    return rows, formats


class _Rows(list):
    formats = None


def _run(bus, prefills, batches, context, steps, mode, model):
    config = ChipConfig.preset("llm").replace(axi_data_bits=bus)
    lm = CausalLM(model, chip=Chip(config, fast_mac=True), weights=mode)
    tok = lm.tokenizer
    text = ("A tensor processing unit multiplies matrices with a systolic array of "
            "multiply-accumulate cells, streaming weights from its high-bandwidth memory "
            "while the vector unit applies the layer's nonlinearities. ") * 8
    ids = tok.encode(text)
    rows = _Rows()
    rows.formats = lm.model.weight_formats
    for n in prefills:
        seq = lm._new_sequence(n)
        try:
            logits, stats = lm.model.step([seq], [ids[:n]])
            phase = PhaseStats()
            lm._account(phase, stats, [seq], [n])
        finally:
            seq.free()
        rows.append(_phase_row(f"prefill {n} tokens", mode, bus, phase,
                               stats.cycles / stats.sim_seconds))
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
            rows.append(_phase_row(f"decode batch {b}", mode, bus, phase,
                                   phase.cycles / phase.run.sim_seconds))
        finally:
            for s in seqs:
                s.free()
    return rows


FIDELITY_TEXT = ("The history of computing is a story of machines that grew smaller and faster "
                 "every decade. Early computers filled whole rooms, used vacuum tubes, and could "
                 "add a few thousand numbers each second. Today a phone in your pocket holds "
                 "more power than all of them together, and it fits in the palm of a hand.")
PROMPTS = ["The capital of France is", "Once upon a time, there was a", "The best way to learn "
           "a new language is", "Water boils at a temperature of", "In 1969, the first humans",
           "A good breakfast includes", "The largest planet in our solar system is",
           "To make a cup of tea, you"]


def fidelity(results, tokens, prompts, new_tokens, model="SmolLM2-135M-Instruct"):
    """Against the float32 reference: teacher-forced next-token argmax agreement
    over `tokens` of one text (one prefill on the chip, checked bit for bit
    against the family's golden form), and greedy continuations of `prompts`
    (one batch on the chip) against the reference's."""
    from mxu.verif import gemma3, llama
    lm = CausalLM(model)
    form = gemma3 if type(lm.weights).__name__ == "Gemma3Weights" else llama
    Golden = getattr(form, "GoldenGemma3", None) or form.GoldenLlama
    reference_logits = form.reference_logits
    tok = lm.tokenizer
    ids = tok.encode(FIDELITY_TEXT)[:tokens]
    chip = lm.logits_ids(ids)
    gold = Golden(lm.weights, rows=16, lanes=16).forward([(0, ids)], logits="all")[0]
    exact = np.array_equal(chip.view(np.uint32), gold.view(np.uint32))
    ref = reference_logits(lm.weights, ids)
    agree = float(np.mean(chip.argmax(1) == ref.argmax(1)))
    rms = float(np.sqrt(np.mean((chip - ref) ** 2)))
    results.table("Teacher-forced next-token prediction against the float32 reference",
                  ["tokens", "argmax agreement", "logit rms difference",
                   "bit-exact to the golden form"],
                  [[len(ids), f"{100 * agree:.1f} %", f"{rms:.3f}", exact]])
    enc = [tok.encode(p) for p in prompts]
    outs = lm.generate_ids(enc, max_new_tokens=new_tokens)
    rows, same = [], 0
    for p, e, out in zip(prompts, enc, outs):
        seq = list(e)
        for _ in range(len(out)):
            seq.append(int(np.argmax(reference_logits(lm.weights, seq)[-1])))
        want = seq[len(e):]
        same += out == want
        first = next((i for i, (a, b) in enumerate(zip(out, want)) if a != b), None)
        rows.append([p, repr(tok.decode(out)), "identical" if out == want else
                     f"differs from token {first}: {tok.decode(want)!r}"])
    results.table(f"Greedy continuations of {new_tokens} tokens",
                  ["prompt", "chip (greedy)", "float32 reference"], rows)
    print(f"{same} of {len(prompts)} greedy continuations of {new_tokens} tokens identical; "
          f"decode {lm.last_stats.decode.cycles:,} cycles in {lm.last_stats.decode.steps} steps "
          f"at batch {len(prompts)}")


def file_layer(model, layer=1, vocab=1024):
    """Decoder `model`'s layer `layer` alone, with its file's weights and
    blocks, and the first `vocab` rows of its embedding (the tied logits)."""
    import dataclasses

    from mxu.sim.models.llama import GgufBlocks
    from mxu.sim.models.registry import find_decoder, read_decoder
    w = read_decoder(find_decoder(model)[1])[0]
    c = w.config
    local = {"local": c.local[layer:layer + 1]} if hasattr(c, "local") else {}
    w.config = dataclasses.replace(c, layers=1, vocab=vocab, **local)
    w.layers = w.layers[layer:layer + 1]
    w.embed = w.embed[:vocab]
    blocks = w.blocks.get("embed")
    if blocks is not None:
        row = blocks.data.size // blocks.shape[0]
        w.blocks["embed"] = GgufBlocks(blocks.data[:vocab * row], blocks.qtype,
                                       (vocab, blocks.shape[1]))
    return w


def layer_programs(bus, prefill, batches, context, model="SmolLM2-135M-Instruct"):
    """One layer on the llm chip: each program's bytes and chip cycles
    (docs/compiler.md, "Loops"). SmolLM2: its sizes, random weights (bf16),
    a 1024-token vocabulary; another decoder: its file's layer 1 with the
    file's blocks (`file_layer`)."""
    from mxu.sim.models.llama import LlamaConfig, LlamaWeights
    from mxu.sim.models.registry import find_decoder, read_decoder
    config = ChipConfig.preset("llm").replace(axi_data_bits=bus)
    if model == "SmolLM2-135M-Instruct":
        cfg = read_decoder(find_decoder(model)[1])[0].config
        small = LlamaConfig(**{**cfg.__dict__, "layers": 1, "vocab": 1024})
        weights = LlamaWeights.random(small, seed=0)
    else:
        weights = file_layer(model)
    lm = CausalLM.from_weights(weights, chip=Chip(config, fast_mac=True))
    log, chip = [], lm.chip
    execute = chip._execute

    def logged(calls, host_start=None):
        stats = execute(calls, host_start)
        log.append(stats)
        return stats
    chip._execute = logged
    rows = []
    for label, batch in [(f"prefill {prefill} tokens", 0)] + [(f"decode batch {b}", b)
                                                               for b in batches]:
        n = 1 if batch else prefill
        seqs = [lm._new_sequence(context + n) for _ in range(max(1, batch))]
        try:
            for s in seqs:
                s.length = context if batch else 0
            log.clear()
            lm.model.step(seqs, [[5] * n for _ in seqs])
        finally:
            for s in seqs:
                s.free()
        for name, st in zip(["attention", "output projection + FFN", "logits"], log):
            rows.append([label, name, f"{st.program_bytes:,}", f"{st.cycles:,}",
                         f"{st.macs / (config.rows * config.cols):,.0f}"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bus", type=_int_list, default=[128], help="AXI widths in bits")
    parser.add_argument("--prefill", type=_int_list, default=[16, 64, 256],
                        help="prompt lengths of the prefill rows")
    parser.add_argument("--batch", type=_int_list, default=[1, 4, 16, 32],
                        help="batch sizes of the decode rows")
    parser.add_argument("--context", type=int, default=16,
                        help="positions in each cache before the decode steps")
    parser.add_argument("--steps", type=int, default=1, help="decode steps per batch")
    parser.add_argument("--weights", type=lambda t: [x for x in t.split(",") if x],
                        default=["gguf", "bf16"],
                        help="weight modes, side by side (default gguf,bf16)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct",
                        help="a known decoder or a GGUF path (the default rows and --fidelity)")
    parser.add_argument("--fidelity", action="store_true",
                        help="only the fidelity against the float32 reference (48-token text, "
                             "12-token greedy continuations of 8 prompts)")
    parser.add_argument("--layer", action="store_true",
                        help="only the bytes and cycles of each program of one layer (SmolLM2: "
                             "random weights of its sizes; another --model: its file's layer 1; "
                             "64 positions in each cache)")
    args = parser.parse_args()
    if args.layer:
        default = args.model == "SmolLM2-135M-Instruct"
        results = Results("llm_layer" if default else "llm_layer_" + os.path.basename(args.model))
        rows = layer_programs(args.bus[0], 64, [1, 16], 64, args.model)
        what = "One layer of SmolLM2's sizes" if default else f"{args.model}'s layer 1"
        results.table(f"{what}, {args.bus[0]}-bit bus, 64 cached positions",
                      ["step", "program", "bytes", "chip cycles", "MACs / PEs"], rows)
    elif args.fidelity:
        results = Results("llm_fidelity" if args.model == "SmolLM2-135M-Instruct"
                          else "llm_fidelity_" + os.path.basename(args.model))
        fidelity(results, 48, PROMPTS, 12, args.model)
    else:
        default = args.model == "SmolLM2-135M-Instruct"
        results = Results("llm" if default else "llm_" + os.path.basename(args.model))
        for bus in args.bus:
            rows, formats = run(bus, args.prefill, args.batch, args.context, args.steps,
                                args.weights, args.model)
            results.table(f"{args.model} on the llm preset, {bus}-bit bus, decode on "
                          f"caches of {args.context} positions", HEADER, rows)
            results.table(f"{args.model}'s weight bytes per step by format, {bus}-bit "
                          f"bus", ["weights", "format", "bytes per step"], formats)
    results.write()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
