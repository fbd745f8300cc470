"""Run training jobs as local processes, and find them again after a restart.

Each attempt of a job runs through :mod:`gpupool.backends.local._wrapper` in its
own session (so its own process group: pausing signals the whole group), in
the job's working directory, with stdout and stderr appended to the job's log
file. Files under ``<jobs_dir>/<job_id>/run/`` let a restarted service tell a
running attempt from a finished one from one that never started:

``attempt-N.launch`` (ticket, made by the service before spawning),
``attempt-N.env`` (the command's environment, which only the command gets),
``attempt-N.claimed`` (the wrapper took the ticket), ``attempt-N.pid``
(``pid starttime``), ``attempt-N.exit`` (the command's exit status, and
whether a stop reached the command or it ended on its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.local import sweep
from gpupool.backends.local._wrapper import ENDED
from gpupool.backends.local.accounts import RunAs, job_account, job_environment
from gpupool.backends.local.gang import GangSpec, ReplicaSpec, write_spec
from gpupool.backends.rendezvous import free_port, rendezvous_env
from gpupool.procstat import stat_fields
from gpupool.wire.errors import InvalidRequest

WRAPPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def wrapper_environment(service_env: dict[str, str]) -> dict[str, str]:
    """The wrapper's own environment: fixed, and nothing of the job's.

    The wrapper may run as root (jobs run as their owners): any variable a
    user chose (``PYTHONPATH``, ``PYTHONSTARTUP``, ``LD_PRELOAD``, ``PATH``...)
    would make root run the user's code before the drop to their account. So
    it gets a fixed PATH and locale, and ``LD_LIBRARY_PATH`` only as the
    service itself was started with it (an interpreter built against a
    library outside the system's may need it to start at all).
    """
    env = {"PATH": WRAPPER_PATH, "LANG": "C.UTF-8"}
    if service_env.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = service_env["LD_LIBRARY_PATH"]
    return env


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None if gone/zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_session(pid: int) -> int | None:
    """The session id of a process (field 6 of /proc/<pid>/stat), or None."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[3])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, found by scanning /proc."""
    out: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(pid)
    return out


def _write_private(path: str, text: str) -> None:
    """Write a file only the service's account can read (0600, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        f.write(text)


@dataclass
class ProcessHandle:
    """A running attempt: the wrapper's pid (= process group id) and its start time."""

    job_id: str
    attempt: int
    pid: int
    start_time: int
    popen: subprocess.Popen[bytes] | None = None  # None when adopted after a restart


@dataclass(frozen=True)
class Unrecorded:
    """What recovery found for an attempt whose pid the store never got."""

    outcome: str  # "not-started" | "running" | "finished" | "lost"
    handle: ProcessHandle | None = None
    exit_code: int | None = None


class LocalExecutor:
    """Starts, watches and stops job processes on this machine (a :class:`gpupool.backends.base.Executor`)."""

    def __init__(self, jobs_dir: Path, traversable: bool = False, run_jobs_as: str = "service",
                 allow_root_jobs: bool = False, account_template: str = "{user}", gang_grace_s: float = 10.0,
                 allowed_system_accounts: tuple[str, ...] | list[str] = (),
                 env_passthrough: tuple[str, ...] | list[str] = ()) -> None:
        """``traversable``: jobs run as other accounts (root service), which must reach their own job's
        directory: ``jobs/`` is then 0711 (entered, never listed), else 0700. ``run_jobs_as`` and
        ``allow_root_jobs``, ``account_template``: which Unix account :meth:`launch` runs a job as
        (ServiceConfig's ``run_jobs_as``, ``allow_root_jobs``, ``job_account_template``).
        ``gang_grace_s``: when one replica of a gang fails, how long the others get to checkpoint
        before they are killed (the wrapper does it, so it holds while the service is down).
        ``allowed_system_accounts``, ``env_passthrough``: ServiceConfig's ``allowed_system_accounts``
        and ``job_env_passthrough``."""
        self.allowed_system_accounts = tuple(allowed_system_accounts)
        self.env_passthrough = tuple(env_passthrough)
        self.gang_grace_s = gang_grace_s
        self.run_jobs_as = run_jobs_as
        self.account_template = account_template
        self.allow_root_jobs = allow_root_jobs
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.jobs_dir, 0o711 if traversable else 0o700)

    # ------------------------------------------------------------ paths
    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def log_settled(self, job_id: str) -> bool:
        """A process writes its own log: once it has ended, nothing more comes."""
        return True

    def log_path(self, job_id: str) -> Path:
        """The job's log (a gang: every replica's lines, each prefixed ``[K] ``)."""
        return self.job_dir(job_id) / "job.log"

    def replica_log_path(self, job_id: str, replica: int) -> Path:
        """A gang's replica ``replica``'s own output."""
        return self.job_dir(job_id) / f"replica-{int(replica)}.log"

    def _prefix(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / "run" / f"attempt-{attempt}"

    def default_workdir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "work"

    # ------------------------------------------------------------ start
    def _private_dirs(self, job_id: str, run_as: RunAs | None) -> None:
        """The job's directory (0700; 0711 when the job runs as another account) and its run/ (0700).

        Both stay the service's: the job's account may enter its job directory
        to reach its own log and working directory, never write there, so it
        cannot plant a link where the service writes.
        """
        jd = self.job_dir(job_id)
        jd.mkdir(exist_ok=True, mode=0o700)
        os.chmod(jd, 0o711 if run_as is not None else 0o700)
        (jd / "run").mkdir(exist_ok=True, mode=0o700)

    def _open_log(self, job_id: str, run_as: RunAs | None, replica: int | None = None) -> int:
        """The job's log (or a replica's), for appending: 0600, owned by the job's account (read by its owner only)."""
        path = self.log_path(job_id) if replica is None else self.replica_log_path(job_id, replica)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
        os.fchmod(fd, 0o600)
        return fd

    def launch(self, launch: Launch) -> ProcessHandle:
        """Start an attempt as the job's Unix account.

        The command's environment is what the allow-list takes from the
        service's (:func:`gpupool.backends.local.accounts.job_environment`), with
        the job's own variables, then the GPU variables, on top.
        """
        run_as = job_account(launch.user, self.run_jobs_as, self.allow_root_jobs, self.account_template,
                             self.allowed_system_accounts)
        env = job_environment(dict(os.environ), run_as, self.env_passthrough)
        env.update(launch.job_env)
        if launch.replicas:
            return self.spawn(launch.job_id, launch.attempt, launch.command, launch.workdir, env, run_as,
                              gang=self._gang(launch, run_as))
        env.update(launch.gpu_env)
        return self.spawn(launch.job_id, launch.attempt, launch.command, launch.workdir, env, run_as)

    def _gang(self, launch: Launch, run_as: RunAs | None) -> GangSpec:
        """Each replica's environment (its own GPUs plus the rendezvous variables) and its own log file.

        Every replica runs on this machine, so rank 0 listens on the loopback
        at a port chosen now, anew for each attempt. Each replica's log gets
        the attempt's header line, as the job's log does.
        """
        self._private_dirs(launch.job_id, run_as)
        port = free_port()
        n = len(launch.replicas)
        header = f"--- gpupool: attempt {launch.attempt} of {launch.job_id} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"
        replicas = []
        for r in sorted(launch.replicas, key=lambda r: r.rank):
            env = dict(r.gpu_env)
            env.update(rendezvous_env(r.rank, n, "127.0.0.1", port))
            with open(self._open_log(launch.job_id, run_as, r.rank), "ab") as f:
                f.write(header.encode())
            replicas.append(ReplicaSpec(r.rank, env, str(self.replica_log_path(launch.job_id, r.rank))))
        return GangSpec(tuple(replicas), self.gang_grace_s)

    def spawn(self, job_id: str, attempt: int, command: list[str], workdir: str, env: dict[str, str],
              run_as: RunAs | None = None, gang: GangSpec | None = None) -> ProcessHandle:
        """Start attempt ``attempt`` of a job; the caller has already recorded "starting attempt N".

        With ``run_as`` the command runs as that account: the default working
        directory is made here and given to it; any other working directory is
        made and entered by the command's process once it is that account.
        With ``gang`` the wrapper runs one copy of the command per replica.

        ``env`` is the command's alone: it goes to the wrapper in a file of
        the service's private run/ directory, and the wrapper applies it only
        in the command's process, after that process became the job's account.
        The wrapper itself starts isolated (``python -I``, a fixed environment).
        """
        prefix = self._prefix(job_id, attempt)
        self._private_dirs(job_id, run_as)
        wd = Path(workdir)
        wrapper_opts: list[str] = []
        if run_as is None:
            wd.mkdir(parents=True, exist_ok=True, mode=0o700)
            cwd = wd
        else:
            if wd == self.default_workdir(job_id) and not wd.exists():
                wd.mkdir(mode=0o700)
                os.chown(wd, run_as.uid, run_as.gid)
            wrapper_opts = ["--as", run_as.wrapper_arg(), "--workdir", str(wd)]
            cwd = self.job_dir(job_id)
        for suffix in (".claimed", ".pid", ".exit", ".revoked", ".gang", ".env"):
            Path(str(prefix) + suffix).unlink(missing_ok=True)
        _write_private(str(prefix) + ".env", json.dumps({**env, sweep.RUN_ID: str(prefix)}))
        if gang is not None:
            write_spec(str(prefix) + ".gang", gang)
            wrapper_opts += ["--gang", str(prefix) + ".gang"]
        Path(str(prefix) + ".launch").write_text(f"{time.time()}\n")
        with open(self._open_log(job_id, run_as), "ab") as log:
            log.write(f"--- gpupool: attempt {attempt} of {job_id} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            log.flush()
            try:
                popen = subprocess.Popen(
                    [sys.executable, "-I", "-m", "gpupool.backends.local._wrapper", str(prefix), *wrapper_opts, "--",
                     *command],
                    cwd=str(cwd),
                    env=wrapper_environment(dict(os.environ)),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                raise InvalidRequest(f"cannot start job {job_id}: {e}") from e
        start = proc_start_time(popen.pid) or 0
        return ProcessHandle(job_id, attempt, popen.pid, start, popen)

    # ------------------------------------------------------------ watch
    def alive(self, handle: ProcessHandle) -> bool:
        """Whether the wrapper still runs (reaps our own child when it ended)."""
        if handle.popen is not None:
            return handle.popen.poll() is None
        return proc_start_time(handle.pid) == handle.start_time

    def _exit_lines(self, job_id: str, attempt: int) -> list[str]:
        try:
            return Path(str(self._prefix(job_id, attempt)) + ".exit").read_text().split()
        except OSError:
            return []

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        """The command's recorded exit status for this attempt, if it finished."""
        lines = self._exit_lines(job_id, attempt)
        try:
            return int(lines[0]) if lines else None
        except ValueError:
            return None

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        """Whether the attempt's command ended before any stop reached it (the wrapper says so).

        Then its exit status is the job's result, whatever stop the service was
        carrying out meanwhile. False when no status is recorded, when the stop
        reached the command, or for a status file of an older wrapper (one line).
        """
        lines = self._exit_lines(job_id, attempt)
        return len(lines) >= 2 and lines[1] == ENDED

    def interrupted(self, handle: ProcessHandle) -> Interrupted | None:
        """A local process always ends with its own story (an exit file, or none: killed from outside)."""
        return None

    def recover(self, job_id: str, attempt: int, pid: int | None, pid_start: int | None) -> Recovered:
        """By the stored pid and start time when the store has them, else by the attempt's run files."""
        if pid:
            handle = self.adopt(job_id, attempt, pid, pid_start or 0)
            return Recovered("running", handle) if handle is not None else Recovered("gone")
        u = self.recover_unrecorded(job_id, attempt)
        if u.outcome == "running":
            return Recovered("running", u.handle)
        if u.outcome == "not-started":
            return Recovered("not-started")
        return Recovered("gone", exit_code=u.exit_code)

    def recovered(self, live: set[tuple[str, int]]) -> None:
        """End what is left of attempts nobody adopted: processes that left their group while the service was down.

        A process carries its attempt's run id (its run-file prefix under our
        jobs directory); one of an attempt that is not running any more has
        nothing left to do but hold a GPU.
        """
        live_ids = {str(self._prefix(job_id, attempt)) for job_id, attempt in live}
        ours = str(self.jobs_dir) + os.sep
        sweep.kill_marked(lambda run_id: run_id.startswith(ours) and run_id not in live_ids)

    def adopt(self, job_id: str, attempt: int, pid: int, start_time: int) -> ProcessHandle | None:
        """Find a process again after a restart: alive with the same start time, else None."""
        if pid and proc_start_time(pid) == start_time:
            return ProcessHandle(job_id, attempt, pid, start_time)
        return None

    def recover_unrecorded(self, job_id: str, attempt: int, wait_s: float = 2.0) -> Unrecorded:
        """Settle an attempt recorded as "starting" whose pid never reached the store."""
        prefix = str(self._prefix(job_id, attempt))
        try:
            os.rename(prefix + ".launch", prefix + ".revoked")
            return Unrecorded("not-started")  # the wrapper can no longer claim it
        except FileNotFoundError:
            pass
        if not os.path.exists(prefix + ".claimed"):
            return Unrecorded("not-started")  # crashed before the ticket was written
        deadline = time.monotonic() + wait_s
        pid_text = ""
        while time.monotonic() < deadline:
            try:
                pid_text = Path(prefix + ".pid").read_text()
                if pid_text.endswith("\n"):
                    break
            except OSError:
                pass
            time.sleep(0.02)
        code = self.exit_code(job_id, attempt)
        try:
            pid, start = (int(x) for x in pid_text.split())
        except ValueError:
            return Unrecorded("finished", exit_code=code) if code is not None else Unrecorded("lost")
        handle = self.adopt(job_id, attempt, pid, start)
        if handle is not None:
            return Unrecorded("running", handle=handle)
        if code is not None:
            return Unrecorded("finished", exit_code=code)
        return Unrecorded("lost")

    # ------------------------------------------------------------ stop
    def signal_group(self, handle: ProcessHandle, sig: int) -> None:
        """Send ``sig`` to the attempt's whole process group (gone already is fine)."""
        try:
            os.killpg(handle.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self, handle: ProcessHandle) -> bool:
        """Whether any live (non-zombie) process remains in the attempt's process group."""
        return self.alive(handle) or bool(group_members(handle.pid))

    def request_stop(self, handle: ProcessHandle) -> None:
        """SIGTERM to the wrapper alone: it passes the signal on to the group only if the command still runs."""
        if not self.alive(handle):
            return
        try:
            os.kill(handle.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    async def stop(self, handle: ProcessHandle, grace_s: float, poll_s: float = 0.05) -> bool:
        """Ask the wrapper to stop, wait up to ``grace_s``, then SIGKILL the group. True if it ended within the grace."""
        self.request_stop(handle)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.alive(handle):
                self.signal_group(handle, signal.SIGKILL)  # stragglers of the group
                return True
            await asyncio.sleep(poll_s)
        self.signal_group(handle, signal.SIGKILL)
        for _ in range(100):
            if not self.alive(handle):
                break
            await asyncio.sleep(poll_s)
        return False

    def reap_group(self, handle: ProcessHandle) -> None:
        """After the wrapper ended: kill what the job left behind, in its group or out of it.

        Out of it: a process that called ``setsid`` (or was started in a new
        session) still carries the attempt's run id in its environment.
        """
        self.signal_group(handle, signal.SIGKILL)
        run_id = str(self._prefix(handle.job_id, handle.attempt))
        sweep.kill_marked(lambda found: found == run_id)

    def release(self, handle: ProcessHandle) -> None:
        """The attempt is settled: what remains of its process group goes."""
        self.reap_group(handle)
