"""`mxu.synth.flow.Phases`: each phase says what runs and for how long, and a
phase run again with the same key shows the time left from the last run
(docs/runtime.md, "Progress")."""

import io
import json

from mxu.synth.flow import Phases, _live_text, last_phase_seconds, record_phase_seconds


def test_a_keyed_phase_records_its_time_and_the_next_run_shows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MXU_CACHE", str(tmp_path / "cache"))
    assert last_phase_seconds("export chip X") is None
    out = io.StringIO()
    phases = Phases(out, live=False)
    assert phases.run("elaborate", lambda x: x + 1, 1, key="export chip X") == 2
    recorded = json.loads((tmp_path / "cache" / "phase_seconds.json").read_text())
    assert list(recorded) == ["export chip X"] and recorded["export chip X"] >= 0
    assert "(the last run took" not in out.getvalue()
    record_phase_seconds("export chip X", 125.0)
    out = io.StringIO()
    Phases(out, live=False).run("elaborate", lambda: None, key="export chip X")
    assert "mxu synth: elaborate ... (the last run took 2:05)" in out.getvalue()
    # A phase without a key records nothing and reads nothing.
    Phases(io.StringIO(), live=False).run("other", lambda: None)
    assert last_phase_seconds("other") is None


def test_the_live_line_counts_down_from_the_last_run():
    assert _live_text("elaborate", 30, None) == "elaborate  30 s"
    assert _live_text("elaborate", 30, 150) == "elaborate  30 s, about 2:00 left"
    assert _live_text("elaborate", 160, 150) == "elaborate  2:40, 10 s over the last run's 2:30"


def test_an_unwritable_record_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MXU_CACHE", str(blocker / "cache"))
    record_phase_seconds("k", 3.0)          # must not raise
    assert last_phase_seconds("k") is None
