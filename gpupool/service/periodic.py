"""The core's periodic work, every ``tick_s``: leases, GPU sampling and the watchdog, history, allocated vs used,
usage, events.

A part of the core (gpupool.service.core builds it and runs :meth:`PeriodicWork.tick`
on its tick loop). Each part is fenced, so one that raises on every tick
cannot stop the others nor the cycle that follows them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpupool.service.attempts import Attempts
from gpupool.service.book import JobBook
from gpupool.service.config import ServiceConfig
from gpupool.service.cycle import CycleRunner
from gpupool.service.gpu_use import JobUse, job_use
from gpupool.service.idle import IdleWatch
from gpupool.service.jobs import assigned_gpus
from gpupool.service.metrics import Metrics
from gpupool.service.pool_state import PoolState
from gpupool.service.standing import Standing
from gpupool.service.store import JobRecord
from gpupool.service.use_history import UseHistory
from gpupool.service.views import history_sample
from gpupool.service.watchdog import Reading, Watchdog, job_of_process

log = logging.getLogger("gpupool.service")


class PeriodicWork:
    """What the tick does, part by part, then a cycle."""

    def __init__(self, config: ServiceConfig, book: JobBook, pool: PoolState, attempts: Attempts,
                 cycles: CycleRunner, standing: Standing, metrics: Metrics, watchdog: Watchdog,
                 use: UseHistory | None = None, idle: IdleWatch | None = None) -> None:
        self.config = config
        self.book = book
        self.pool = pool
        self.attempts = attempts
        self.cycles = cycles
        self.standing = standing
        self.metrics = metrics
        self.watchdog = watchdog
        self.use = use
        self.idle = idle
        self._uses: tuple[list[JobRecord], dict[str, JobUse]] | None = None  # this tick's, for the idle watch
        self._last_history = 0.0
        self._trimmed_seq = -1  # events are trimmed at the first tick, then once a tenth more have come

    def tick(self) -> None:
        """The periodic work, then a cycle: the cycle runs whatever part of the work failed.

        Why each part is fenced: reclaims that wait on time (``min_runtime_s``,
        ``resume_backoff_s``, starvation) are decided only by the tick's cycle,
        so a part that raised on every tick (a fair-share figure divided by a
        rounded 0, issue 22) stopped them all, and the parts after it too
        (events no longer trimmed). A failed part is logged, the live mirror is
        reloaded if the part writes jobs (its transaction may have rolled back),
        and the tick goes on.
        """
        now = time.time()
        parts: tuple[tuple[str, Callable[[], None], bool], ...] = (  # (what, do it, whether it writes jobs)
            ("lease expiry", lambda: self._expire_leases(now), True),
            ("GPU sampling and watchdog", lambda: self._sample_and_watch(now), True),
            ("history", lambda: self._maybe_record_history(now), False),
            ("allocated vs used", lambda: self._meter_use(now), False),
            ("idle GPUs", lambda: self._watch_idle(now), True),
            ("usage", lambda: self._save_usage(now), False),
            ("usage metrics", lambda: self._refresh_usage_metrics(now), False),
            ("event trimming", self._trim_events, False),
        )
        for what, part, writes_jobs in parts:
            try:
                part()
            except Exception:
                log.exception("tick: %s failed; the rest of the tick and its cycle still run", what)
                if writes_jobs:
                    self.book.reload()  # a rolled-back transaction may have left the mirror ahead of the store
        self.cycles.run()

    def _expire_leases(self, now: float) -> None:
        """Cancel build shares whose lease ran out (not renewed by their kernel)."""
        # (a scan, not live_jobs: that sorts every live job, and ticks come every few seconds)
        expired = [r for r in self.book.live.values()
                   if r.kind == "build" and r.state in ("queued", "running")
                   and r.lease_expires_at is not None and r.lease_expires_at < now]
        for rec in sorted(expired, key=lambda r: r.num):
            self.attempts.finish(rec, "cancelled", "lease expired (not renewed)")

    def _sample_and_watch(self, now: float) -> None:
        """Read the GPUs (real ones, or simulated ones whose jobs report their use) and let the watchdog act."""
        if (not self.pool.simulated or self.pool.sim_use_dir is not None) and now - self.pool.sample_t >= min(self.config.tick_s,
                                                                        self.config.history_interval_s):
            self.pool.refresh_sample()
            self._run_watchdog(now)

    def _maybe_record_history(self, now: float) -> None:
        if now - self._last_history >= self.config.history_interval_s:
            self._record_history(now)

    def _save_usage(self, now: float) -> None:
        """Count each project's use up to now and keep it in the store (a restart loses at most one tick)."""
        usage = self.book.usage
        usage.accrue(now, self.book.held)
        self.book.store.save_usage(usage.t, usage.rows())

    def _refresh_usage_metrics(self, now: float) -> None:
        """Show each project's recent GPU-hours and its used share of the train pool in /metrics.

        The ratio comes from the unrounded figures (:meth:`Metrics.show_usage`):
        the shown share of a project with a tiny weight is 0.0, never divided by.
        """
        usage = self.book.usage
        history = usage.half_life_s > 0
        self.metrics.show_usage(usage.values, self.standing.fair_share_figures(now) if history else None)

    def _trim_events(self) -> None:
        """Keep the newest ``events_max_rows`` events; a write only once a tenth more have come."""
        keep = self.config.events_max_rows
        last = self.book.last_event_seq
        if last < self._trimmed_seq:  # the sequence restarted
            self._trimmed_seq = -1
        if last - self._trimmed_seq > keep // 10:
            self.book.store.trim_events(keep)
            self._trimmed_seq = last

    def _run_watchdog(self, now: float) -> None:
        sample = self.pool.sample
        if self.watchdog.mode == "off" or not sample:
            return
        running = {r.id: r for r in self.book.live_jobs(("running",))}
        sessions = self._sessions()
        used: dict[tuple[str, str], int] = {}
        for gid, s in sample.items():
            # pods a cluster's node agent reported come with their jobs (gpupool.service.reported_use); this
            # machine's processes are found by session
            known: dict[int, str] | None = getattr(s, "owners", None)
            for pid, mem in s.processes.items():
                jid = known.get(pid) if known is not None else job_of_process(pid, sessions)
                if jid is not None and jid in running:
                    used[(jid, gid)] = used.get((jid, gid), 0) + mem
        readings = []
        for (jid, gid), mem in used.items():
            limits = {g["id"]: g["memory_limit"] for g in assigned_gpus(running[jid])}
            readings.append(Reading(jid, gid, mem, int(limits.get(gid, 0))))
        for act in self.watchdog.check(readings, now):
            rec = running[act.job_id]
            self.book.emit("watchdog", job_id=rec.id, user=rec.user, project=rec.project, reason=act.message(),
                           state=rec.state)
            if act.kind == "stop" and rec.kind == "train" and rec.stop_intent is None:
                self.metrics.pauses.labels("watchdog").inc()
                self.attempts.begin_stop(rec, "watchdog", act.message())

    def _sessions(self) -> dict[int, str]:
        """Session id -> job id of the processes this service started (jobs run in their own sessions)."""
        return {h.pid: jid for jid, h in self.attempts.procs.items() if h.pid is not None}

    def _meter_use(self, now: float) -> None:
        """Add this tick's allocated and used GPU-seconds per running job (gpupool.service.gpu_use)."""
        if self.use is None:
            return
        running = self.book.live_jobs(("running",))
        sessions = self._sessions()
        uses = job_use(self.pool.sample, running, lambda pid: job_of_process(pid, sessions))
        self._uses = (running, uses)
        recs = {r.id: r for r in running}
        dt = self.use.add(now, {recs[jid].num: u for jid, u in uses.items()})
        self.use.flush(now)
        if dt > 0:
            per_project: dict[tuple[str, str], tuple[float, float, float]] = {}
            for jid, u in uses.items():
                key = (recs[jid].project, recs[jid].kind)
                a, m, s = per_project.get(key, (0.0, 0.0, 0.0))
                per_project[key] = (a + u.alloc * dt / 1000, m + u.measured * dt / 1000, s + u.used * dt / 1000)
            self.metrics.count_use(per_project)

    def _watch_idle(self, now: float) -> None:
        """Flag (or pause) running jobs whose measured use stayed under their project's idle rule (gpupool.service.idle)."""
        taken, self._uses = self._uses, None
        if self.idle is not None and taken is not None:
            self.idle.observe(now, *taken)

    def _record_history(self, now: float) -> None:
        self._last_history = now
        sample = history_sample(now, list(self.book.projects()), self.pool.gpus,
                                self.book.live_jobs(("running",)), self.pool.sample)
        self.book.store.add_history(now, sample, self.config.history_max_rows)
