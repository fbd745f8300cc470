"""The Kubernetes backend's executor: each job's attempts go to the executor that runs its kind of pod.

gpupool's own job pods (:class:`gpupool.backends.kubernetes.executor.PodExecutor`) and the
pods users create with kubectl (:class:`gpupool.backends.kubernetes.foreign_jobs.KubectlPods`)
start, stop and end differently; the core sees one executor. A job is a
kubectl pod's when it was registered so (:mod:`gpupool.backends.kubernetes.adoption`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.kubernetes.batch_jobs import BatchJobs
from gpupool.backends.kubernetes.executor import PodExecutor
from gpupool.backends.kubernetes.foreign_jobs import KubectlPods
from gpupool.backends.kubernetes.workload_gang_jobs import WorkloadGangs


class KubeExecutor:
    """Routes by job id (a :class:`gpupool.backends.base.Executor`); anything else is the PodExecutor's."""

    def __init__(self, pods: PodExecutor, kubectl: KubectlPods, batch: BatchJobs | None = None,
                 gangs: WorkloadGangs | None = None) -> None:
        self.pods = pods
        self.kubectl = kubectl
        self.batch = batch  # labelled batch/v1 Jobs' attempts
        self.gangs = gangs  # PodGroups' gang attempts (the Workload API)

    @property
    def changes(self) -> tuple[int, int, int, int]:
        """Moves whenever an attempt of any executor may have stopped being alive (the core's scan mark)."""
        return (self.pods.changes, self.kubectl.changes, self.batch.changes if self.batch is not None else 0,
                self.gangs.changes if self.gangs is not None else 0)

    def _for(self, job_id: str) -> Any:
        if self.batch is not None and self.batch.owns(job_id):
            return self.batch
        if self.gangs is not None and self.gangs.owns(job_id):
            return self.gangs
        return self.kubectl if self.kubectl.owns(job_id) else self.pods

    def launch(self, launch: Launch) -> Any:
        return self._for(launch.job_id).launch(launch)

    def alive(self, handle: Any) -> bool:
        return bool(self._for(handle.job_id).alive(handle))

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        return self._for(job_id).exit_code(job_id, attempt)

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        return bool(self._for(job_id).ended_on_its_own(job_id, attempt))

    def interrupted(self, handle: Any) -> Interrupted | None:
        return self._for(handle.job_id).interrupted(handle)

    async def stop(self, handle: Any, grace_s: float) -> bool:
        return bool(await self._for(handle.job_id).stop(handle, grace_s))

    def release(self, handle: Any) -> None:
        self._for(handle.job_id).release(handle)

    def recover(self, job_id: str, attempt: int, pid: int | None, pid_start: int | None) -> Recovered:
        if self.batch is not None and self.batch.owns(job_id):
            return self.batch.recover(job_id, attempt)
        if self.gangs is not None and self.gangs.owns(job_id):
            return self.gangs.recover(job_id, attempt)
        return self._for(job_id).recover(job_id, attempt, pid, pid_start)

    def recovered(self, live: set[tuple[str, int]]) -> None:
        self.pods.recovered(live)

    def log_path(self, job_id: str) -> Path:
        return self.pods.log_path(job_id)

    def default_workdir(self, job_id: str) -> Path:
        return self.pods.default_workdir(job_id)

    def __getattr__(self, name: str) -> Any:
        """Anything else (hooks other modules add to PodExecutor) is the PodExecutor's."""
        return getattr(self.pods, name)
