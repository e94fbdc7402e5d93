"""Where a simulated cycle's wall time goes (docs/simulation.md): samples the
whole-chip simulation with Linux ``perf`` and sums the samples by part of the
model: each unit of the chip's core, the chip's glue, the fast array, the fast
vector lanes' element ops, the AXI memory model, the harness, Verilator's run
time, and the host (Python and NumPy).

    .venv/bin/python bench/simprofile.py [--preset vpu] [--workload minilm] [--seconds 15]

The chip is built with ``profile_units=True``: every unit of the core a C++
class of its own, so that the sampled function names the unit (the same bits
and cycles as the plain build, somewhat slower). Verilator's functions are
split by region too: ``ico`` is the logic that depends on the model's inputs
and runs at every ``eval()``, ``nba`` what runs after the
clock edge. Workloads are those of ``bench/simspeed.py``, run warm in a loop
while ``perf record`` samples this process. Needs ``perf`` (linux-tools)
from the OS.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from simspeed import LONG  # noqa: E402

from mxu.hdl import ChipConfig  # noqa: E402
from mxu.sim import Chip  # noqa: E402
from mxu.sim.report import Results  # noqa: E402

# perf's symbol of a Verilated function: Vtop_<class>___<function>; the root
# class is Vtop___024root. Amaranth's hierarchical names come mangled: "." as
# __02e, "$" as __024.
_CLASS = re.compile(r"^Vtop_(?P<cls>\w*?)___(?P<fn>\w+)$")
_REGIONS = ("ico", "nba", "act")


def _demangle(name):
    return name.replace("__02e", ".").replace("__024", "$")


def _region(function):
    for region in _REGIONS:
        if f"_{region}" in f"_{function}":
            return region
    return "other"


def category(dso, symbol, chip_dso):
    """(part of the model, region) of one sample's shared object and symbol."""
    if dso != chip_dso:
        if dso.startswith("libpython") or dso.startswith("python") or "cpython" in dso \
                or dso.startswith("_multiarray") or dso.startswith("libopenblas"):
            return "host: Python and NumPy", ""
        return f"host: {dso}", ""
    symbol = symbol.split("(")[0]           # a C++ symbol, demangled: no arguments
    match = _CLASS.match(symbol)
    if match:
        cls, fn = match["cls"], match["fn"]
        region = _region(fn)
        if cls in ("", "__024root"):
            return "chip glue (top, core wiring)", region
        unit = _demangle(cls)
        if unit.startswith("top.chip.core."):
            return f"unit {unit[len('top.chip.core.'):]}", region
        if unit.startswith("mxu_vpu_lane"):
            return "fast vector lanes (pipelines)", region
        if unit.startswith("mxu_axi_memory"):
            return "AXI memory model", region
        if unit.startswith("mxu_array_fast") or unit.startswith("mxu_pe"):
            return "array datapath (fast model / PEs)", region
        if unit.startswith("mxu_pending_rows"):
            return "compute's pending rows (C++ and its module)", region
        return f"module {unit}", region
    if symbol.startswith("Vtop") or symbol.startswith("Vtop::"):
        return "chip glue (top, core wiring)", "other"
    if "FastArray" in symbol or symbol.startswith("mxu_array_"):
        return "fast array model (C++)", ""
    if symbol.startswith(("mxu_vpu_f32", "mxu_vpu_row", "vpu_", "f_")):
        return "fast vector lanes' element ops (C++)", ""
    if "PendingRows" in symbol or symbol.startswith("mxu_pending_"):
        return "compute's pending rows (C++ and its module)", ""
    if "AxiMem" in symbol or symbol.startswith("mxu_axi_mem"):
        return "AXI memory model", ""
    if symbol.startswith("mxu_chip") or "namespace)::step" in symbol:
        return "harness", ""
    return "Verilator run time and libc", ""


def _workload(chip, name):
    """A function that runs `name` once on `chip` (warm after its first call)."""
    import ml_dtypes
    import numpy as np
    rng = np.random.default_rng(1)
    if name == "matmul":
        A = rng.standard_normal((256, 768)).astype(np.float32)
        B = rng.standard_normal((768, 1536)).astype(np.float32)
        return lambda: chip.matmul(A, B)
    if name == "decode":
        W = chip.upload(rng.standard_normal((576, 1536)).astype(np.float32),
                        dtype=ml_dtypes.bfloat16)
        x = chip.upload(rng.standard_normal((1, 576)).astype(np.float32), dtype=ml_dtypes.bfloat16)
        return lambda: chip.matmul(x, W, keep=True).free()
    from mxu.sim.models import SentenceEncoder
    encoder = SentenceEncoder("all-MiniLM-L6-v2", chip=chip,
                              vector_ops="chip" if chip.config.vpu else "host")
    ids = encoder.tokenize([LONG])[0]
    ids = [ids[:127] + [encoder.tokenizer.token_to_id("[SEP]")]]
    return lambda: encoder.encode_tokens(ids, show_progress_bar=False)


def _record(run, seconds, data):
    """Run `run` in a loop while perf samples this process for `seconds`."""
    perf = subprocess.Popen(["perf", "record", "-F", "999", "-p", str(os.getpid()), "-o", data,
                             "--", "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def watch():
        perf.wait()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    runs = 0
    while not stop.is_set():
        run()
        runs += 1
    if perf.returncode != 0:
        raise SystemExit(f"perf record failed: {perf.stderr.read()[-2000:]}")
    return runs


def _samples(data):
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol",
                             "--stdio", "-q", "-g", "none"],
                            capture_output=True, text=True, check=True).stdout
    for line in report.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%"):
            yield float(parts[0][:-1]), parts[1], parts[3].split()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vpu", help="ChipConfig preset (default vpu)")
    parser.add_argument("--workload", choices=("minilm", "decode", "matmul"), default="minilm")
    parser.add_argument("--rtl", action="store_true", help="every PE's RTL, not the fast MAC")
    parser.add_argument("--seconds", type=float, default=15.0, help="sampling time")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("bench/simprofile.py needs Linux perf (apt-get install linux-perf)")
    chip = Chip(ChipConfig.preset(args.preset), fast_mac=not args.rtl, profile_units=True)
    run = _workload(chip, args.workload)
    run()
    with tempfile.TemporaryDirectory() as tmp:
        runs = _record(run, args.seconds, str(Path(tmp) / "perf.data"))
        samples = list(_samples(str(Path(tmp) / "perf.data")))
    chip_dso = Path(chip.device._lib._name).name
    parts, regions = collections.Counter(), collections.defaultdict(collections.Counter)
    for share, dso, symbol in samples:
        part, region = category(dso, symbol, chip_dso)
        parts[part] += share
        if region:
            regions[part][region] += share
    total = sum(parts.values())
    rows = []
    for part, share in parts.most_common():
        if share < 0.2:
            continue
        split = ", ".join(f"{r} {100 * v / share:.0f} %" for r, v in regions[part].most_common()
                          if v >= 0.05 * share)
        rows.append([part, f"{100 * share / total:.1f} %", split])
    results = Results("simprofile")
    results.table(f"where the wall time goes: preset {args.preset}, {args.workload}, "
                  f"{'RTL PEs' if args.rtl else 'fast MAC'}, {runs} warm runs sampled for "
                  f"{args.seconds:g} s", ["part", "share", "Verilator regions"], rows)
    results.write()


if __name__ == "__main__":
    main()
