"""A one-line live status for long builds: what is built, the phase, the elapsed
time. On a terminal it is a `rich` status line; elsewhere (logs, pytest) one
plain line when the build starts and one when it ends."""

import sys
import time

__all__ = ["BuildStatus"]


def _elapsed(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class _Line:
    """A renderable that `rich` re-renders on every refresh, so the elapsed time
    moves even while a phase runs for minutes."""

    def __init__(self, what):
        self.what, self.phase, self.start = what, "starting", time.monotonic()

    def __rich__(self):
        return (f"[bold]building {self.what}[/] · {self.phase} · "
                f"{_elapsed(time.monotonic() - self.start)} (first use of this configuration)")


class BuildStatus:
    """Context manager; call the object with a phase name as the build proceeds."""

    def __init__(self, what, cache_dir, stream=None):
        self.what, self.cache_dir = what, cache_dir
        self.stream = stream or sys.stderr
        self.line = _Line(what)
        self._live = None

    def __enter__(self):
        if self.stream.isatty():
            from rich.console import Console
            self._live = Console(file=self.stream).status(self.line)
            self._live.__enter__()
        else:
            print(f"mxu: building {self.what} (first use of this configuration; this takes "
                  f"a while)", file=self.stream, flush=True)
        return self

    def __call__(self, phase):
        self.line.phase = phase
        if self._live is not None:
            self._live.update(self.line)

    def __exit__(self, kind, error, tb):
        if self._live is not None:
            self._live.__exit__(kind, error, tb)
        took = _elapsed(time.monotonic() - self.line.start)
        verdict = "built" if kind is None else "failed to build"
        print(f"mxu: {verdict} {self.what} in {took}; cached in {self.cache_dir} "
              f"(`mxu cache --info`, `mxu cache --clear`)", file=self.stream, flush=True)
        return False
