"""mxu.synth: what the chip costs. Yosys and nextpnr flows and their reports."""
