"""Formal proofs on the reduced chip (docs/formal.md): every property of every
unit holds and has a reached cover; every planted bug is caught, with its
counterexample written as a waveform. The default chip's widths run in
``slow`` (``mxu prove`` runs them too)."""

import pytest

from mxu.verif.formal.mutants import mutants
from mxu.verif.formal.prove import default_formal_config, format_results
from mxu.verif.formal.sby import design_rtlil, run_proof
from mxu.verif.formal.units import proofs_for, small_config

# The soft-reset proofs, the quantized loads' (k-induction, the expander's
# covers searched to 20 cycles: 40 s on the small sizes) and the vector
# unit's (k-induction, 72 s with its covers under load) run in `slow`, to
# keep make test's proofs short; every unit keeps a short proof
# (k-induction) in make test, the DMA its load and its store (13 s and 14 s
# at 11f5a4d), the streams the compute engine's (13 s), and every mutant (the
# soft resets and the vector unit's among them) but the compute engine's (a
# 16-cycle bound, its array's latency), the load contexts' (a 12-cycle bound,
# 8 to 21 s) and the quantized load's (a 20-cycle bound with the expander,
# 103 s).
SLOW = {"dma.soft_reset_load", "dma.soft_reset_store", "dma.load_quant",
        "dma.soft_reset_load_quant", "streams.vector"}
SMALL = [p for p in proofs_for(small_config()) if p.name not in SLOW]
SMALL_SLOW = [p for p in proofs_for(small_config()) if p.name in SLOW]
SLOW_MUTANTS = {"compute_completes_every_row", "dma_beats_all_first",
                "dma_drops_quantized_rows_on_error"}
MUTANTS = [pytest.param(m, id=m.name, marks=[pytest.mark.slow] if m.name in SLOW_MUTANTS else [])
           for m in mutants(small_config())]


def _check_proof(proof, tmp_path):
    results = run_proof(proof, tmp_path / "work", traces=tmp_path / "traces")
    print(format_results(results))
    asserts = {r.property: r for r in results if r.kind == "assert"}
    covers = {r.property: r for r in results if r.kind == "cover"}
    assert asserts, f"{proof.name}: no assertion was checked"
    bad = [f"{r.property}: {r.result}" for r in results if not r.ok]
    assert not bad, f"{proof.name}: " + "; ".join(bad)
    # Every property has a cover of its own, reached; but induction lemmas and
    # "this channel is never used".
    lemmas = {name for name in asserts if ".inv." in name or name.endswith(".unused")}
    missing = sorted(set(asserts) - lemmas - set(covers))
    assert not missing, f"{proof.name}: asserts without a cover: {missing}"
    for r in covers.values():
        assert r.trace is not None and r.trace.exists(), f"{r.property}: no cover trace"


@pytest.mark.parametrize("proof", SMALL, ids=[p.name for p in SMALL])
def test_proof_small_chip(proof, tmp_path):
    _check_proof(proof, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("proof", SMALL_SLOW, ids=[p.name for p in SMALL_SLOW])
def test_proof_small_chip_slow(proof, tmp_path):
    _check_proof(proof, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("proof", proofs_for(default_formal_config()),
                         ids=[p.name for p in proofs_for(default_formal_config())])
def test_proof_default_widths(proof, tmp_path):
    _check_proof(proof, tmp_path)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_is_caught(mutant, tmp_path):
    results = run_proof(mutant.proof, tmp_path / "work", traces=tmp_path / "traces")
    failed = [r for r in results if r.kind == "assert" and r.result == "FAILED"]
    assert failed, f"{mutant.name}: the prover found no counterexample"
    caught = [r for r in failed if r.property.endswith(mutant.caught_by)]
    assert caught, (f"{mutant.name}: expected {mutant.caught_by} to fail, "
                    f"failed: {[r.property for r in failed]}")
    trace = caught[0].trace
    assert trace is not None and trace.exists(), f"{mutant.name}: no counterexample waveform"
    text = trace.read_text()
    assert "$var" in text and "#1" in text, f"{trace} is not a VCD with steps"


def test_property_names_survive_rtlil():
    """Every property cell is named after its message, covers and assumptions
    apart, so results carry the checkers' names."""
    text = design_rtlil(SMALL[[p.name for p in SMALL].index("regs.host")].design())
    assert "cell $check \\regs.host.b.valid_held\n" in text
    assert "cell $check \\regs.host.b.valid_held:cover\n" in text
    assert "cell $check \\regs.host.aw.valid_held:assume\n" in text


def test_proof_table_gives_each_proofs_kind():
    """`mxu prove`'s table of proofs: the k an induction succeeded at (the
    largest of its asserts'), a bounded proof's bound, a failed one as such."""
    from mxu.verif.formal.prove import format_proofs, proof_kind
    from mxu.verif.formal.sby import Proof, Result
    unbounded = Proof("x.unbounded", None, depth=4, cover_depth=8)
    bounded = Proof("x.bounded", None, depth=12, cover_depth=12, mode="bmc")
    broken = Proof("x.broken", None, depth=4, cover_depth=8)

    def row(proof, prop, kind, result, depth):
        return Result(proof.name, prop, kind, result, "smtbmc yices", depth, 1.0)
    results = [row(unbounded, "a.inv.one", "assert", "proved", "k=1"),
               row(unbounded, "a.rule", "assert", "proved", "k=3"),
               row(unbounded, "a.rule", "cover", "reached", "step 5"),
               row(bounded, "b.rule", "assert", "passed", "bound 12"),
               row(broken, "c.rule", "assert", "induction failed", "k=4")]
    assert proof_kind(unbounded, results) == "k = 3"
    assert proof_kind(bounded, results) == "bound 12"
    assert proof_kind(broken, results) == "NOT proved"
    table = format_proofs([unbounded, bounded], results, {"x.unbounded": 12.4})
    lines = table.splitlines()
    unbounded_line = next(line for line in lines if "x.unbounded" in line)
    assert "k = 3" in unbounded_line and "2/2" in unbounded_line and "1/1" in unbounded_line
    assert "12" in unbounded_line


def test_inner_names_a_missing_register():
    """A lemma that names a register the design does not have fails to
    elaborate with the name, not later in the prover."""
    from mxu.hdl.dma import DmaDir
    from mxu.verif.formal.units import dma_harness, inner
    harness = dma_harness(small_config(), DmaDir.STORE)
    design_rtlil(harness)
    dut = harness._dut
    assert len(inner(dut, "gearbox")["w_beat"]) == 8
    with pytest.raises(KeyError, match="gearbox assigns no signal 'no_such'"):
        inner(dut, "gearbox")["no_such"]
