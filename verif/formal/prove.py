"""``mxu prove``: run the formal proofs and print their table (docs/formal.md).

    mxu prove [--unit dma|regs|streams|array|controller|all] [--depth N] [-o DIR]
              [--sizes small|default] [--solver yices|z3]

Each proof is one sby job (a prove or bmc task and a cover task); the table
has one row per property and kind: the result, the engine, the induction
length or bound (asserts) or the step reached (covers), and the seconds into
its job at which sby decided it; a second table has one row per proof: its
kind (``k = N``, k-induction that succeeded at N, or ``bound N``), its
asserts, lemmas and covers, and its seconds. Counterexample and cover traces (VCD) go to
DIR. The exit status is 1 if an assert is not proved or a cover not reached.
"""

import sys
import tempfile
import time
from pathlib import Path

from mxu.hdl.config import ChipConfig
from mxu.sim.cli import add_command, output_path

from .sby import SOLVERS, ToolMissing, run_proof
from .units import UNITS, proofs_for, small_config

__all__ = ["add_parser", "cmd_prove", "PRESETS", "run_proofs", "format_results",
           "format_proofs", "proof_kind"]


def default_formal_config():
    """The default chip's interface widths (128-bit AXI data, 32-bit addresses,
    its VMEM and accumulator sizes) with the sizes the bounded and inductive
    proofs reach: a 2x2 array, 4-beat bursts, two bursts in flight, two-entry
    command queues (docs/formal.md: why these cover the default)."""
    return ChipConfig(rows=2, cols=2, dma_max_burst_beats=4, dma_max_outstanding=2,
                      cmd_queue_depth=2)


PRESETS = {"small": small_config, "default": default_formal_config}


def run_proofs(proofs, workdir, traces, *, solver="yices", out=None, quiet=False, seconds=None):
    """Run every `Proof`; returns the `Result` list (printing a line per job,
    with the time left at the mean pace so far, unless `quiet`). `seconds`,
    a dict, gets each proof's wall time by name."""
    out = out or sys.stderr
    say = (lambda text: None) if quiet else (lambda text: print(text, file=out, flush=True))
    results, began = [], time.monotonic()
    for i, proof in enumerate(proofs):
        start = time.monotonic()
        left = "" if not i else \
            f"; about {(start - began) / i * (len(proofs) - i) / 60:.1f} min left"
        say(f"mxu prove: [{i + 1}/{len(proofs)}] {proof.name} ({proof.mode}, depth "
            f"{proof.depth}){left} ...")
        rows = run_proof(proof, Path(workdir) / proof.name, traces=traces, solver=solver)
        if seconds is not None:
            seconds[proof.name] = time.monotonic() - start
        bad = sum(not r.ok for r in rows)
        say(f"mxu prove: {proof.name}: {len(rows)} properties, "
            f"{'all hold' if not bad else f'{bad} NOT'} in {time.monotonic() - start:.0f} s")
        results += rows
    return results


def format_results(results):
    from mxu.sim.report import format_table
    rows = [[r.property, r.kind, r.result, r.engine, str(r.depth), f"{r.seconds:.1f}"]
            for r in sorted(results, key=lambda r: (r.proof, r.property, r.kind))]
    return format_table(["property", "kind", "result", "engine", "depth", "seconds"], rows)


def proof_kind(proof, results):
    """How `proof` went: ``k = N`` (k-induction succeeded at N: the largest
    of its asserts'), ``bound N``, or ``NOT proved``."""
    asserts = [r for r in results if r.proof == proof.name and r.kind == "assert"]
    if not asserts or not all(r.ok for r in asserts):
        return "NOT proved"
    if proof.mode == "bmc":
        return f"bound {proof.depth}"
    ks = [int(str(r.depth)[2:]) for r in asserts if str(r.depth).startswith("k=")]
    return f"k = {max(ks)}" if ks else f"k <= {proof.depth}"


def format_proofs(proofs, results, seconds):
    """One row per proof: its kind (k = N or bound N), its properties (asserts
    holding, of which induction lemmas; covers reached) and its seconds."""
    from mxu.sim.report import format_table
    rows = []
    for p in proofs:
        mine = [r for r in results if r.proof == p.name]
        asserts = [r for r in mine if r.kind == "assert"]
        rows.append([p.name, proof_kind(p, results),
                     f"{sum(r.ok for r in asserts)}/{len(asserts)}",
                     str(sum(".inv." in r.property for r in asserts)),
                     f"{sum(r.ok for r in mine if r.kind == 'cover')}/"
                     f"{sum(r.kind == 'cover' for r in mine)}",
                     f"{seconds.get(p.name, 0):.0f}"])
    return format_table(["proof", "kind", "asserts", "lemmas", "covers", "seconds"], rows)


def cmd_prove(args):
    units = UNITS if args.unit == "all" else (args.unit,)
    config = PRESETS[args.sizes]()
    proofs = [p for p in proofs_for(config, depth=args.depth) if p.unit in units]
    out_dir = Path(args.output) if args.output else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"-o: {str(out_dir)!r} is not a directory")
    with tempfile.TemporaryDirectory(prefix="mxu-prove-") as tmp:
        work = out_dir / "work" if out_dir is not None else Path(tmp)
        try:
            seconds = {}
            results = run_proofs(proofs, work, out_dir, solver=args.solver, quiet=args.quiet,
                                 seconds=seconds)
        except ToolMissing as error:
            raise ValueError(str(error)) from None
    print(f"formal proofs, sizes {args.sizes!r}: " + ", ".join(
        f"{p.name} ({p.mode} {p.depth})" for p in proofs))
    print(format_results(results))
    print(format_proofs(proofs, results, seconds))
    bad = [r for r in results if not r.ok]
    proved = sum(r.ok and r.kind == "assert" for r in results)
    reached = sum(r.ok and r.kind == "cover" for r in results)
    print(f"{proved} asserts hold, {reached} covers reached, {len(bad)} not"
          + (f"; traces in {out_dir}" if out_dir else ""))
    return 1 if bad else 0


def _depth(text):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= 200:
        import argparse
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 200, not {text!r}")
    return value


def add_parser(sub):
    """The ``prove`` subcommand (registered by `mxu.verif.cli.register`)."""
    prove = add_command(sub, "prove", "formal proofs of the bus and stream protocols, the "
                                      "weight path and the tokens (SymbiYosys)",
                        "mxu prove --unit dma --sizes small -o /tmp/prove")
    prove.add_argument("--unit", choices=UNITS + ("all",), default="all",
                       help="which unit's proofs to run (default: all)")
    prove.add_argument("--depth", type=_depth,
                       help="induction length / bound of every proof (default: each proof's own, "
                            "docs/formal.md)")
    prove.add_argument("-o", "--output", metavar="DIR", type=output_path("-o", "dir"),
                       help="write counterexample and cover traces (VCD) and the sby jobs here")
    # Not --preset: that names a ChipConfig preset in every other command.
    prove.add_argument("--sizes", choices=sorted(PRESETS), default="default",
                       help="the reduced chip the proofs run on: 'default': the default chip's "
                            "bus and memory widths (default); 'small': the reduced chip of make "
                            "test (64-bit bus, short memories)")
    prove.add_argument("--solver", choices=SOLVERS, default="yices",
                       help="SMT solver of the smtbmc engine (default: yices)")
    prove.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    prove.set_defaults(func=cmd_prove)
