"""The replicas of a multi-node gang's attempt, run by the attempt's one wrapper process.

Why inside the wrapper: the wrapper (:mod:`gpupool.backends.local._wrapper`) is
what the service records (pid and start time), re-adopts after a restart and
signals to stop; making it the parent of every replica keeps all of that for
a gang unchanged. One attempt is still one process group, one handle, one
exit status: a pause reaching the group reaches every replica, a service
killed with ``kill -9`` finds the same wrapper running, and no replica is
ever started twice (only the wrapper starts them, once, after it claimed the
launch ticket).

What it adds over a single command:

* each replica's stdout and stderr go to its own log file (``replica-K.log``,
  made by the service) and to the job's log with every line prefixed ``[K] ``;
* one replica ending with a non-zero status before any stop reached the
  gang fails the attempt: the others get the checkpoint signal (SIGTERM to
  the group), then SIGKILL after the grace, and the status recorded is that
  first failure's, marked as ended on its own (a failure wins over a pause
  that comes after it);
* otherwise the status is 0 when every replica exited 0, else the first
  non-zero one (in the order they ended), marked ``stopped`` when a stop
  reached the replicas.

Single-threaded on purpose: child exits and signals wake one ``select`` loop
(through the signal wakeup fd), so a stop never waits behind a blocked read.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STOPPED, ENDED = "stopped", "ended"  # the exit file's second line, as the single-command wrapper writes it
DRAIN_S = 2.0  # how long output is still read after the last replica ended (its children may hold the pipe)
LONG_LINE = 64 * 1024  # a line longer than this goes to the job's log in pieces, each prefixed


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica as the service wrote it: its rank, its environment overlay, its own log file."""

    rank: int
    env: dict[str, str]
    log: str


@dataclass(frozen=True)
class GangSpec:
    """What the service wrote to ``attempt-N.gang`` for the wrapper: the replicas and the failure grace."""

    replicas: tuple[ReplicaSpec, ...]
    grace_s: float


def write_spec(path: str, spec: GangSpec) -> None:
    """Write the spec where the wrapper reads it (the service's private run/ directory)."""
    data = {"grace_s": spec.grace_s,
            "replicas": [{"rank": r.rank, "env": r.env, "log": r.log} for r in spec.replicas]}
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_spec(path: str) -> GangSpec:
    """The spec the service wrote; ValueError if it is not one."""
    with open(path) as f:
        data: Any = json.load(f)
    try:
        replicas = tuple(ReplicaSpec(int(r["rank"]), {str(k): str(v) for k, v in r["env"].items()}, str(r["log"]))
                         for r in data["replicas"])
        grace = float(data["grace_s"])
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a gang spec: {e}") from e
    if not replicas:
        raise ValueError("a gang spec with no replicas")
    return GangSpec(replicas, grace)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # a log we cannot write to must not stop the gang
        view = view[n:]


def _peek(pid: int) -> int | None:
    """A child's exit status if it has ended, without reaping it (WNOWAIT); None while it runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


class Gang:
    """Runs the replicas of one attempt; :meth:`run` returns ``(status, "stopped" | "ended")``."""

    def __init__(self, command: list[str], spec: GangSpec, base_env: dict[str, str],
                 preexec: Callable[[], object] | None = None, job_log_fd: int = 1) -> None:
        self.command = command
        self.spec = spec
        self.base_env = base_env
        self.preexec = preexec
        self.job_log_fd = job_log_fd
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # rank -> replica (until reaped)
        self.codes: dict[int, int] = {}  # rank -> exit status, once reaped
        self.order: list[int] = []  # ranks in the order they ended
        self.started = False
        self.stopped = False  # a stop from outside reached the replicas
        self.failure: tuple[int, int] | None = None  # (rank, status) of the replica whose failure ends the gang
        self.kill_at: float | None = None
        self._pipes: dict[int, int] = {}  # read fd -> rank
        self._partial: dict[int, bytes] = {}
        self._logs: dict[int, int] = {}  # rank -> its own log's fd

    # ------------------------------------------------------------ signals
    def on_stop(self, signum: int, _frame: object) -> None:
        """The service asked the attempt to stop: pass it on to the group unless it already ended on its own."""
        if self.stopped or self.failure is not None:
            return  # our own pass-on coming back, or the gang is already ending from a failure
        if not self.started:
            self.stopped = True  # before any replica started: none will
            return
        ended = [_peek(p.pid) for p in self.procs.values()] + list(self.codes.values())
        if all(c is not None for c in ended):
            return  # every replica had ended on its own: the stop came too late
        if any(c not in (None, 0) for c in ended):
            return  # a replica failed before the stop: its failure wins, run() stops the others
        self.stopped = True
        self._signal_group(signum)

    @staticmethod
    def _signal_group(sig: int) -> None:
        try:
            os.killpg(os.getpgid(0), sig)
        except OSError:
            pass

    def _say(self, text: str) -> None:
        _write_all(self.job_log_fd, f"gpupool: {text}\n".encode())

    # ------------------------------------------------------------ start
    def _open_log(self, r: ReplicaSpec) -> None:
        try:
            self._logs[r.rank] = os.open(r.log, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        except OSError as e:
            self._say(f"replica {r.rank}: cannot open its log {r.log}: {e.strerror}")

    def _start(self, r: ReplicaSpec) -> bool:
        env = dict(self.base_env)
        env.update(r.env)
        rd, wr = os.pipe()
        try:
            proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=wr,
                                    stderr=subprocess.STDOUT, preexec_fn=self.preexec)
        except (OSError, subprocess.SubprocessError) as e:
            os.close(rd)
            self._say(f"replica {r.rank}: cannot start {self.command[0]!r}: {e}")
            return False
        finally:
            os.close(wr)
        self.procs[r.rank] = proc
        self._pipes[rd] = r.rank
        self._partial[rd] = b""
        return True

    # ------------------------------------------------------------ output
    def _pump(self, fd: int, sel: selectors.BaseSelector) -> None:
        """Copy what replica wrote to its log, and its complete lines, prefixed, to the job's log."""
        rank = self._pipes[fd]
        try:
            data = os.read(fd, 65536)
        except InterruptedError:
            return
        except OSError:
            data = b""
        prefix = f"[{rank}] ".encode()
        if not data:
            rest = self._partial.pop(fd, b"")
            if rest:
                _write_all(self.job_log_fd, prefix + rest + b"\n")
            sel.unregister(fd)
            os.close(fd)
            del self._pipes[fd]
            return
        if rank in self._logs:
            _write_all(self._logs[rank], data)
        buf = self._partial[fd] + data
        *lines, buf = buf.split(b"\n")
        if len(buf) > LONG_LINE:
            lines.append(buf)
            buf = b""
        self._partial[fd] = buf
        if lines:  # one write per chunk: O_APPEND keeps it whole among the other replicas' writes
            _write_all(self.job_log_fd, b"".join(prefix + line + b"\n" for line in lines))

    # ------------------------------------------------------------ the loop
    def _reap(self) -> None:
        while self.procs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = next((r for r, p in self.procs.items() if p.pid == pid), None)
            if rank is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            proc = self.procs.pop(rank)
            proc.returncode = code  # reaped here: subprocess must not wait for it again
            self.codes[rank] = code
            self.order.append(rank)
            if code != 0 and not self.stopped and self.failure is None:
                self._fail(rank, code)

    def _fail(self, rank: int, code: int) -> None:
        """Replica ``rank`` failed on its own: the attempt fails, the others get the checkpoint signal."""
        self.failure = (rank, code)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if self.procs:
            self._say(f"replica {rank} {how}; stopping the other replicas (SIGTERM, SIGKILL after "
                      f"{self.spec.grace_s:g} s)")
            self._signal_group(signal.SIGTERM)
            self.kill_at = time.monotonic() + self.spec.grace_s
        else:
            self._say(f"replica {rank} {how}")

    def run(self) -> tuple[int, str]:
        """Start every replica, follow them to their end, and say how the attempt ended."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so a child's end wakes the select
        signal.signal(signal.SIGTERM, self.on_stop)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGHUP, lambda *_: None)
        if self.stopped:
            return -signal.SIGTERM, STOPPED
        for r in self.spec.replicas:
            self._open_log(r)
        for r in self.spec.replicas:
            if self.stopped:
                break
            if not self._start(r):
                self.started = True
                self.codes[r.rank] = 127
                self.order.append(r.rank)
                self._fail(r.rank, 127)
                break
        self.started = True
        if self.stopped and self.failure is None:  # the stop came while replicas were being started
            self.stopped = False
            self.on_stop(signal.SIGTERM, None)
        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ, None)
        for fd in self._pipes:
            sel.register(fd, selectors.EVENT_READ, None)
        drain_until: float | None = None
        while True:
            self._reap()
            now = time.monotonic()
            if self.kill_at is not None and now >= self.kill_at:
                for p in self.procs.values():
                    try:
                        p.kill()
                    except OSError:
                        pass
                self.kill_at = None
            if not self.procs:
                if not self._pipes:
                    break
                drain_until = drain_until or now + DRAIN_S
                if now >= drain_until:
                    break
            waits = [t - now for t in (self.kill_at, drain_until) if t is not None]
            for key, _ in sel.select(max(0.0, min(waits)) if waits else None):
                if key.fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except (BlockingIOError, InterruptedError):
                        pass
                else:
                    self._pump(key.fd, sel)
        for fd, rank in list(self._pipes.items()):  # the replicas' leftover children hold these: stop reading
            rest = self._partial.pop(fd, b"")
            if rest:
                _write_all(self.job_log_fd, f"[{rank}] ".encode() + rest + b"\n")
            os.close(fd)
        return self._result()

    def _result(self) -> tuple[int, str]:
        if self.failure is not None:
            return self.failure[1], ENDED
        code = next((self.codes[r] for r in self.order if self.codes[r] != 0), 0)
        return code, STOPPED if self.stopped else ENDED
