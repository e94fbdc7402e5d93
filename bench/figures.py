"""The headline figures, from the bench results (docs/figures.md).

    .venv/bin/python bench/figures.py            # write docs/figures.md from bench/results/*.json
    .venv/bin/python bench/figures.py --check    # verify docs/figures.md and every marked figure

Every bench writes ``bench/results/<name>.json`` beside its printed table
(`mxu.sim.report.Results`: the tables, the commit, the machine, the
command). `HEADLINES` names the cells of those tables that the README and
docs/ quote. A doc that states one writes the value followed by a marker,
``6,495,528<!--fig:minilm.chip.cycles-->`` (invisible when rendered);
``--check`` fails, naming the file, the line and both values, when a marked
value differs from its results file, when a marker names no headline, or
when docs/figures.md is not what this script writes.
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "figures.md"
MARKER = re.compile(r"(\d[\d,.]*(?: ?%| ?x)?)<!--fig:([\w.-]+)-->")


@dataclass(frozen=True)
class Headline:
    """One figure: cell `column` of the first row of bench `bench`'s table
    whose title contains `table` and whose cells include all of `row`."""
    key: str
    what: str
    bench: str
    table: str
    row: tuple
    column: str

    def value(self, record):
        for t in record["tables"]:
            if self.table not in t["title"]:
                continue
            for cells in t["rows"]:
                if all(c in cells for c in self.row):
                    return cells[t["header"].index(self.column)]
        raise LookupError(f"{self.key}: no row {list(self.row)} in a table {self.table!r} of "
                          f"bench/results/{self.bench}.json")


def _h(key, what, bench, table, row, column):
    return Headline(key, what, bench, table, tuple(row), column)


def _smollm2(suffix, mode, label):
    """SmolLM2's headlines in one weight mode (bench/llm.py's rows of `mode`)."""
    rows = [("prefill64", "64-token prefill", "prefill 64 tokens", [("mfu", "MFU", "MFU"),
             ("cycles", "chip cycles", "chip cycles")])]
    rows += [(f"decode{b}", f"decode at batch {b}", f"decode batch {b}",
              [("cycles", "cycles per step", "cycles per step"),
               ("roofline", "share of the roofline", "roofline share")]) for b in (1, 16)]
    return [_h(f"llm.{key}{suffix}.{field}", f"SmolLM2-135M, {label}, {what}: {title}", "llm",
               "SmolLM2", [row, mode], column)
            for key, what, row, fields in rows for field, title, column in fields]


HEADLINES = [
    _h("matmul.128x384x384.utilization", "16x16 chip, 128x384x384 matmul: utilization", "chip",
       "16x16 chip, fast PE", ["128x384x384"], "utilization"),
    _h("matmul.128x384x1536.utilization", "16x16 chip, 128x384x1536 matmul: utilization",
       "chip", "16x16 chip, fast PE", ["128x384x1536"], "utilization"),
    _h("matmul.128x1536x384.utilization", "16x16 chip, 128x1536x384 matmul: utilization",
       "chip", "16x16 chip, fast PE", ["128x1536x384"], "utilization"),
    _h("matmul.128x512x256.utilization", "16x16 chip, Gemmini's GEMM 128x512x256: utilization",
       "chip", "16x16 chip, fast PE", ["128x512x256"], "utilization"),
    _h("minilm.host.cycles", "MiniLM, 128 tokens, layer ops on the host: chip cycles",
       "transformer", "all-MiniLM", ["1 x 128 tokens", "host"], "chip cycles"),
    _h("minilm.host.mfu", "MiniLM, 128 tokens, layer ops on the host: MFU", "transformer",
       "all-MiniLM", ["1 x 128 tokens", "host"], "MFU"),
    _h("minilm.chip.cycles", "MiniLM, 128 tokens, vector unit (vpu preset): chip cycles",
       "transformer", "all-MiniLM", ["1 x 128 tokens", "chip"], "chip cycles"),
    _h("minilm.chip.mfu", "MiniLM, 128 tokens, vector unit: MFU", "transformer", "all-MiniLM",
       ["1 x 128 tokens", "chip"], "MFU"),
    _h("minilm.chip.wall", "MiniLM, 128 tokens, vector unit: wall seconds (cold: compiles)",
       "transformer", "all-MiniLM", ["1 x 128 tokens", "chip"], "wall s"),
    _h("minilm.chip125.cycles", "MiniLM, 125 tokens (padded to 128), vector unit (vpu preset): "
       "chip cycles", "transformer_125", "all-MiniLM", ["1 x 125 tokens", "chip"], "chip cycles"),
    _h("sim.minilm.cycles_per_s", "Simulation speed, MiniLM on the vpu preset (warm): cycles/s",
       "simspeed", "simulation speed", ["vpu", "MiniLM 128 tokens (chip layer ops)"],
       "cycles/s"),
    _h("sim.minilm.wall", "Simulation speed, MiniLM on the vpu preset (warm): wall seconds",
       "simspeed", "simulation speed", ["vpu", "MiniLM 128 tokens (chip layer ops)"], "wall s"),
    _h("sim.matmul.cycles_per_s", "Simulation speed, 256x768x1536 matmul, vpu preset: cycles/s",
       "simspeed", "simulation speed", ["vpu", "matmul 256x768x1536"], "cycles/s"),
    *_smollm2("", "gguf", "GGUF blocks on the chip"),
    *_smollm2(".bf16", "bf16", "bf16 weights"),
    _h("gemma.prefill64.mfu", "Gemma 3 270M, 64-token prefill, the file's blocks on the chip: MFU",
       "llm_gemma-3-270m", "gemma-3-270m on the llm preset", ["prefill 64 tokens", "gguf"],
       "MFU"),
    _h("gemma.prefill64.cycles", "Gemma 3 270M, 64-token prefill, the file's blocks on the chip: "
       "chip cycles", "llm_gemma-3-270m", "gemma-3-270m on the llm preset",
       ["prefill 64 tokens", "gguf"], "chip cycles"),
    _h("gemma.prefill64.mfu.bf16", "Gemma 3 270M, 64-token prefill, bf16 weights: MFU",
       "llm_gemma-3-270m", "gemma-3-270m on the llm preset", ["prefill 64 tokens", "bf16"],
       "MFU"),
    _h("gemma.decode1.cycles", "Gemma 3 270M, decode at batch 1, the file's blocks on the chip: "
       "cycles per step", "llm_gemma-3-270m", "gemma-3-270m on the llm preset",
       ["decode batch 1", "gguf"], "cycles per step"),
    _h("gemma.decode1.roofline", "Gemma 3 270M, decode at batch 1, the file's blocks on the "
       "chip: share of the roofline", "llm_gemma-3-270m", "gemma-3-270m on the llm preset",
       ["decode batch 1", "gguf"], "roofline share"),
    _h("gemma.decode1.cycles.bf16", "Gemma 3 270M, decode at batch 1, bf16 weights: cycles per "
       "step", "llm_gemma-3-270m", "gemma-3-270m on the llm preset", ["decode batch 1", "bf16"],
       "cycles per step"),
    _h("gemma.decode1.roofline.bf16", "Gemma 3 270M, decode at batch 1, bf16 weights: share of "
       "the roofline", "llm_gemma-3-270m", "gemma-3-270m on the llm preset",
       ["decode batch 1", "bf16"], "roofline share"),
    _h("quant.q4_0.m1.cycles", "16x16 chip, 1x576 @ 576x1536 with Q4_0 weights on the chip: "
       "cycles", "quant", "M x K @ K x N", ["Q4_0", "1"], "quantized cycles"),
    _h("quant.q4_0.m1.roofline", "16x16 chip, 1x576 @ 576x1536 with Q4_0 weights: share of the "
       "roofline", "quant", "M x K @ K x N", ["Q4_0", "1"], "of roofline"),
    _h("quant.q4_0.m1.speedup", "16x16 chip, 1x576 @ 576x1536: bf16 cycles / Q4_0 cycles",
       "quant", "M x K @ K x N", ["Q4_0", "1"], "bf16 / quantized"),
    _h("pod.allreduce64k.busbw", "Pod of 4, ring all-reduce of 64 KiB: busbw of a 64 B/cycle link",
       "pod", "Ring all-reduce on", ["64 KiB"], "of a link"),
    _h("pod.allreduce64k.16both", "Pod of 4, all-reduce of 64 KiB, 16 B/cycle links both ways: "
       "busbw of a link", "pod", "against the links", ["16 B/cycle, 500, both ways"],
       "of a link"),
    _h("pod.tp4.speedup", "Pod of 4, tensor-parallel MiniLM layer (64 B/cycle links): speed-up "
       "over one chip's fused layer", "pod", "Tensor-parallel", ["4", "64"], "speed-up"),
]


def load_results(directory=RESULTS):
    """{bench name: its results record} of every results file."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))}


def values(results):
    """{key: (Headline, value, record)} of every headline."""
    out = {}
    for h in HEADLINES:
        if h.bench not in results:
            raise LookupError(f"{h.key}: no bench/results/{h.bench}.json (run the bench)")
        record = results[h.bench]
        out[h.key] = (h, h.value(record), record)
    return out


def page(results):
    """The text of docs/figures.md."""
    figures = values(results)
    lines = ["# Figures", "",
             "Generated by `python bench/figures.py` from `bench/results/*.json`; do not edit.",
             "Each figure is a cell of a bench's printed table. The results files are",
             "committed: they are this page's source, and `python bench/figures.py --check`",
             "holds every figure that README.md and docs/ state (marked",
             "`<!--fig:KEY-->`) to them. Cycles are exact and do not depend on the machine",
             "(the cycle guard, docs/testing.md, holds a set of them); wall times and",
             "simulation speeds depend on the machine and on its load when the bench ran",
             "(the load average is in the table below: the machines are shared).", "",
             "| figure | value | key | bench |", "|---|---|---|---|"]
    for h, value, record in figures.values():
        lines.append(f"| {h.what} | {value} | `{h.key}` | {h.bench} |")
    from mxu.hdl.config import MEASURED_FMAX_MHZ
    lines += ["", "## Fmax", "",
              "The whole chip of each preset placed and routed on the LFE5U-85F, as",
              "`MEASURED_FMAX_MHZ` (`hdl/config.py`) records it: "
              + ", ".join(f"{k} {v}" for k, v in MEASURED_FMAX_MHZ.items()) + ".",
              "A preset missing here was never routed: `mxu generate` gives its cycles",
              "and no tokens/s. docs/synth.md has the runs (critical path, resources); `python",
              "bench/synth.py --only fpga` repeats it (about 45 minutes) and writes",
              "`bench/results/synth.json`."]
    lines += ["", "## How each bench's results were made", "",
              "| bench | command | commit | machine |", "|---|---|---|---|"]
    for name, r in results.items():
        m = r["machine"]
        load = f", load {m['load']}" if m.get("load") is not None else ""
        lines.append(f"| {name} | `{r['command']}` | `{r['commit']}` | {m['cpu']}, "
                     f"{m['cores']} cores{load} |")
    return "\n".join(lines) + "\n"


def docs():
    """README.md and every docs/*.md but the generated page."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p != PAGE)


def check_markers(figures, files, root=ROOT):
    """A line per marked figure that disagrees with its results, or names no
    headline (files named relative to `root`)."""
    problems = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for stated, key in MARKER.findall(line):
                where = f"{path.relative_to(root)}:{number}"
                if key not in figures:
                    problems.append(f"{where}: no headline {key!r} (bench/figures.py HEADLINES)")
                elif stated.replace(" ", "") != figures[key][1].replace(" ", ""):
                    problems.append(f"{where}: {key} is stated as {stated}, the results say "
                                    f"{figures[key][1]} (bench/results/{figures[key][0].bench}.json)")
    return problems


def check(results, files=None):
    """Every problem `--check` reports (empty when all agree)."""
    try:
        figures = values(results)
        text = page(results)
    except LookupError as e:
        return [str(e)]
    problems = []
    if not PAGE.exists() or PAGE.read_text() != text:
        problems.append(f"{PAGE.relative_to(ROOT)} is not what the results give: run "
                        f"`python bench/figures.py`")
    return problems + check_markers(figures, docs() if files is None else files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="verify docs/figures.md and the marked figures; write nothing")
    args = parser.parse_args()
    results = load_results()
    if args.check:
        problems = check(results)
        if problems:
            sys.exit("bench/figures.py --check:\n" + "\n".join(problems))
        print(f"{len(HEADLINES)} headline figures agree with bench/results/")
        return
    PAGE.write_text(page(results))
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
