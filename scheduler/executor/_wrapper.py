"""Process wrapper the local executor starts each job through.

``python -m scheduler.executor._wrapper RUN_PREFIX -- COMMAND...``

Why a wrapper: the service may be killed at any moment, and must still learn
later whether a job's command ran and how it ended. So the wrapper

1. claims the launch ticket ``RUN_PREFIX.launch`` by renaming it to
   ``RUN_PREFIX.claimed`` (atomic). If the ticket is gone, the service revoked
   it during a crash recovery and the command must not run: exit 75.
2. writes ``RUN_PREFIX.pid`` (its pid and /proc start time),
3. runs the command as a child, surviving SIGTERM itself (the signal reaches
   the whole process group, so the command gets it too),
4. writes the command's exit status to ``RUN_PREFIX.exit`` (atomically) and
   exits with it.

A negative status means the command died of that signal (Python convention).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

REVOKED_EXIT = 75


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return int(data[data.rindex(")") + 2 :].split()[19])


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m scheduler.executor._wrapper RUN_PREFIX -- COMMAND...", file=sys.stderr)
        return 2
    prefix, command = argv[0], argv[2:]
    try:
        os.rename(prefix + ".launch", prefix + ".claimed")
    except FileNotFoundError:
        print("gpupool: launch revoked by the scheduler; not starting", file=sys.stderr)
        return REVOKED_EXIT
    try:
        start = _start_time(os.getpid())
    except (OSError, ValueError, IndexError):
        start = 0
    _write_atomic(prefix + ".pid", f"{os.getpid()} {start}\n")
    # A Python handler (not SIG_IGN, which exec would pass on to the child)
    # keeps the wrapper alive long enough to record the command's status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        print(f"gpupool: cannot start {command[0]!r}: {e}", file=sys.stderr, flush=True)
        _write_atomic(prefix + ".exit", "127\n")
        return 127
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    _write_atomic(prefix + ".exit", f"{code}\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
