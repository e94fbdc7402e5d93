"""Bench results as data (docs/testing.md, "Figures"): `Results` writes a
bench's tables with the commit, the machine and the command;
`bench/figures.py --check` holds docs/figures.md and every marked figure of
README.md and docs/ to the committed results, and fails on a disagreement."""

import importlib.util
import json
from pathlib import Path

from mxu.sim.report import Results, machine, source_commit

_PATH = Path(__file__).resolve().parents[1] / "bench" / "figures.py"
_spec = importlib.util.spec_from_file_location("bench_figures", _PATH)
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_results_are_stamped_with_commit_machine_and_command(tmp_path, capsys):
    r = Results("demo", directory=tmp_path, argv=["/x/bench/demo.py", "--quick"])
    r.table("\nA table", ["case", "cycles"], [["one", "1,234"], ["two", 5]])
    path = r.write()
    assert "A table" in capsys.readouterr().out
    record = json.loads(path.read_text())
    assert path == tmp_path / "demo.json" and record["command"] == "python bench/demo.py --quick"
    assert record["commit"] == source_commit()
    assert record["machine"]["cpu"] == machine()["cpu"] and record["machine"]["cores"] >= 1
    assert record["machine"]["load"] >= 0
    assert record["tables"] == [{"title": "A table", "header": ["case", "cycles"],
                                 "rows": [["one", "1,234"], ["two", "5"]]}]


def test_the_docs_agree_with_the_results():
    """`python bench/figures.py --check` on the repository."""
    problems = figures.check(figures.load_results())
    assert not problems, "\n".join(problems)


def test_a_figure_that_disagrees_fails_naming_file_line_and_values(tmp_path):
    results = figures.load_results()
    key, (headline, value, _) = next(iter(figures.values(results).items()))
    doc = tmp_path / "doc.md"
    doc.write_text(f"agrees: {value}<!--fig:{key}-->\nstale: 1,234,567<!--fig:{key}-->\n"
                   f"unknown: 5<!--fig:no.such.figure-->\n")
    problems = figures.check_markers(figures.values(results), [doc], root=tmp_path)
    assert len(problems) == 2
    assert problems[0] == (f"doc.md:2: {key} is stated as 1,234,567, the results say {value} "
                           f"(bench/results/{headline.bench}.json)")
    assert problems[1].startswith("doc.md:3: no headline 'no.such.figure'")


def test_a_missing_cell_or_results_file_is_named():
    results = figures.load_results()
    h = figures.HEADLINES[0]
    missing = {k: v for k, v in results.items() if k != h.bench}
    assert figures.check(missing) == [f"{h.key}: no bench/results/{h.bench}.json (run the bench)"]
    empty = {**results, h.bench: {**results[h.bench], "tables": []}}
    assert figures.check(empty)[0].startswith(f"{h.key}: no row")


def test_every_bench_writes_its_results():
    """Each bench keeps its printed tables as data (`Results`), except the
    cycle guard, whose data is bench/cycles.json, and this page's generator."""
    bench = _PATH.parent
    exempt = {"cycles.py", "figures.py"}
    missing = [p.name for p in sorted(bench.glob("*.py"))
               if p.name not in exempt and "Results(" not in p.read_text()]
    assert not missing, f"benches that write no bench/results/<name>.json: {missing}"
