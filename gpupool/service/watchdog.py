"""GPU memory watchdog: a process holding more than its share gets a warning, then is stopped.

Fractional sharing is cooperative (framework caps, MPS when present); the
watchdog is the backstop. Its decision logic (:class:`Watchdog.check`) is a
pure function of readings and time, so it is tested with fake NVML readings
on machines without GPUs; the service feeds it real readings when NVML works.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.procstat import stat_fields

MIB = 1024 * 1024
SLACK_MIN = 256 * MIB  # a CUDA context alone costs a few hundred MiB the frameworks do not count
SLACK_FRACTION = 0.05


@dataclass(frozen=True)
class Reading:
    """GPU memory one job's processes hold on one GPU (summed over its pids)."""

    job_id: str
    gpu_id: str
    used: int  # bytes
    limit: int  # bytes the job's share allows on this GPU


@dataclass(frozen=True)
class Action:
    kind: str  # "warn" | "stop"
    job_id: str
    gpu_id: str
    used: int
    limit: int

    def message(self) -> str:
        gib = 1024**3
        what = "will be stopped" if self.kind == "warn" else "stopped"
        return (f"job {self.job_id} uses {self.used / gib:.2f} GiB on GPU {self.gpu_id}, over its share of "
                f"{self.limit / gib:.2f} GiB ({what} if it stays over)" if self.kind == "warn" else
                f"job {self.job_id} {what}: it used {self.used / gib:.2f} GiB on GPU {self.gpu_id}, "
                f"over its share of {self.limit / gib:.2f} GiB")


def over_limit(used: int, limit: int) -> bool:
    """Over the share, allowing a little slack for the CUDA context."""
    return used > limit + max(SLACK_MIN, int(limit * SLACK_FRACTION))


class Watchdog:
    """Remembers since when each (job, GPU) is over its share and says what to do now.

    ``mode``: ``"warn"`` only warns; ``"stop"`` warns, then stops the job once
    it has stayed over for ``grace_s``; ``"off"`` does nothing.
    """

    def __init__(self, mode: str = "warn", grace_s: float = 30.0) -> None:
        self.mode = mode
        self.grace_s = grace_s
        self._since: dict[tuple[str, str], float] = {}
        self._stopped: set[str] = set()

    def check(self, readings: Iterable[Reading], now: float) -> list[Action]:
        if self.mode == "off":
            return []
        actions: list[Action] = []
        seen: set[tuple[str, str]] = set()
        for r in readings:
            key = (r.job_id, r.gpu_id)
            if not over_limit(r.used, r.limit):
                continue
            seen.add(key)
            if key not in self._since:
                self._since[key] = now
                actions.append(Action("warn", r.job_id, r.gpu_id, r.used, r.limit))
            elif (self.mode == "stop" and now - self._since[key] >= self.grace_s
                  and r.job_id not in self._stopped):
                self._stopped.add(r.job_id)
                actions.append(Action("stop", r.job_id, r.gpu_id, r.used, r.limit))
        for key in list(self._since):
            if key not in seen:
                del self._since[key]  # back under its share (or gone): start afresh next time
        return actions

    def forget(self, job_id: str) -> None:
        """The job ended: drop its state."""
        self._stopped.discard(job_id)
        for key in [k for k in self._since if k[0] == job_id]:
            del self._since[key]


def job_of_process(pid: int, sessions: dict[int, str]) -> str | None:
    """Which job a GPU process belongs to: by session (jobs run in their own), else by GPUPOOL_JOB_ID in its environment."""
    fields = stat_fields(pid)  # field 6 of /proc/<pid>/stat: the session id (jobs run in their own)
    sid = int(fields[3]) if fields is not None else None
    if sid is not None and sid in sessions:
        return sessions[sid]
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"GPUPOOL_JOB_ID="):
                    return item.split(b"=", 1)[1].decode(errors="replace") or None
    except OSError:
        return None
    return None
