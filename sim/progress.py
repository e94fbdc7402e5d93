"""Progress of long steps on stderr: a `rich` bar with the time left on a
terminal; elsewhere nothing, or, in ``plain`` mode (`mxu demo`), a line now
and then with the time left. ``mxu ... --quiet`` and ``set_mode("off")``
silence it (docs/runtime.md, "Progress").

>>> with Progress("decode", total=16, unit="step") as bar:
...     for step in range(16):
...         bar.advance()
"""

import contextlib
import os
import sys
import time

__all__ = ["Progress", "set_mode", "get_mode", "MODES"]

MODES = ("auto", "plain", "off")
# Plain mode prints a line at most this often (and at the end).
PLAIN_EVERY_SECONDS = 5.0
_state = {"mode": None}


def set_mode(mode):
    """"auto" (a bar on a terminal, nothing elsewhere), "plain" (a bar on a
    terminal, plain lines elsewhere) or "off"; None goes back to
    ``$MXU_PROGRESS`` (default "auto")."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"progress mode must be one of {MODES}, not {mode!r}")
    _state["mode"] = mode


def get_mode():
    mode = _state["mode"] or os.environ.get("MXU_PROGRESS", "auto")
    return mode if mode in MODES else "auto"


def _clock(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    """Progress of `total` units of work called `label`.

    `show`: None follows the mode (`set_mode`); True shows it even when
    stderr is not a terminal (plain lines there); False shows nothing.
    ``advance(n, label=None)`` after each unit (a new label names the phase:
    "prefill", "decode"); ``close()`` or the end of a ``with`` block ends it.

    `text`: a file (stdout) the caller streams text to while the work runs,
    each piece inside ``with bar.aside(piece):`` (`CausalLM.generate`'s
    `stream`). The display then never breaks that text: on a terminal it is
    a status after the text's last character, erased before the next piece
    (no bar below: a bar would split the text's line); in plain mode its
    lines wait for the text to end a line, unless the text goes to another
    file than the progress.
    """

    def __init__(self, label, total, unit="step", show=None, stream=None, text=None):
        self.label, self.total, self.unit = label, max(int(total), 1), unit
        self.stream = stream or sys.stderr
        self.done, self.start = 0, time.monotonic()
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        mode = get_mode()
        if show is False or (show is None and mode == "off"):
            self.kind = None
        elif tty:
            self.kind = "live" if text is None else "inline"
        elif show is True or mode == "plain":
            self.kind = "plain"
        else:
            self.kind = None
        # In plain mode, whether a line of streamed text is open, and whether
        # a progress line in the middle of it would break it.
        self._text_open = False
        self._text_shared = text is not None and _same_file(text, self.stream)
        self._bar = self._task = None
        self._printed, self._shown = self.start, 0
        if self.kind == "live":
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                            console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=self.total)

    def eta(self):
        """Seconds left at the rate so far (None before the first unit)."""
        if not self.done:
            return None
        return (time.monotonic() - self.start) / self.done * (self.total - self.done)

    def advance(self, n=1, label=None):
        self.done = min(self.done + n, self.total)
        if label is not None:
            self.label = label
        if self.kind == "live":
            self._bar.update(self._task, completed=self.done, description=self.label)
        elif self.kind == "inline":
            self._status()
        elif self.kind == "plain" and not self._held():
            now = time.monotonic()
            if now - self._printed >= PLAIN_EVERY_SECONDS or self.done == self.total:
                self._line(now)

    def _held(self):
        return self._text_shared and self._text_open

    @contextlib.contextmanager
    def aside(self, text):
        """The caller writes streamed `text` inside the block; the display
        steps aside (see the class)."""
        if self.kind == "inline":
            self._erase()
        try:
            yield
        finally:
            if text:
                self._text_open = not text.endswith("\n")
            if self.kind == "inline":
                # The caller's text must reach the terminal before the status.
                for f in (sys.stdout, self.stream):
                    f.flush()
                self._status()

    # A terminal's status after the streamed text: save the cursor, no line
    # wrap (a status past the right margin is cut, and never scrolls the
    # screen under the saved cursor), dim text, then back to the text's end.
    _SAVE, _RESTORE, _ERASE = "\x1b7", "\x1b8", "\x1b[K"
    _NO_WRAP, _WRAP, _DIM, _PLAIN = "\x1b[?7l", "\x1b[?7h", "\x1b[2m", "\x1b[0m"

    def _status(self):
        left = self.eta()
        text = (f"  [{self.label}: {self.done}/{self.total} {self.unit}s, "
                f"{_clock(time.monotonic() - self.start)}" +
                (f", about {_clock(left)} left]" if left else "]"))
        self.stream.write(self._ERASE + self._SAVE + self._NO_WRAP + self._DIM + text +
                          self._PLAIN + self._WRAP + self._RESTORE)
        self.stream.flush()

    def _erase(self):
        self.stream.write(self._ERASE)
        self.stream.flush()

    def _line(self, now):
        self._printed, self._shown = now, self.done
        left = self.eta()
        print(f"mxu: {self.label}: {self.done}/{self.total} {self.unit}s, "
              f"{_clock(now - self.start)} elapsed" +
              (f", about {_clock(left)} left" if left else "") +
              ("" if self.done < self.total else ", done"), file=self.stream, flush=True)

    def __call__(self):
        """One unit done (the callback form the encoder's programs call)."""
        self.advance()

    def close(self):
        """End the display (idempotent); in plain mode a last line if the last
        one is stale."""
        if self.kind == "plain" and self.done and self._shown != self.done and not self._held():
            self._line(time.monotonic())
        elif self.kind == "inline":
            self._erase()
        self.kind = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _same_file(a, b):
    """Whether two open files write to the same place (a terminal, or one log
    for stdout and stderr); True when it cannot be told."""
    try:
        x, y = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):
        return True
    return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)
