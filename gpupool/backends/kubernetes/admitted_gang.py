"""The core's handle on an attempt of a gang whose pods a Kubernetes controller makes, not gpupool.

A labelled batch/v1 Job or JobSet (:mod:`gpupool.backends.kubernetes.batch_jobs`)
and a PodGroup (:mod:`gpupool.backends.kubernetes.workload_gang_jobs`) are
admitted the same way: gpupool lets the controller's pods be made, then binds
each one to a slot. An attempt of theirs has no pod of gpupool's own to point
at and no local process, so both executors hand the core this one small type.
It is a separate type from :class:`gpupool.backends.kubernetes.gang_pods.GangHandle`
(a gang whose pods gpupool creates itself, with a handle per replica), which
the pod executor tells apart by ``isinstance``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdmittedGang:
    """An admitted attempt of a controller's gang (a Job, JobSet or PodGroup): no local process."""

    job_id: str
    attempt: int
    name: str  # the Job's, JobSet's or PodGroup's name
    pid: int | None = None  # always None: the Executor seam asks every handle for it
    start_time: int = 0  # when admitted (Unix seconds); 0 when found again after a restart
