"""`mxu.sim.progress`: a bar on a terminal, plain lines in plain mode, nothing
when off or (by default) when stderr is not a terminal."""

import io

import pytest

from mxu.sim import progress
from mxu.sim.progress import Progress, set_mode


@pytest.fixture(autouse=True)
def _mode():
    yield
    set_mode(None)


def _run(steps=4, total=4, **kw):
    out = io.StringIO()
    with Progress("decode", total, stream=out, **kw) as bar:
        for _ in range(steps):
            bar.advance()
    return out.getvalue()


def test_quiet_off_a_terminal_by_default(monkeypatch):
    monkeypatch.delenv("MXU_PROGRESS", raising=False)
    assert _run() == ""
    set_mode("off")
    assert _run(show=None) == ""
    assert _run(show=False) == ""


def test_plain_lines_give_the_count_and_the_time_left(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_SECONDS", 0.0)
    set_mode("plain")
    lines = _run().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("mxu: decode: 1/4 steps, 0s elapsed")
    assert lines[-1].endswith(", done")
    # Shown on request whatever the mode; a last line when the work ends early.
    set_mode("off")
    assert _run(steps=2, show=True).splitlines()[-1].startswith("mxu: decode: 2/4 steps")


def test_bad_mode():
    with pytest.raises(ValueError, match="progress mode must be one of"):
        set_mode("loud")
