"""Allocated vs used, one sample at a time: GPU processes mapped to the jobs and kernels that own them.

A pure function of one GPU sample, the running jobs and a pid -> job lookup
(the watchdog's :func:`gpupool.service.watchdog.job_of_process`: a job's
session, else ``GPUPOOL_JOB_ID`` in the process's environment, which kernels
get from their build share's environment too), so it is tested with made-up
readings on machines without GPUs.

What a job "uses" on a GPU is the SM utilisation of its processes there,
as a share of the whole GPU, counted at most up to its share: a quarter-GPU
kernel whose processes keep 20 % of the SMs busy uses 200 of its 250
milli-GPU; one that bursts to 60 % uses its 250 (idle 0), because the report
answers "how much of what was allocated was used", not who borrowed what.
A job on a GPU that cannot measure processes (NVML without per-process
accounting, a cluster node whose agent has not reported lately) is
*unmeasured* there: counted as allocated, never as idle. On a cluster the
sample's "processes" are pods a node agent reported, already mapped to
their jobs (``owners``: gpupool.service.reported_use); ``owner`` is not
asked about them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpupool.inventory import GpuSample
from gpupool.service.store import JobRecord

Owner = Callable[[int], "str | None"]
"""pid -> the id of the job owning the process, or None."""


@dataclass(frozen=True)
class JobUse:
    """One running job at one sample, in milli-GPU (and bytes)."""

    alloc: int  # milli-GPU held
    measured: int  # of ``alloc``, the milli-GPU on GPUs whose processes were measured
    used: float  # utilisation-weighted milli-GPU, each GPU's at most the share held there
    memory: int  # GPU memory its processes hold, summed over its GPUs (bytes)


def _shares(rec: JobRecord) -> list[tuple[str, int]]:
    return [(str(g["id"]), int(g["milli"])) for g in (rec.assignment or {}).get("gpus", [])]


def job_use(sample: Mapping[str, GpuSample], running: Iterable[JobRecord], owner: Owner) -> dict[str, JobUse]:
    """Per running job holding GPUs: what it holds and, where measured, what it uses (one sample).

    ``owner`` is asked once per pid in the sample (a /proc read each, on the
    NVML path), whatever the number of GPUs a process appears on.
    """
    jobs = [r for r in running if r.state == "running" and _shares(r)]
    if not jobs:
        return {}
    ids = {r.id for r in jobs}
    util: dict[tuple[str, str], float] = {}  # (job, gpu) -> percent of the GPU
    memory: dict[str, int] = {}
    owners: dict[int, str | None] = {}
    for gid, s in sample.items():
        pids = set(s.processes) | set(s.process_util or {})
        known: dict[int, str] | None = getattr(s, "owners", None)  # pods a node agent reported, jobs attached
        for pid in pids:
            if pid not in owners:
                owners[pid] = known.get(pid) if known is not None else owner(pid)
            jid = owners[pid]
            if jid is None or jid not in ids:
                continue
            memory[jid] = memory.get(jid, 0) + int(s.processes.get(pid, 0))
            if s.process_util is not None:
                key = (jid, gid)
                util[key] = util.get(key, 0.0) + float(s.process_util.get(pid, 0.0))
    out: dict[str, JobUse] = {}
    for rec in jobs:
        alloc = measured = 0
        used = 0.0
        for gid, milli in _shares(rec):
            alloc += milli
            reading = sample.get(gid)
            if reading is None or reading.process_util is None:
                continue  # this GPU says nothing about processes: allocated, not measured
            measured += milli
            used += min(float(milli), util.get((rec.id, gid), 0.0) * 10.0)  # percent of a GPU -> milli
        out[rec.id] = JobUse(alloc, measured, used, memory.get(rec.id, 0))
    return out
