"""Recovery after a restart: make the store true again, once, before the first cycle.

A restart (a crash or not) finds jobs the store says are running. Each one's
attempt is asked of the executor (:meth:`gpupool.backends.base.Executor.recover`)
and is then adopted (its handle goes back among the running attempts),
finished with the exit status the backend kept, or requeued when its start
never completed (docs/service.md, "Durability and crash recovery"). This runs
once, where :class:`gpupool.service.attempts.Attempts` runs for the service's
whole life, so it lives apart from it and acts only through its methods: every
transition is committed with its event as a running service's would be.
"""

from __future__ import annotations

import logging

from gpupool.backends.base import AttemptHandle, ForeignWork, kernel_pods_of
from gpupool.service.attempts import Attempts
from gpupool.service.jobs import assigned_gpus
from gpupool.service.store import JobRecord

log = logging.getLogger("gpupool.service")


def recover_attempts(attempts: Attempts) -> None:
    """Adopt, finish or requeue each job stored as running.

    Foreign work's jobs are made known to the backend first (recovery asks
    it about them), and a foreign build share's work is found again after.
    """
    book, pool, executor = attempts.book, attempts.pool, attempts.executor
    if attempts.foreign is not None:
        for rec in list(book.live.values()):
            attempts.foreign.track(rec)
    for rec in book.live_jobs(("running",)):
        if any(g["id"] not in pool.gpus for g in assigned_gpus(rec)):
            missing = "its GPU is no longer in the pool"
        else:
            missing = ""
        if rec.kind == "build":
            if missing:
                attempts.finish(rec, "cancelled", missing)
            elif (pods := kernel_pods_of(pool.backend)) is not None and pods.runs(rec):
                _recover_kernel_pod(attempts, rec)
            continue
        attempt = rec.attempts
        found = executor.recover(rec.id, attempt, rec.pid, rec.pid_start)
        handle: AttemptHandle | None = found.handle
        code: int | None = found.exit_code
        if found.outcome == "not-started":
            book.transition(rec.id, state="queued" if attempt <= 1 else "paused", attempts=attempt - 1,
                            assignment=None, started_at=None, stop_intent=None,
                            reason="start interrupted by a service restart; requeued")
            continue
        if found.outcome == "running" and handle is not None:
            attempts.procs[rec.id] = handle
            if not rec.pid and handle.pid:
                book.update(rec.id, pid=handle.pid, pid_start=handle.start_time)
            log.info("re-adopted job %s (attempt %d)", rec.id, attempt)
            if rec.stop_intent is not None:
                attempts.spawn_stop(rec.id, handle)
            elif missing:
                attempts.begin_stop(rec, "preempt", missing)
            continue
        if code is None:
            code = executor.exit_code(rec.id, attempt)
        fresh = book.job(rec.id)
        assert fresh is not None
        if code is None and fresh.stop_intent is None:
            attempts.finish_attempt(fresh, None, lost=True)
        else:
            attempts.finish_attempt(fresh, code)
    executor.recovered({(jid, h.attempt) for jid, h in attempts.procs.items()})
    if attempts.foreign is not None:
        _recover_foreign_shares(attempts, attempts.foreign)


def _recover_kernel_pod(attempts: Attempts, rec: JobRecord) -> None:
    """A share whose kernel pod may still run: adopt the pod (before the sweep of pods no attempt holds)."""
    found = attempts.executor.recover(rec.id, rec.attempts, None, None)
    if found.outcome == "running" and found.handle is not None:
        attempts.procs[rec.id] = found.handle
    else:
        attempts.finish(rec, "cancelled", "its kernel pod ended while the scheduler was restarting; "
                                          "start the kernel again")


def _recover_foreign_shares(attempts: Attempts, foreign: ForeignWork) -> None:
    """A running build share that stands for foreign work has that work to watch, as an attempt."""
    for rec in attempts.book.live_jobs(("running",), kind="build"):
        if foreign.stands_for(rec) is not None and rec.id not in attempts.procs:
            found = attempts.executor.recover(rec.id, rec.attempts, None, None)
            if found.outcome == "running" and found.handle is not None:
                attempts.procs[rec.id] = found.handle
            elif found.outcome == "not-started":
                attempts.requeue_unstarted(rec, "start interrupted by a service restart; requeued")
            else:
                attempts.finish_attempt(rec, found.exit_code, lost=found.exit_code is None)
