"""Prometheus metrics of one service, in its own registry (several cores may live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
