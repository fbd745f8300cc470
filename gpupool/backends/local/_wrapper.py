"""Process wrapper the local executor starts each job through.

``python -m gpupool.backends.local._wrapper RUN_PREFIX [--as UID:GID:GROUPS --workdir DIR] [--gang SPEC] -- COMMAND...``

Why a wrapper: the service may be killed at any moment, and must still learn
later whether a job's command ran and how it ended. So the wrapper

1. claims the launch ticket ``RUN_PREFIX.launch`` by renaming it to
   ``RUN_PREFIX.claimed`` (atomic). If the ticket is gone, the service revoked
   it during a crash recovery and the command must not run: exit 75.
2. writes ``RUN_PREFIX.pid`` (its pid and /proc start time),
3. runs the command as a child. The service asks an attempt to stop by
   sending SIGTERM to the wrapper alone; the wrapper survives it and decides,
   at one instant, whether the stop reached the command: if the command has
   not ended yet, the wrapper passes SIGTERM on to its whole process group and
   notes that it did; if the command had already ended on its own, the stop
   came too late and is not passed on,
4. writes the command's exit status to ``RUN_PREFIX.exit`` (atomically), with a
   second line ``stopped`` (the stop reached the command) or ``ended`` (the
   command ended on its own), and exits with it.

Why the second line: a job whose command exits just before a pause, a
reclaim or a cancel reaches it has finished. Its recorded status must win
over the stop (the job ends ``succeeded``/``failed`` and never runs again),
while a command that exits because it was stopped (a checkpoint on SIGTERM,
status 0 included) is paused and resumed. Only the wrapper can tell the two
apart without a race, since it both reaps the command and passes the signal on.

The command's environment is not the wrapper's: the service writes it to
``RUN_PREFIX.env`` (JSON, in its private run/ directory) and starts the
wrapper isolated (``python -I``, a fixed PATH and locale). The wrapper hands
that environment to the command's process only, which applies it at exec,
after it became the job's account. So nothing a user puts in a job's
environment (``PYTHONPATH``, ``LD_PRELOAD``, ``PATH``...) is read or run by a
process with the service's privileges.

With ``--as`` (the service runs as root and runs each job as its owner's
Unix account), the wrapper stays root, so that the run files above stay out
of the job's reach, and starts the command as that account: its groups, gid
and uid are set, then the working directory ``--workdir`` is made and entered
as the account, so a job can only work where its owner may.

With ``--gang`` (a multi-node gang's attempt) the wrapper runs one copy of
the command per replica the spec file names, each with its own environment,
under the same ticket, pid file and exit file: :mod:`gpupool.backends.local.gang`.

A negative status means the command died of that signal (Python convention).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

from gpupool.procstat import start_ticks

REVOKED_EXIT = 75
STOPPED, ENDED = "stopped", "ended"


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _parse(argv: list[str]) -> tuple[str, dict[str, str], list[str]] | None:
    """``RUN_PREFIX [--as X --workdir D] -- COMMAND...`` -> (prefix, options, command)."""
    if "--" not in argv[1:]:
        return None
    cut = argv.index("--", 1)
    prefix, opts, command = argv[0], argv[1:cut], argv[cut + 1 :]
    if not command or len(opts) % 2 or any(k not in ("--as", "--workdir", "--gang") for k in opts[::2]):
        return None
    return prefix, dict(zip(opts[::2], opts[1::2], strict=True)), command


def _job_env(prefix: str) -> dict[str, str]:
    """The command's environment, as the service wrote it to ``RUN_PREFIX.env``; ValueError if unreadable."""
    try:
        with open(prefix + ".env") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the job's environment from {prefix}.env: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{prefix}.env holds no environment")
    return {str(k): str(v) for k, v in data.items()}


def _as_account(spec: str, workdir: str) -> Callable[[], None]:
    """A ``preexec_fn`` for the command: become the account (groups, gid, uid), then make and enter the workdir."""
    uid, gid, groups = spec.split(":")
    extra = [int(g) for g in groups.split(",") if g]

    def become() -> None:
        try:
            os.setgroups(extra)
            os.setgid(int(gid))
            os.setuid(int(uid))
        except OSError as e:
            os.write(2, f"gpupool: cannot switch to uid {uid}: {e}\n".encode())
            os._exit(126)
        try:
            os.makedirs(workdir, exist_ok=True)
            os.chdir(workdir)
        except OSError as e:  # the owner may not work there: the job fails, its log says why
            os.write(2, f"gpupool: working directory {workdir}: {e.strerror} (as uid {uid})\n".encode())
            os._exit(126)

    return become


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print("usage: python -m gpupool.backends.local._wrapper RUN_PREFIX [--as UID:GID:GROUPS --workdir DIR] "
              "[--gang SPEC] -- COMMAND...", file=sys.stderr)
        return 2
    prefix, opts, command = parsed
    try:
        os.rename(prefix + ".launch", prefix + ".claimed")
    except FileNotFoundError:
        print("gpupool: launch revoked by the scheduler; not starting", file=sys.stderr)
        return REVOKED_EXIT
    start = start_ticks(os.getpid()) or 0
    _write_atomic(prefix + ".pid", f"{os.getpid()} {start}\n")
    try:
        env = _job_env(prefix)
    except ValueError as e:
        print(f"gpupool: {e}", file=sys.stderr, flush=True)
        _write_atomic(prefix + ".exit", f"127\n{ENDED}\n")
        return 127
    if "--gang" in opts:
        return _run_gang(prefix, opts, command, env)
    child: list[int] = []  # the command's pid, once started
    stopped: list[bool] = []  # non-empty once a stop reached the command (or came before it started)

    def on_stop(signum: int, _frame: object) -> None:
        if stopped:
            return  # our own pass-on to the group comes back to us: once is enough
        if child and not _still_running(child[0]):
            return  # the command had already ended on its own: the stop came too late
        stopped.append(True)
        if child:
            try:
                os.killpg(os.getpgid(0), signum)
            except OSError:
                pass

    # A Python handler (not SIG_IGN, which exec would pass on to the child)
    # keeps the wrapper alive long enough to record the command's status.
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    if stopped:  # stopped before the command started: it never runs
        _write_atomic(prefix + ".exit", f"{-signal.SIGTERM}\n{STOPPED}\n")
        return 128 + signal.SIGTERM
    try:
        if "--as" in opts:
            proc = subprocess.Popen(command, env=env,
                                    preexec_fn=_as_account(opts["--as"], opts.get("--workdir", ".")))
        else:
            proc = subprocess.Popen(command, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        where = f" in {opts['--workdir']}" if "--workdir" in opts else ""
        print(f"gpupool: cannot start {command[0]!r}{where}: {e}", file=sys.stderr, flush=True)
        _write_atomic(prefix + ".exit", f"127\n{ENDED}\n")
        return 127
    child.append(proc.pid)
    if stopped:  # the stop came while the command was being started: pass it on now
        stopped.clear()
        on_stop(signal.SIGTERM, None)
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    _write_atomic(prefix + ".exit", f"{code}\n{STOPPED if stopped else ENDED}\n")
    return code if code >= 0 else 128 - code


def _run_gang(prefix: str, opts: dict[str, str], command: list[str], env: dict[str, str]) -> int:
    """Every replica of a gang's attempt under this one wrapper; the exit file as for a single command."""
    from gpupool.backends.local.gang import Gang, read_spec

    try:
        spec = read_spec(opts["--gang"])
    except (OSError, ValueError) as e:
        print(f"gpupool: cannot read the gang's replicas from {opts['--gang']}: {e}", file=sys.stderr, flush=True)
        _write_atomic(prefix + ".exit", f"127\n{ENDED}\n")
        return 127
    preexec = _as_account(opts["--as"], opts.get("--workdir", ".")) if "--as" in opts else None
    code, mark = Gang(command, spec, env, preexec).run()
    _write_atomic(prefix + ".exit", f"{code}\n{mark}\n")
    return code if code >= 0 else 128 - code


def _still_running(pid: int) -> bool:
    """Whether our child ``pid`` has not ended yet; looked at without reaping it (WNOWAIT).

    Not ``Popen.poll()``: inside a signal handler that interrupted ``Popen.wait()``
    it cannot take the wait lock and answers "running" whatever the truth.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False  # already reaped: it has ended


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
