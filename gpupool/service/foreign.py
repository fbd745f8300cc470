"""The core's side of foreign work (a backend that ``AdoptsForeignPods``): what the backend may ask of the jobs.

Kubernetes users create pods with ``schedulerName: gpupool``; the backend's
:class:`gpupool.backends.base.ForeignWork` (gpupool/backends/kubernetes/adoption.py)
decides which become jobs and calls back here, through :class:`ForeignJobs`
(a :class:`gpupool.backends.base.ForeignJobHost`), to queue them as any
submit is queued (the same checks, the same records and events) or to cancel
one whose work went away. The rest of what such a job's life differs in
(never paused, told why it stops) is in gpupool/service/attempts.py and
gpupool/service/api_methods.py, each a call into the backend's ``ForeignWork``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from gpupool.service.book import JobBook
from gpupool.service.metrics import Metrics
from gpupool.service.pool_state import PoolState
from gpupool.service.store import JobRecord
from gpupool.service.validation import validate_spec


class ForeignJobs:
    """The jobs, as an adopting backend sees them during its sync (on the core's loop)."""

    def __init__(self, book: JobBook, pool: PoolState, metrics: Metrics,
                 end: Callable[[JobRecord, str], None], request_cycle: Callable[[], None]) -> None:
        """``end(job, reason)`` cancels a job (the attempts' finish); ``request_cycle`` asks for a cycle soon."""
        self.book = book
        self.pool = pool
        self.metrics = metrics
        self._end = end
        self._request_cycle = request_cycle

    def fingerprint(self) -> Hashable:
        """The projects (and their guarantees) and the pool's size: what a pod's validity depends on."""
        projects = self.book.projects()
        return (tuple((p.name, p.train_guarantee_milli) for p in projects.values()),
                len(self.pool.gpus), len(self.pool.nodes))

    def waiting_job(self, job_id: str) -> JobRecord | None:
        rec = self.book.live.get(job_id)
        return rec if rec is not None and rec.state in ("queued", "paused") else None

    def is_live(self, job_id: str) -> bool:
        return job_id in self.book.live

    def job_for_key(self, client_key: str) -> str:
        """The first job with this ``client_key`` (any user, any state), "" when none.

        Asked once per new kubectl pod: an index lookup (jobs_client_key) and
        a plain read, not a scan of every job under the write lock.
        """
        rows = self.book.store.query("SELECT id FROM jobs WHERE client_key=? ORDER BY num LIMIT 1", (client_key,))
        return str(rows[0][0]) if rows else ""

    def queue(self, spec: dict[str, Any], user: str, reason: str, client_key: str) -> str:
        """Validate ``spec`` as a submit is validated, then store it as ``user``'s queued job (and its event)."""
        js = validate_spec(spec, set(self.book.projects()), self.pool.limits())
        now = time.time()
        job_id = self.book.insert_new_job(lambda job_id, num: JobRecord(
            id=job_id, num=num, name=js.name, project=js.project, user=user, kind=js.kind, state="queued",
            request=js.request(), priority=js.priority, submitted_at=now, reason=reason, workdir="",
            command=js.command, labels=js.labels, client_key=client_key, lease_expires_at=None,
            replicas=js.replicas,  # a labelled batch Job's parallelism: one gang
        )).id
        self.metrics.submitted.labels(js.kind).inc()
        return job_id

    def cancel(self, job_id: str, reason: str) -> None:
        rec = self.book.live.get(job_id)
        if rec is not None:
            self._end(rec, reason)

    def request_cycle(self) -> None:
        self._request_cycle()
