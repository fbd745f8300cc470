"""Prometheus: each running job's GPUs, allocated vs used over the last minute, with a bounded number of series.

``gpupool_job_gpus{job, project, user, kind, what}``: ``allocated`` is what the
job holds now; ``measured`` and ``used`` are that times its last minute's
figures (gpupool.service.recent_use: the part measured, and the part used),
so ``used / measured`` is its recent efficiency and ``allocated - measured``
what could not be measured (unknown, not idle). A job with no sample in the
window has ``allocated`` alone.

Why bounded: a label per job id is a new time series per job, and a pool
runs thousands a day. Only *running* jobs are shown (a job's series ends with
it), and at most ``MAX_JOB_SERIES`` of them, those holding most (ties: the
oldest job first); the rest are summed per kind into one job named ``(other)``
(project and user ``(other)`` too). Computed at each scrape from the live jobs
and one read of the history, like the service's other live gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.policy.model import MILLI
from gpupool.service.jobs import held_milli
from gpupool.service.recent_use import RecentUse
from gpupool.service.store import JobRecord

MAX_JOB_SERIES = 100
OTHER = "(other)"
WHAT = ("allocated", "measured", "used")


class JobUseGauges(Collector):
    """The per-job family, read when scraped: ``running()`` gives the running jobs of the moment."""

    def __init__(self, running: Callable[[], Iterable[JobRecord]], recent: RecentUse,
                 limit: int = MAX_JOB_SERIES) -> None:
        self.running = running
        self.recent = recent
        self.limit = limit

    def describe(self) -> list[Metric]:
        return []  # unchecked: its series come and go with the running jobs

    def collect(self) -> list[Metric]:
        family = GaugeMetricFamily(
            "gpupool_job_gpus", "A running job's GPUs: allocated now, and of them measured and used over the "
            f"last minute (at most {self.limit} jobs, the rest summed per kind as job (other))",
            labels=["job", "project", "user", "kind", "what"])
        jobs = [r for r in self.running() if r.state == "running" and held_milli(r) > 0]
        if not jobs:
            return [family]
        jobs.sort(key=lambda r: (-held_milli(r), r.num))
        sums = self.recent.sums()
        other: dict[str, list[float]] = {}
        for i, rec in enumerate(jobs):
            held = held_milli(rec) / MILLI
            values = [held]
            t = sums.get(rec.num)
            if t is not None and t.alloc > 0:
                values += [held * t.measured / t.alloc, held * min(t.used, t.measured) / t.alloc]
            if i < self.limit:
                for what, value in zip(WHAT, values, strict=False):
                    family.add_metric([rec.id, rec.project, rec.user, rec.kind, what], round(value, 6))
            else:
                acc = other.setdefault(rec.kind, [0.0, 0.0, 0.0])
                for k, value in enumerate(values):
                    acc[k] += value
        for kind, acc in sorted(other.items()):
            for what, value in zip(WHAT, acc, strict=True):
                family.add_metric([OTHER, OTHER, OTHER, kind, what], round(value, 6))
        return [family]
