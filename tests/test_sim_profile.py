"""The profiler (docs/profiler.md): a trace from the chip's own trace port whose
totals equal the chip's counters, valid Chrome trace-event JSON, a timeline
plot, and `mxu profile`."""

import json

import numpy as np
import pytest

from chip_configs import TINY
from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.cli import main
from mxu.sim.runtime.profile import TRACKS
from mxu.verif import golden

SEED = 20261127


@pytest.fixture(scope="module")
def traced():
    return Chip(TINY, trace=True)


def _profile(chip, M, K, N, seed=SEED):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    with chip.profile() as prof:
        C = chip.matmul(A, B)
    golden.assert_bits_equal(C, golden.matmul(A, B, rows=chip.config.rows), "traced matmul")
    return prof.trace


def _check_against_counters(trace):
    totals = trace.totals()
    for engine, t in totals.items():
        assert t["stall"] == trace.counters[f"{engine}_stall"], engine
        assert 0 < t["busy"] <= trace.cycles and t["idle"] >= 0
    halts = trace.programs
    assert sum(t["instructions"] for t in totals.values()) == trace.counters["instructions"] - halts
    assert trace.cycles == trace.counters["cycles"]
    rows = sum(e.end - e.start for e in trace.events if e.opcode == "MATMUL")
    assert rows >= trace.counters["array_active"]


def test_trace_totals_equal_the_counters(traced):
    trace = _profile(traced, 40, 30, 20)
    _check_against_counters(trace)
    starts = [e.start for e in trace.events]
    assert starts == sorted(starts)
    assert {e.track for e in trace.events} == set(trace.tracks) == set(TRACKS) - {"vector"}


def test_several_programs_make_one_trace(traced):
    rng = np.random.default_rng(SEED + 1)
    with traced.profile() as prof:
        for _ in range(2):
            traced.matmul(rng.standard_normal((9, 8)).astype(np.float32),
                          rng.standard_normal((8, 6)).astype(np.float32))
    trace = prof.trace
    assert trace.programs == 2 and {e.program for e in trace.events} == {0, 1}
    _check_against_counters(trace)


def test_chrome_trace_json_has_the_format(traced, tmp_path):
    trace = _profile(traced, 24, 20, 12)
    path = trace.save(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(trace.tracks) <= set(names.values())
    last_end = {}
    for e in events:
        if e["ph"] != "X":
            continue
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] > 0
        assert e["ts"] >= last_end.get(e["tid"], 0), "slices on a track must not overlap"
        last_end[e["tid"]] = e["ts"] + e["dur"]
    # Durations are the events': each instruction slice ends where its event ends.
    by_track = {}
    for e in trace.events:
        by_track.setdefault(e.track, []).append(e)
    for tid, track in names.items():
        if track not in trace.tracks:
            continue
        slices = [e for e in events if e["ph"] == "X" and e["tid"] == tid]
        assert [s["ts"] + s["dur"] for s in slices] == [e.end for e in by_track[track]]
        assert [s["args"]["pc"] for s in slices] == [e.pc for e in by_track[track]]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(0 <= c["args"]["utilization"] <= 1 for c in counters)
    ts = [c["ts"] for c in counters]
    assert ts == sorted(ts)


def test_timeline_plot(traced, tmp_path):
    png = _profile(traced, 24, 20, 12).plot(tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_needs_a_traced_chip():
    with pytest.raises(ValueError, match="trace=True"):
        Chip(TINY).profile()


def test_profile_report(traced, tmp_path, capsys):
    from mxu.sim.cli import print_profile
    out = tmp_path / "t.json"
    print_profile(_profile(traced, 20, 16, 8), json_path=out, png_path=tmp_path / "t.png")
    text = capsys.readouterr().out
    assert "top stalls" in text and "stall counter" in text and out.exists()
    assert (tmp_path / "t.png").exists()


def test_profile_command_checks_its_output_first(capsys):
    assert main(["profile", "--m", "2", "--k", "2", "--n", "2", "-o", "/nonexistent/x.json"]) == 2
    assert "/nonexistent" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_command(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["profile", "--m", "128", "--k", "384", "--n", "384", "-o", str(out),
                 "--png", str(tmp_path / "t.png")]) == 0
    assert "top stalls" in capsys.readouterr().out and out.exists()


@pytest.mark.slow
def test_the_default_chip_on_a_transformer_shape():
    trace = _profile(Chip(ChipConfig(), fast_mac=True, trace=True), 128, 384, 384)
    _check_against_counters(trace)
