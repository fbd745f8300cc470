"""Prometheus metrics of one service, in its own registry (several cores may live in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.policy.model import MILLI
from gpupool.service.store import JobRecord
from gpupool.service.usage import gpu_hours, used_ratio

LiveView = Callable[[], tuple[Iterable[JobRecord], Iterable[str]]]
"""The live jobs and the pool's GPU ids, as of now."""


class _LiveGauges(Collector):
    """The gauges that describe the live jobs, computed when scraped.

    Setting 8,000 per-GPU gauges after every cycle cost a tenth of the
    service's CPU at 1,000 nodes while jobs poured in; a scrape comes every
    few seconds at most, and reads the jobs as they are at that moment.
    """

    def __init__(self) -> None:
        self.view: LiveView | None = None

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families depend on the view (none before the core sets it)

    def collect(self) -> list[Metric]:
        if self.view is None:
            return []
        live, gpu_ids = self.view()
        counts = {"queued": 0, "paused": 0}
        running = {"build": 0, "train": 0}
        per_gpu: dict[str, int] = {gid: 0 for gid in gpu_ids}
        per_project: dict[tuple[str, str], int] = {}
        for rec in live:
            if rec.state in counts:
                counts[rec.state] += 1
                continue
            running[rec.kind] = running.get(rec.kind, 0) + 1
            for g in (rec.assignment or {}).get("gpus", []):
                per_gpu[g["id"]] = per_gpu.get(g["id"], 0) + int(g["milli"])
                key = (rec.project, rec.kind)
                per_project[key] = per_project.get(key, 0) + int(g["milli"])
        queue = GaugeMetricFamily("gpupool_queue_length", "Jobs waiting for GPUs, by state", labels=["state"])
        for state, n in counts.items():
            queue.add_metric([state], n)
        run = GaugeMetricFamily("gpupool_jobs_running", "Jobs holding GPUs, by kind", labels=["kind"])
        for kind, n in running.items():
            run.add_metric([kind], n)
        gpus = GaugeMetricFamily("gpupool_gpu_share_allocated", "Fraction of each GPU handed out", labels=["gpu"])
        for gid, milli in per_gpu.items():
            gpus.add_metric([gid], milli / MILLI)
        projects = GaugeMetricFamily("gpupool_project_allocated_gpus", "GPUs held per project and kind",
                                     labels=["project", "kind"])
        for (project, kind), milli in per_project.items():
            projects.add_metric([project, kind], milli / MILLI)
        return [queue, run, gpus, projects]


MAX_USE_PROJECTS = 200
"""Projects with their own allocated-vs-used series; the rest share the label ``(other)`` (bounded cardinality)."""
OTHER = "(other)"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._live = _LiveGauges()
        r.register(self._live)
        self.pauses = Counter("gpupool_pauses_total", "Jobs paused, by cause", ["cause"], registry=r)
        self.finished = Counter("gpupool_jobs_finished_total", "Jobs that reached a final state", ["state"], registry=r)
        self.submitted = Counter("gpupool_jobs_submitted_total", "Jobs submitted, by kind", ["kind"], registry=r)
        self.cycle = Histogram(
            "gpupool_cycle_seconds", "Time of one scheduling cycle (snapshot, policy, apply)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=r,
        )
        self.simulated = Gauge("gpupool_simulated", "1 when the GPUs are simulated", registry=r)
        self.recent_usage = Gauge(
            "gpupool_project_recent_gpu_hours",
            "GPU-hours a project has held, decayed by the usage half-life (fair share over time)",
            ["project", "kind"], registry=r)
        self.fair_share_used = Gauge(
            "gpupool_project_fair_share_used_ratio",
            "Training GPUs a project runs now plus those it held on average lately, over its long-run fair share "
            "of the train pool (idle GPUs go first to the lowest; absent when no history is kept)",
            ["project"], registry=r)

        self.gpu_seconds = Counter(
            "gpupool_project_gpu_seconds", "GPU-seconds per project and kind: allocated (held), measured (held "
            "where per-process use is measured) and used (SM use of the holders' processes, at most their share)",
            ["project", "kind", "what"], registry=r)
        self._use_projects: set[str] = set()

    def count_use(self, seconds: Mapping[tuple[str, str], tuple[float, float, float]]) -> None:
        """Add (allocated, measured, used) GPU-seconds per (project, kind) to their counters.

        The first ``MAX_USE_PROJECTS`` projects seen get their own label, later
        ones ``(other)``: a scrape stays bounded whatever the number of projects
        (personal projects can be thousands).
        """
        for (project, kind), values in seconds.items():
            if project not in self._use_projects and len(self._use_projects) < MAX_USE_PROJECTS:
                self._use_projects.add(project)
            label = project if project in self._use_projects else OTHER
            for what, value in zip(("allocated", "measured", "used"), values, strict=True):
                if value > 0:
                    self.gpu_seconds.labels(label, kind, what).inc(value)

    def follow(self, view: LiveView) -> None:
        """Where the queue, running and allocation gauges come from: ``view()`` is read at each scrape
        (on the loop that serves /metrics, the core's own)."""
        self._live.view = view

    def show_usage(self, recent: Mapping[tuple[str, str], float],
                   fair: Mapping[str, tuple[float, float]] | None) -> None:
        """Set the recent-use gauges: GPU-hours per (project, kind), and each project's used fair share.

        ``recent``: decayed milli-GPU-seconds per (project, kind); ``fair``:
        per project, its (long-run share, training use now plus lately) in milli-GPU,
        unrounded, or None when no history is kept. The ratio is taken from
        those (:func:`used_ratio`), never from the rounded figures shown to
        users, and left unset where there is none (a share of 0): a project
        with a tiny weight must never stop the tick that calls this.
        """
        for (project, kind), value in recent.items():
            self.recent_usage.labels(project, kind).set(gpu_hours(value))
        for project, (share, used) in (fair or {}).items():
            ratio = used_ratio(share, used)
            if ratio is not None:
                self.fair_share_used.labels(project).set(ratio)
