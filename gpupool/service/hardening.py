"""Keep a shared service's secrets away from the jobs it starts, where the kernel lets us.

A job that runs as the service's own Unix user (``run_jobs_as: service``)
may read every ``/proc/<pid>/`` file of the service that the same user may:
its environment (``$GPUPOOL_ADMIN_TOKEN``) and its memory. Marking the
service not dumpable makes the kernel give those files to root, so a process
of the same user can no longer read them. Jobs start through ``execve``,
which makes them dumpable again: debuggers still work on jobs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

PR_SET_DUMPABLE = 4
log = logging.getLogger("gpupool.service")


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` on Linux; False (and a log line) where it is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        ok = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.warning("could not mark the scheduler not dumpable: jobs of its own user may read its environment")
    return ok
