"""Is a run's worker process still alive? (pid + host recorded by the store when a run starts)."""
from __future__ import annotations

import os
import socket


def this_host() -> str:
    return socket.gethostname()


def worker_gone(run: dict, is_alive=None) -> bool:
    """A 'running' run whose worker process (on this host; runs of other hosts are never judged)
    has ended. Without ``is_alive``, a pid that now belongs to a process started after the run
    started (the pid was reused) counts as ended too."""
    if run.get("status") != "running":
        return False
    host = run.get("host")
    if host is not None and host != this_host():
        return False
    if not run.get("pid"):
        return True
    if is_alive is not None:
        return not is_alive(run["pid"])
    return not pid_alive(run["pid"], since=run.get("started_at"))


def dead_message(run: dict) -> str:
    return f"worker process {run.get('pid')} ended without finishing the run"


def pid_alive(pid: int, since: float | None = None) -> bool:
    """True while process ``pid`` exists and is not a zombie; with ``since`` (a time.time()), also
    False when the process started later than that (so it is not the one that was recorded)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().split(")")[-1].split()
    except OSError:
        return True  # no /proc (e.g. macOS): kill(pid, 0) is all we know
    if fields[0] == "Z":  # a zombie (exited child not yet reaped) is not alive
        return False
    if since is not None:
        started = process_start_time(int(fields[19]))
        if started is not None and started > since + 2.0:  # 2 s: tick rounding and clock skew
            return False
    return True


def process_start_time(start_ticks: int) -> float | None:
    """A /proc/<pid>/stat start time (clock ticks since boot) as a time.time() value."""
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
