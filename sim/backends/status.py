"""A one-line live status for long builds: what is built, the phase, the elapsed
time. On a terminal it is a `rich` status line; elsewhere (logs, pytest) one
plain line when the build starts and one when it ends."""

import sys
import time

from ..progress import get_mode

__all__ = ["BuildStatus"]


def _elapsed(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _left(expected, start):
    """"about 1m20s left" from the last build's time, or "" without one."""
    if not expected:
        return ""
    left = expected - (time.monotonic() - start)
    return f"about {_elapsed(left)} left" if left > 0 else "longer than the last build"


class _Line:
    """A renderable that `rich` re-renders on every refresh, so the elapsed time
    moves even while a phase runs for minutes."""

    def __init__(self, what, expected=None):
        self.what, self.phase, self.start = what, "starting", time.monotonic()
        self.expected = expected

    def __rich__(self):
        left = _left(self.expected, self.start)
        return (f"[bold]building {self.what}[/] · {self.phase} · "
                f"{_elapsed(time.monotonic() - self.start)}" + (f", {left}" if left else "") +
                " (first use of this configuration)")


class BuildStatus:
    """Context manager; call the object with a phase name as the build proceeds."""

    def __init__(self, what, cache_dir, stream=None, expected=None):
        self.what, self.cache_dir = what, cache_dir
        self.stream = stream or sys.stderr
        self.line = _Line(what, expected)
        self._live = None
        self.quiet = get_mode() == "off"

    def __enter__(self):
        if self.quiet:
            pass
        elif self.stream.isatty():
            from rich.console import Console
            self._live = Console(file=self.stream).status(self.line)
            self._live.__enter__()
        else:
            last = self.line.expected
            print(f"mxu: building {self.what} (first use of this configuration; "
                  + (f"the last build of it took {_elapsed(last)})" if last else "this takes a while)"),
                  file=self.stream, flush=True)
        return self

    def __call__(self, phase):
        self.line.phase = phase
        if self._live is not None:
            self._live.update(self.line)

    def __exit__(self, kind, error, tb):
        if self._live is not None:
            self._live.__exit__(kind, error, tb)
        if self.quiet:
            return False
        took = _elapsed(time.monotonic() - self.line.start)
        verdict = "built" if kind is None else "failed to build"
        print(f"mxu: {verdict} {self.what} in {took}; cached in {self.cache_dir} "
              f"(`mxu cache --info`, `mxu cache --clear`)", file=self.stream, flush=True)
        return False
