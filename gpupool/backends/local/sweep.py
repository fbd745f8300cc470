"""Find and end every process an attempt started, including those that left its process group.

Why: a job's processes are signalled as one process group, but any of them can
leave it (``setsid``, a daemonising library, ``nohup … &`` under a new
session) and would then outlive the attempt, keep running on a GPU that the
scheduler gives to the next job, and ignore a cancel. So each attempt's
environment carries one variable, ``GPUPOOL_RUN_ID``, whose value names the
attempt (its run-file prefix, unique to the service's state directory, the job
and the attempt). Every process the job starts inherits it; when the attempt
is settled, the service ends every process whose environment holds it.

What it cannot see (docs/service.md says so): a process that execs with an
emptied environment (``env -i``). A cgroup per attempt would catch that too;
the local executor does not make one today.

Reading another account's ``/proc/<pid>/environ`` needs root, or the same
account: a root service reads its users' jobs, a service running as one
account reads the jobs it runs as that account. Zombies have no environment
left and need no killing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

RUN_ID = "GPUPOOL_RUN_ID"
_KEY = RUN_ID.encode() + b"="


def run_id_of(pid: int) -> str | None:
    """The ``GPUPOOL_RUN_ID`` a process was started with, or None (none, gone, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for entry in data.split(b"\0"):
        if entry.startswith(_KEY):
            return entry[len(_KEY):].decode(errors="replace")
    return None


def marked(match: Callable[[str], bool]) -> dict[int, str]:
    """Live processes whose run id satisfies ``match``: pid -> run id (this process never included)."""
    out: dict[int, str] = {}
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid == me:
            continue
        run_id = run_id_of(pid)
        if run_id is not None and match(run_id):
            out[pid] = run_id
    return out


def kill_marked(match: Callable[[str], bool], rounds: int = 20) -> int:
    """SIGKILL every process whose run id satisfies ``match``, again until none is left. How many were killed.

    Several rounds because a process may fork between a scan and its kill;
    each round kills what the last one found, so the tree shrinks to nothing.
    """
    killed: set[int] = set()
    for n in range(rounds):
        found = marked(match)
        if not found:
            break
        if n:
            time.sleep(0.01)  # a process killed last round may still be tearing down
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return len(killed)
