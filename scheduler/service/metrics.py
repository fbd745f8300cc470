"""Prometheus metrics of one service, in its own registry (several cores may live in one process)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.policy.model import MILLI
from scheduler.store import JobRecord


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_length = Gauge("gpupool_queue_length", "Jobs waiting for GPUs, by state", ["state"], registry=r)
        self.running = Gauge("gpupool_jobs_running", "Jobs holding GPUs, by kind", ["kind"], registry=r)
        self.gpu_allocated = Gauge("gpupool_gpu_share_allocated", "Fraction of each GPU handed out", ["gpu"], registry=r)
        self.project_allocated = Gauge(
            "gpupool_project_allocated_gpus", "GPUs held per project and kind", ["project", "kind"], registry=r
        )
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
            "Training GPUs a project held on average lately over its long-run fair share of the train pool "
            "(idle GPUs go first to the lowest; absent when no history is kept)",
            ["project"], registry=r)

    def update(self, live: Iterable[JobRecord], gpu_ids: Iterable[str]) -> None:
        """Set the gauges from the live jobs (after every cycle)."""
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
        for state, n in counts.items():
            self.queue_length.labels(state).set(n)
        for kind, n in running.items():
            self.running.labels(kind).set(n)
        for gid, milli in per_gpu.items():
            self.gpu_allocated.labels(gid).set(milli / MILLI)
        self.project_allocated.clear()
        for (project, kind), milli in per_project.items():
            self.project_allocated.labels(project, kind).set(milli / MILLI)
