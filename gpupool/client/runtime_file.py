"""Runtime files: how `gpupool` finds a scheduler that picked its own port and token.

A scheduler started by ``scripts/run`` (inside JupyterLab) or by ``gpupool
serve --port 0`` listens on a random port with a token the user never saw.
Like Jupyter's ``jpserver-<pid>.json``, each running scheduler writes
``scheduler-<pid>-<port>.json`` (URL, token, user, pid, start time) into a per-user
runtime directory, readable by its owner only, and removes it on a clean stop.
The client reads the newest file whose process is still alive, so commands
work with no flags; explicit flags, the environment and ``gpupool login``'s
config still come first (see :func:`gpupool.client.resolve_connection`).

The file holds a token, so: the directory is made 0700, the file is written
0600 through a temporary name and renamed (no reader sees half a file, no
moment where it is readable by others), and files not owned by this user are
never trusted. Stale files (the process died without cleaning up: kill -9, a
crash, a reboot) are skipped and removed. A process id alone does not prove the
writer still runs, since ids are reused: on Linux the file also records its
writer's start time (in clock ticks since boot, which no clock change moves),
and a live process with that id but another start time is somebody else.

Imported by every CLI call: only ``json``, ``os``, ``time`` and :mod:`gpupool.procstat` here.
"""

from __future__ import annotations

import json
import os
import time

from gpupool.procstat import start_ticks

PREFIX = "scheduler-"
SUFFIX = ".json"


def runtime_dir() -> str:
    """Where runtime files live for this user.

    ``$GPUPOOL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/gpupool`` (the per-login
    tmpfs on systemd machines), else ``$XDG_DATA_HOME/gpupool/runtime``
    (``~/.local/share/gpupool/runtime``), as Jupyter keeps its own under its data dir.
    """
    explicit = os.environ.get("GPUPOOL_RUNTIME_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg_runtime = os.environ.get("XDG_RUNTIME_DIR")
    if xdg_runtime and os.path.isabs(xdg_runtime):
        return os.path.join(xdg_runtime, "gpupool")
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "gpupool", "runtime")


def path_for(url: str, pid: int | None = None) -> str:
    """The runtime file of the scheduler at ``url`` in process ``pid`` (this one by default).

    The port is in the name too: one process may run several schedulers (tests do).
    """
    port = "".join(c for c in url.rsplit(":", 1)[-1] if c.isdigit()) or "0"
    return os.path.join(runtime_dir(), f"{PREFIX}{os.getpid() if pid is None else pid}-{port}{SUFFIX}")


def write(url: str, token: str | None, **extra: object) -> str:
    """Publish the scheduler at ``url`` run by this process (replacing its earlier file); returns the path."""
    directory = runtime_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.name == "posix":
        if os.stat(directory).st_uid != os.getuid():
            raise PermissionError(f"{directory} belongs to another user; not writing a token there")
        os.chmod(directory, 0o700)  # an existing dir made with a looser umask
    info: dict[str, object] = {"url": url, "token": token, "pid": os.getpid(), "started": time.time(), **extra}
    ticks = start_ticks(os.getpid())
    if ticks is not None:
        info["process_start"] = ticks
    path = path_for(url)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    return path


def remove(path: str) -> None:
    """Withdraw a runtime file (a clean stop)."""
    _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but another user's
    except OSError:
        return False
    return True


def writer_alive(info: dict[str, object]) -> bool:
    """Whether the process that wrote this runtime file still runs (not just some process with its id)."""
    pid = info.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    recorded = info.get("process_start")
    if not isinstance(recorded, int):
        return True  # written where /proc was unreadable: the id is all there is
    now = start_ticks(pid)
    return now is None or now == recorded


def running() -> list[dict[str, object]]:
    """Live schedulers of this user, newest first; each dict also carries its ``path``.

    Files whose writer is gone (dead, or its id now another process's) are
    removed on the way; unreadable ones or ones owned by someone else are ignored.
    """
    directory = runtime_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
            continue
        path = os.path.join(directory, name)
        try:
            if os.name == "posix" and os.stat(path).st_uid != os.getuid():
                continue
            with open(path) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or not isinstance(info.get("url"), str):
            continue
        if not writer_alive(info):
            _unlink(path)
            continue
        info["path"] = path
        found.append(info)
    found.sort(key=lambda i: float(i.get("started") or 0), reverse=True)
    return found


def newest() -> dict[str, object] | None:
    """The most recently started live scheduler of this user, or None."""
    live = running()
    return live[0] if live else None
