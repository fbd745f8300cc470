"""The core's state directory: made private (or passable for jobs of other accounts) and locked for its life."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import IO

from gpupool.wire.errors import InvalidRequest, Unavailable


def prepare_state_dir(state_dir: Path, jobs_enter: bool) -> None:
    """Make the state directory, private to the service's account.

    ``jobs_enter``: jobs run as their owners' accounts (a root service) and
    must enter the state dir to reach their own job's directory: 0711 lets
    them in but not list it (every secret in it is a 0600 file), and a state
    dir below a folder they cannot pass through is refused now, not at the
    first job.
    """
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state_dir, 0o711 if jobs_enter else 0o700)
    if jobs_enter:
        check_reachable(state_dir)


def check_reachable(directory: Path) -> None:
    """Refuse a state directory that jobs running as other accounts could not enter.

    Each job's account must pass through every parent of its job directory:
    they all need the search bit for others (as ``/var/lib`` has, and
    ``/root`` has not).
    """
    for parent in [directory, *directory.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            raise InvalidRequest(
                f"jobs run as their owners' accounts cannot reach {directory}: {parent} is mode "
                f"{stat.S_IMODE(mode):04o} (others may not enter it); choose a state directory such as "
                "/var/lib/gpupool, or run_jobs_as 'service'")


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold an exclusive lock on ``<state_dir>/service.lock`` for the core's lifetime.

    Two services on one state dir would both start jobs on the same GPUs. The
    kernel drops the lock when the process dies (kill -9 included), so a crash
    never leaves a stale lock behind.
    """
    f = open(state_dir / "service.lock", "a+")  # kept open: the lock lives as long as this file
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise Unavailable(f"another gpupool scheduler (pid {holder}) is using the state directory {state_dir}") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
