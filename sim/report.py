"""Plain-text tables, shared by the CLI, the benches and the synthesis reports;
and the stamp every bench result carries (docs/figures.md): the source's
commit, the machine and the command."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["format_table", "source_commit", "machine", "Results"]


def format_table(header, rows):
    """A plain-text table, columns padded to their widest cell."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# What makes a figure: the code and the packages it installs, not the docs or
# the results files themselves.
_CODE = ["hdl", "sim", "verif", "synth", "bench", "pyproject.toml", ":(exclude)bench/results"]


def source_commit(directory=Path(__file__).resolve().parent):
    """The git commit of the checkout the design's source comes from (12 hex
    digits, ``+dirty`` when tracked code -- not docs or results files --
    differs from it), or ``"unknown"`` outside a git checkout: every report
    names what it measured."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True,
                              timeout=30)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        top = git("rev-parse", "--show-toplevel")
        if head.returncode or top.returncode:
            return "unknown"
        changed = git("-C", top.stdout.strip(), "status", "--porcelain", "--untracked-files=no",
                      "--", *_CODE)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if changed.stdout.strip() else "")


def machine():
    """{"cpu": model name, "cores": logical CPUs this process may use, "load":
    the 1-minute load average when the results were written}: wall times
    depend on all three."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": cores, "load": load}


class Results:
    """A bench's results as data: the tables it prints, written to
    ``bench/results/<name>.json`` with the commit, the machine and the command
    (docs/figures.md). ``table`` prints a table and keeps it; ``write`` saves
    them all."""

    def __init__(self, name, directory=None, argv=None):
        self.name = name
        self.directory = Path(directory) if directory else Path(sys.argv[0]).resolve().parent / "results"
        argv = sys.argv if argv is None else argv
        self.command = " ".join(["python", f"bench/{Path(argv[0]).name}", *argv[1:]])
        self.tables = []

    def table(self, title, header, rows):
        """Print `title` and the table, and keep them for `write`."""
        print(title)
        print(format_table(header, rows), flush=True)
        self.tables.append({"title": title.strip(), "header": [str(h) for h in header],
                            "rows": [[str(c) for c in r] for r in rows]})

    def write(self):
        """Write ``<directory>/<name>.json``; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.name}.json"
        record = {"bench": self.name, "command": self.command, "commit": source_commit(),
                  "machine": machine(), "tables": self.tables}
        path.write_text(_dump(record))
        print(f"results: {path}")
        return path


def _dump(record):
    """`record` as JSON with each table row on a line of its own: small
    files whose diffs show the rows that changed."""
    head = {k: v for k, v in record.items() if k != "tables"}
    lines = [json.dumps(head, indent=1)[:-2] + ",", ' "tables": [']
    for i, t in enumerate(record["tables"]):
        rows = ",\n".join(f"    {json.dumps(r)}" for r in t["rows"])
        lines += ["  {", f'   "title": {json.dumps(t["title"])},',
                  f'   "header": {json.dumps(t["header"])},', '   "rows": [', rows, "   ]",
                  "  }" + ("," if i < len(record["tables"]) - 1 else "")]
    return "\n".join(lines + [" ]", "}"]) + "\n"
