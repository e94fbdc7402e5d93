"""`mxu.sim.progress`: a bar on a terminal, plain lines in plain mode, nothing
when off or (by default) when stderr is not a terminal."""

import io
import re

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


class _Terminal(io.StringIO):
    """One terminal for stdout and stderr: what a user sees, escapes and all."""

    def isatty(self):
        return True


_STATUS = re.compile(r"\x1b\[K|\x1b7.*?\x1b8", re.S)


def test_streamed_text_on_a_terminal_is_never_broken():
    """With `text`, a terminal gets a status after the text's last character,
    erased before each piece: without the statuses the text is whole."""
    tty = _Terminal()
    with Progress("decode", 4, stream=tty, text=tty) as bar:
        for piece in ("The", " capital", " is", " Paris"):
            bar.advance()
            with bar.aside(piece):
                tty.write(piece)
    out = tty.getvalue()
    assert _STATUS.sub("", out) == "The capital is Paris"
    statuses = re.findall(r"\x1b7(.*?)\x1b8", out, re.S)
    assert "decode: 1/4 steps" in statuses[0] and "decode: 4/4 steps" in statuses[-1]
    # No line wrap while a status is drawn, so it never scrolls the screen.
    assert all(s.startswith("\x1b[?7l") and s.endswith("\x1b[?7h") for s in statuses)
    assert out.endswith("\x1b[K")                  # the last status is erased


def test_plain_lines_wait_for_the_streamed_line_to_end(monkeypatch, tmp_path):
    """In plain mode a progress line never lands inside a line of streamed
    text written to the same place; to another file it goes at once."""
    monkeypatch.setattr(progress, "PLAIN_EVERY_SECONDS", 0.0)
    set_mode("plain")
    log = io.StringIO()                             # stdout and stderr in one log
    with Progress("decode", 3, stream=log, text=log) as bar:
        bar.advance()
        with bar.aside("Paris"):
            log.write("Paris")
        bar.advance()
        with bar.aside(" is.\n"):
            log.write(" is.\n")
        bar.advance()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("mxu: decode: 1/3 steps") and lines[1] == "Paris is."
    assert lines[2].startswith("mxu: decode: 3/3 steps") and len(lines) == 3
    with open(tmp_path / "out", "w") as text, open(tmp_path / "err", "w") as err:
        with Progress("decode", 2, stream=err, text=text) as bar:
            with bar.aside("Paris"):
                text.write("Paris")
            bar.advance()
    assert (tmp_path / "err").read_text().startswith("mxu: decode: 1/2 steps")
