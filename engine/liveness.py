"""Is a run's worker process still alive? (pid + host recorded by the store when a run starts)."""
from __future__ import annotations

import os
import socket


def this_host() -> str:
    return socket.gethostname()


def worker_gone(run: dict, is_alive=None) -> bool:
    """A 'running' run whose worker process (on this host; runs of other hosts are never judged)
    has ended."""
    if run.get("status") != "running":
        return False
    host = run.get("host")
    if host is not None and host != this_host():
        return False
    return not run.get("pid") or not (is_alive or pid_alive)(run["pid"])


def dead_message(run: dict) -> str:
    return f"worker process {run.get('pid')} ended without finishing the run"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited child not yet reaped) is not alive
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
