"""Reap a Ray session's processes when the process that started it dies.

Ray fate-shares its raylet and GCS with the driver that started them, but
not the raylet's agents: after a SIGKILL of the driver, ``DashboardAgent``
and ``RuntimeEnvAgent`` notice that the raylet is gone, fail to exit and
ignore SIGTERM (Ray 2.60). A `Pod` that starts Ray therefore starts this
watcher beside it (`start_reaper`): a small process in a session of its
own that waits for the end of a pipe whose writing end only the driver
holds. The end comes when the driver closes it after ``ray.shutdown()`` or
when the driver dies, however; then the watcher kills (SIGKILL) every
process that still has a file of that Ray session open or names it on its
command line, and exits (docs/pod.md, "Lifetime").

    python -m mxu.sim.runtime.reaper SESSION_DIR DRIVER_PID   # stdin: the driver's pipe

The driver itself is spared: after a clean ``ray.shutdown()`` it still holds
some of the session's log files open.
"""

import os
import signal
import subprocess
import sys
import time

__all__ = ["start_reaper", "session_processes", "reap"]

# Ray's processes take a moment to notice the driver's death themselves; the
# watcher then retries for this long while any remain.
GRACE_SECONDS = 1.0
REAP_SECONDS = 10.0


def _mentions(pid, session_dir):
    """Whether process `pid` names `session_dir` on its command line or has
    a file under it open."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if session_dir.encode() in f.read():
                return True
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, fd)).startswith(session_dir + os.sep):
                    return True
            except OSError:
                continue
    except OSError:
        return False        # gone, or not ours to look at
    return False


def session_processes(session_dir, spare=()):
    """Pids of the processes that belong to the Ray session `session_dir`
    (this process and `spare` excluded)."""
    session_dir = os.path.realpath(session_dir)
    skip = {os.getpid(), *spare}
    return [int(p) for p in os.listdir("/proc")
            if p.isdigit() and int(p) not in skip and _mentions(int(p), session_dir)]


def reap(session_dir, spare=(), seconds=REAP_SECONDS):
    """SIGKILL the processes of `session_dir` (but `spare`) until none is
    left or `seconds` have passed; returns the pids still there (normally
    none)."""
    deadline = time.monotonic() + seconds
    while True:
        left = session_processes(session_dir, spare)
        if not left or time.monotonic() > deadline:
            return left
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def start_reaper(session_dir):
    """Start the watcher of the Ray session `session_dir`; returns the
    `Popen` whose stdin the caller keeps open while Ray runs (and closes
    after ``ray.shutdown()``). None where there is no /proc (not Linux)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    return subprocess.Popen([sys.executable, "-m", "mxu.sim.runtime.reaper", session_dir,
                             str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    session_dir, driver = argv[0], int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # a Ctrl-C of the driver's terminal
    sys.stdin.buffer.read()                          # until the driver closes it or dies
    time.sleep(GRACE_SECONDS)
    reap(session_dir, spare=(driver,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
