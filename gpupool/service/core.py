"""The scheduler service core: the one object the HTTP API drives.

Contract (see docs/design.md): methods take and return plain dicts in the wire
shapes (Job, Project, Pool), raise :mod:`gpupool.wire.errors` exceptions for bad
input or forbidden actions, and run on the asyncio loop of the process.
Authorization lives here, not in the HTTP layer, so every caller gets it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.backends.base import AttemptHandle, Backend
from gpupool.backends.settings import resolve_mode
from gpupool.inventory import GpuInfo, GpuSample
from gpupool.policy import PolicyCache
from gpupool.policy.fairshare import ShareInput
from gpupool.policy.model import (
    BUILD_POOL,
    TRAIN_POOL,
    PolicyConfig,
    Workload,
)
from gpupool.service.actor import Actor
from gpupool.service.adopted import AdoptedPodsMixin
from gpupool.service.api_methods import ApiMethodsMixin
from gpupool.service.attempts import PAUSE_INTENTS, AttemptsMixin
from gpupool.service.config import ServiceConfig
from gpupool.service.cycle import STOPPING_PROJECT, WAIT_FOR_STOPPING, CycleMixin, PolicyFn
from gpupool.service.jobs import assigned_gpus, held_milli, workloads_of
from gpupool.service.live_view import LiveView
from gpupool.service.metrics import Metrics
from gpupool.service.state_dir import lock_state_dir, prepare_state_dir
from gpupool.service.store import LIVE_STATES, JobRecord, ProjectRecord, Store
from gpupool.service.tokens import TokenStore, load_or_create_admin_token
from gpupool.service.usage import (
    DecayedUsage,
    fair_share_figures,
    fair_share_standing,
    gpu_hours,
)
from gpupool.service.validation import (
    PoolLimits,
)
from gpupool.service.views import history_sample
from gpupool.service.watchdog import Reading, Watchdog, job_of_process
from gpupool.wire.errors import InvalidRequest, Unavailable

# The implementation (class SchedulerCore) is built in this module by the
# service work. Its public surface, which gpupool.api relies on:
#
#   SchedulerCore(config: ServiceConfig, make_backend)   built by gpupool.app.backend.build_core
#   await core.start() / await core.stop()          recover from the store, run cycles and ticks
#   core.simulated -> bool
#   core.registry -> prometheus_client.CollectorRegistry
#   core.status() -> dict                            {"simulated", "pool", "projects", "queue"}
#   core.pool() -> dict                              Pool
#   core.list_projects() -> list[dict]
#   core.set_project(actor, name, fields: dict) -> dict       admin only
#   core.delete_project(actor, name) -> None                  admin only
#   await core.submit(actor, spec: dict) -> tuple[dict, bool] (Job, created)
#   core.list_jobs(actor, filters: dict) -> list[dict]
#   core.get_job(actor, job_id) -> dict
#   await core.pause(actor, job_id) / resume / cancel -> dict
#   core.renew(actor, job_id) -> dict
#   core.read_log(actor, job_id, offset: int, limit: int | None) -> dict
#   core.events_since(seq: int) -> list[dict]; await core.wait_events(seq, timeout) -> list[dict]
#   core.last_event_seq -> int
#   core.history(since: float | None) -> dict
#   core.tokens: user-token store: core.create_token(actor, user) -> dict; core.authenticate(token) -> Actor | None
#
# Also available: core.admin_token (str), core.config, core.state_dir.

log = logging.getLogger("gpupool.service")

_WORKLOAD_FIELDS = frozenset({"state", "assignment", "started_at", "attempts", "paused_at", "priority", "request",
                              "project", "kind", "submitted_at"})
"""Job fields the policy's Workload is built from; other changes (reason, pid...) keep the cached one."""


class SchedulerCore(AdoptedPodsMixin, ApiMethodsMixin, CycleMixin, AttemptsMixin):
    """Durable job state, a scheduling cycle on every event, and execution through a backend.

    This module holds the core's state, its lifecycle, the live-job mirror,
    the periodic work and the event log; the mixins hold the public methods
    (``api_methods``), the scheduling cycle (``cycle``) and the jobs'
    attempts (``attempts``), all on this one object's state.

    The backend comes from ``gpupool.app`` (:func:`gpupool.app.backend.build_core`),
    the one place that picks one from the config: ``make_backend`` is called
    once the core holds its state directory (a second service on the same
    directory is refused before it starts anything). ``policy`` replaces
    :func:`gpupool.policy.schedule` (tests, benchmarks), with the first-fit
    fallback for any cycle where it raises.
    """

    def __init__(self, config: ServiceConfig, make_backend: Callable[[], Backend], *,
                 policy: PolicyFn | None = None) -> None:
        self.config = config
        self.state_dir = self.config.state_dir
        self.owner_jobs = resolve_mode(self.config.run_jobs_as) == "owner"
        """Whether training jobs run as their owners' Unix accounts (a root service), not as ours."""
        prepare_state_dir(self.state_dir, jobs_enter=self.owner_jobs)
        self._lock = lock_state_dir(self.state_dir)
        try:
            self._store = Store(self.config.database, synchronous=self.config.sqlite_synchronous)
        except BaseException:
            self._lock.close()
            raise
        for suffix in ("", "-wal", "-shm"):  # SQLite makes its files by the umask (often 0644)
            db_file = Path(f"{self.config.database}{suffix}")
            if db_file.exists():
                os.chmod(db_file, 0o600)
        try:
            self.backend: Backend = make_backend()
        except BaseException:  # e.g. an unknown model in the simulation spec: free the state dir again
            self._store.close()
            self._lock.close()
            raise
        self.simulated: bool = bool(self.backend.simulated)
        self.executor = self.backend.executor
        self.admin_token = load_or_create_admin_token(self.state_dir, self.config.admin_token)
        self.tokens = TokenStore(self._store, self.admin_token, self.config.admin_user)
        self.hub: Any = None
        """With ``config.hub``: the JupyterHub identity check (gpupool.service.hub) the API asks for
        tokens that are not gpupool's."""
        if self.config.hub:
            from gpupool.service.hub import HubIdentity

            self.hub = HubIdentity(self)
        self._metrics = Metrics()
        self.registry = self._metrics.registry
        self._metrics.simulated.set(1 if self.simulated else 0)
        self._metrics.follow(lambda: (self._live.values(), self._gpus))  # read at each scrape, not per cycle
        self._policy_override = policy
        self._policy_cache = PolicyCache()  # the policy's carries from cycle to cycle: this core's alone
        self._gpus: dict[str, GpuInfo] = self.backend.gpus
        self._nodes = self.backend.nodes
        self._pool_limits: PoolLimits | None = None
        self._project_cache: dict[str, ProjectRecord] | None = None
        self._procs: dict[str, AttemptHandle] = {}
        # Keyed by (job, attempt): a stop of an attempt that already ended must never hide
        # the stop of the job's next attempt (pause, resume, cancel in quick succession).
        self._stop_tasks: dict[tuple[str, int], asyncio.Task[bool]] = {}
        self._settled: dict[str, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._new_events: asyncio.Event | None = None
        self._watchdog = Watchdog(self.config.watchdog if not self.simulated else "off", self.config.watchdog_grace_s)
        self._sample: dict[str, GpuSample] = {}
        self._sample_t = 0.0
        self._last_history = 0.0
        self._started = False
        self._closing = False
        self.last_event_seq: int = self._store.last_event_seq()
        self._trimmed_seq = -1  # events are trimmed at the first tick, then once a tenth more have come
        self._live: dict[str, JobRecord] = {}
        self._view = LiveView()
        saved_t, saved = self._store.load_usage()
        self._usage = DecayedUsage(self.config.usage_half_life_s, saved, saved_t)
        self._held: dict[tuple[str, str], int] = {}
        self._reload_live()
        self._last_cycle = 0.0
        self._last_cycle_s = 0.0
        self._cycle_handle: asyncio.Handle | None = None  # a deferred cycle waiting to run
        self._mps_checked: tuple[float, bool] | None = None
        self._holding: set[str] = set()  # jobs the policy does not see until their held_until (a refused pod)

    # ================================================================ lifecycle
    async def start(self) -> None:
        """Recover what the store says was running, then run the cycle, monitor and tick loops."""
        if self._started:
            return
        self._new_events = asyncio.Event()
        self._recover()
        self._started = True
        self._cycle()
        self._tasks = [
            asyncio.create_task(self._loop(self.config.poll_s, self._check_processes), name="gpupool-monitor"),
            asyncio.create_task(self._loop(self.config.tick_s, self._tick), name="gpupool-tick"),
        ]
        n = len(self._gpus)
        self._emit("pool", reason=f"scheduler started with {n} {'simulated ' if self.simulated else ''}"
                   f"GPU{'' if n == 1 else 's'}")

    async def stop(self) -> None:
        """Stop the loops; then pause running jobs (``on_shutdown="stop"``) or leave them for re-adoption."""
        if self._closing:
            return
        self._closing = True
        if self._cycle_handle is not None:
            self._cycle_handle.cancel()
            self._cycle_handle = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self._started and self.config.on_shutdown == "stop":
            for rec in self._live_jobs(("running",), kind="train"):
                if rec.stop_intent is None:
                    self._begin_stop(rec, "shutdown", "service shutdown; resumes on the next start")
            if self._stop_tasks:
                await asyncio.gather(*self._stop_tasks.values(), return_exceptions=True)
            deadline = time.monotonic() + 5
            while self._procs and time.monotonic() < deadline:
                self._check_processes()
                if self._procs:
                    await asyncio.sleep(0.05)
        else:
            for t in self._stop_tasks.values():
                t.cancel()
        self._emit("pool", reason="scheduler stopped")
        self._store.close()
        self.backend.close()
        self._lock.close()  # releases the flock: another service may now use the state dir

    async def _loop(self, period: float, fn: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                fn()
            except Exception:  # one bad iteration must not end the service
                log.exception("scheduler loop %s failed", getattr(fn, "__name__", fn))
                self._reload_live()  # a rolled-back transaction may have left the mirror ahead of the store

    def _check_open(self) -> None:
        if self._closing:
            raise Unavailable("the scheduler is shutting down")

    # ================================================================ live-job cache
    # The live jobs (queued, running, paused) are mirrored in memory so a cycle
    # does not re-read and re-decode every pending job from SQLite. Every write
    # goes to the store first (durable), then to the mirror; final jobs leave it.
    def _reload_live(self) -> None:
        self._live = {r.id: r for r in self._store.jobs(LIVE_STATES)}
        self._workloads: dict[str, tuple[Workload, ...]] = {}
        self._view.reset()
        self._usage.accrue(time.time(), self._held)  # what was held until now, then what the store says
        self._held = {}
        for rec in self._live.values():
            if rec.state == "running":
                key = (rec.project, rec.kind)
                self._held[key] = self._held.get(key, 0) + held_milli(rec)

    def _held_changes(self, rec: JobRecord, assignment: dict[str, Any] | None) -> None:
        """A live job's assignment is about to change: count the use so far, then what its project holds now."""
        new = sum(int(g["milli"]) for g in (assignment or {}).get("gpus", []))
        old = held_milli(rec)
        if new == old:
            return
        now = time.time()
        # A cycle that starts thousands of jobs changes the sums thousands of times within
        # milliseconds: count up to now at most every 0.1 s (each change is then off by < 0.1 s
        # of its share), so the cost stays O(projects) per 0.1 s, not per start.
        if now - self._usage.t >= 0.1:
            self._usage.accrue(now, self._held)
        key = (rec.project, rec.kind)
        self._held[key] = self._held.get(key, 0) + new - old

    def _workloads_of(self, rec: JobRecord) -> tuple[Workload, ...]:
        """The policy view of a live job (one workload per replica for a gang), rebuilt only after it changed."""
        w = self._workloads.get(rec.id)
        if w is None:
            w = self._workloads[rec.id] = workloads_of(rec)
        return w

    def _shown(self, rec: JobRecord) -> tuple[Workload, ...]:
        """A live job's workloads in the cycle's snapshot: none for a user-paused or a stopping job.

        User-paused jobs (sticky) are left out; so are jobs already being
        stopped: they are leaving, and showing them as running would make the
        policy preempt a second victim for the same waiting job during the grace.
        """
        if (rec.state == "paused" and rec.user_paused) or rec.stop_intent is not None:
            return ()
        if rec.held_until is not None and rec.state != "running" and time.time() < rec.held_until:
            self._holding.add(rec.id)  # shown again by the first cycle after its hold (_release_holds)
            return ()
        return self._workloads_of(rec)

    def _release_holds(self) -> None:
        """Jobs whose hold (after a refused pod) is over are shown to the policy again from this cycle on."""
        now = time.time()
        for job_id in list(self._holding):
            rec = self._live.get(job_id)
            if rec is None or rec.held_until is None or rec.held_until <= now:
                self._holding.discard(job_id)
                self._view.touch(job_id)

    def _hold_expires_in(self, wait_s: float) -> None:
        """A job is held for ``wait_s``: run a cycle when that is over (the tick would, a little later)."""
        if not self._closing:
            asyncio.get_running_loop().call_later(wait_s + 0.01, self._request_cycle)

    def _job_added(self, rec: JobRecord) -> None:
        """A new job entered the live mirror (its record is stored)."""
        self._live[rec.id] = rec
        self._view.touch(rec.id)

    def _update(self, job_id: str, **changes: Any) -> None:
        self._store.update_job(job_id, **changes)
        self._view.touch(job_id)  # every write: the cycle's view recomputes this job's entries
        if not _WORKLOAD_FIELDS.isdisjoint(changes):
            self._workloads.pop(job_id, None)
        rec = self._live.get(job_id)
        if rec is None:
            return
        if "assignment" in changes:
            self._held_changes(rec, changes["assignment"])
        for k, v in changes.items():
            setattr(rec, k, v)
        if not rec.live:
            del self._live[job_id]

    def _transition(self, job_id: str, **changes: Any) -> None:
        """Write a job's change and its event in one transaction.

        A service killed between the two would otherwise leave a state that no
        event ever announced (a job running, and no ``running`` event).
        """
        with self._store.transaction():
            self._update(job_id, **changes)
            self._emit_job(job_id)

    def _job(self, job_id: str) -> JobRecord | None:
        rec = self._live.get(job_id)
        return rec if rec is not None else self._store.job(job_id)

    def _live_jobs(self, states: tuple[str, ...] = LIVE_STATES, kind: str | None = None,
                   project: str | None = None) -> list[JobRecord]:
        """Live jobs in number order (kept in order by the view, not sorted per call)."""
        return [r for r in self._view.ordered(self._live, self._shown)
                if r.state in states and (kind is None or r.kind == kind) and (project is None or r.project == project)]

    # ================================================================ pool model
    def _projects(self) -> dict[str, ProjectRecord]:
        """Projects by name, in name order: read from the store once, dropped whenever one changes."""
        if self._project_cache is None:
            self._project_cache = {p.name: p for p in self._store.projects()}
        return self._project_cache

    def _limits(self) -> PoolLimits:
        """What a request may ask for; fixed for the core's life (the inventory is read once), so built once."""
        if self._pool_limits is None:
            self._pool_limits = self._build_limits()
        return self._pool_limits

    def _build_limits(self) -> PoolLimits:
        models: dict[str, int] = {}
        for g in self._gpus.values():
            models[g.model] = max(models.get(g.model, 0), g.memory)
        max_gpus = {p: max((len(n.gpus) for n in self._nodes if p in n.pools), default=0) for p in (BUILD_POOL, TRAIN_POOL)}
        train_nodes = tuple(len(n.gpus) for n in self._nodes if TRAIN_POOL in n.pools)
        return PoolLimits(models, max_gpus, self.config.host_cpu(), self.config.host_memory(), len(self._gpus),
                          train_nodes, elastic=bool(getattr(self.backend, "elastic", False)))

    def _policy_config(self) -> PolicyConfig:
        c = self.config
        return PolicyConfig(min_runtime_s=c.min_runtime_s, resume_backoff_s=c.resume_backoff_s,
                            starvation_s=c.starvation_s, placement=c.placement,
                            elastic_pool=bool(getattr(self.backend, "elastic", False)))

    def _allocations(self, running: list[JobRecord] | None = None) -> dict[str, int]:
        """Milli-GPU held per GPU by ``running`` (None: every running job, from the view, kept per job)."""
        if running is None:
            return self._view.used(self._live, self._shown)
        used: dict[str, int] = {}
        for rec in running:
            for g in assigned_gpus(rec):
                used[g["id"]] = used.get(g["id"], 0) + int(g["milli"])
        return used

    # ================================================================ periodic work
    def _tick(self) -> None:
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
                    self._reload_live()  # a rolled-back transaction may have left the mirror ahead of the store
        self._cycle()

    def _expire_leases(self, now: float) -> None:
        """Cancel build shares whose lease ran out (not renewed by their kernel)."""
        # (a scan, not _live_jobs: that sorts every live job, and ticks come every few seconds)
        expired = [r for r in self._live.values()
                   if r.kind == "build" and r.state in ("queued", "running")
                   and r.lease_expires_at is not None and r.lease_expires_at < now]
        for rec in sorted(expired, key=lambda r: r.num):
            self._finish(rec, "cancelled", "lease expired (not renewed)")

    def _sample_and_watch(self, now: float) -> None:
        """Read the GPUs (real ones only) and let the watchdog act on what they say."""
        if not self.simulated and now - self._sample_t >= min(self.config.tick_s, self.config.history_interval_s):
            self._refresh_sample()
            self._run_watchdog(now)

    def _maybe_record_history(self, now: float) -> None:
        if now - self._last_history >= self.config.history_interval_s:
            self._record_history(now)

    def _save_usage(self, now: float) -> None:
        """Count each project's use up to now and keep it in the store (a restart loses at most one tick)."""
        self._usage.accrue(now, self._held)
        self._store.save_usage(self._usage.t, self._usage.rows())

    def _refresh_usage_metrics(self, now: float) -> None:
        """Show each project's recent GPU-hours and its used share of the train pool in /metrics.

        The ratio comes from the unrounded figures (:meth:`Metrics.show_usage`):
        the shown share of a project with a tiny weight is 0.0, never divided by.
        """
        history = self._usage.half_life_s > 0
        self._metrics.show_usage(self._usage.values, self._fair_share_figures(now) if history else None)

    def recent_gpu_hours(self) -> dict[str, dict[str, float]]:
        """Each project's decayed GPU-hours by kind, as of now (what it has held, a half-life ago counting half)."""
        now = time.time()
        self._usage.accrue(now, self._held)
        out: dict[str, dict[str, float]] = {}
        for (project, kind), value in self._usage.at(now).items():
            out.setdefault(project, {})[kind] = gpu_hours(value)
        return out

    def fair_share_standing(self) -> dict[str, dict[str, Any]]:
        """Each project's long-run fair share of the train pool and how much of it it uses, now and lately."""
        capacity, inputs = self._share_inputs()
        average = self._usage.average_milli(time.time(), "train")
        return fair_share_standing(capacity, inputs, average, self._usage.half_life_s > 0, self._train_held())

    def _fair_share_figures(self, now: float) -> dict[str, tuple[float, float]]:
        """Each project's (long-run share, training use now plus lately) in milli-GPU, unrounded."""
        capacity, inputs = self._share_inputs()
        return fair_share_figures(capacity, inputs, self._usage.average_milli(now, "train"), self._train_held())

    def _train_held(self) -> dict[str, float]:
        """Milli-GPU each project's running training jobs hold now: the policy's "use now"."""
        return {project: float(milli) for (project, kind), milli in self._held.items() if kind == "train"}

    def _share_inputs(self) -> tuple[int, dict[str, ShareInput]]:
        """The train pool's capacity and every project's numbers for its long-run share (all of it wanted)."""
        capacity = sum(g.capacity_milli for n in self._nodes if TRAIN_POOL in n.pools for g in n.gpus)
        inputs = {p.name: ShareInput(p.train_guarantee_milli, p.train_limit_milli, p.weight, 0)
                  for p in self._projects().values()}
        return capacity, inputs

    def _trim_events(self) -> None:
        """Keep the newest ``events_max_rows`` events; a write only once a tenth more have come."""
        keep = self.config.events_max_rows
        if self.last_event_seq < self._trimmed_seq:  # the sequence restarted
            self._trimmed_seq = -1
        if self.last_event_seq - self._trimmed_seq > keep // 10:
            self._store.trim_events(keep)
            self._trimmed_seq = self.last_event_seq

    def _refresh_sample(self) -> None:
        try:
            self._sample = self.backend.sample()
        except Exception:
            log.exception("GPU sampling failed")
            self._sample = {}
        self._sample_t = time.time()

    def _run_watchdog(self, now: float) -> None:
        if self._watchdog.mode == "off" or not self._sample:
            return
        running = {r.id: r for r in self._live_jobs(("running",))}
        sessions = {h.pid: jid for jid, h in self._procs.items()}
        used: dict[tuple[str, str], int] = {}
        for gid, s in self._sample.items():
            for pid, mem in s.processes.items():
                jid = job_of_process(pid, sessions)
                if jid is not None and jid in running:
                    used[(jid, gid)] = used.get((jid, gid), 0) + mem
        readings = []
        for (jid, gid), mem in used.items():
            limits = {g["id"]: g["memory_limit"] for g in assigned_gpus(running[jid])}
            readings.append(Reading(jid, gid, mem, int(limits.get(gid, 0))))
        for act in self._watchdog.check(readings, now):
            rec = running[act.job_id]
            self._emit("watchdog", job_id=rec.id, user=rec.user, project=rec.project, reason=act.message(),
                       state=rec.state)
            if act.kind == "stop" and rec.kind == "train" and rec.stop_intent is None:
                self._metrics.pauses.labels("watchdog").inc()
                self._begin_stop(rec, "watchdog", act.message())

    def _record_history(self, now: float) -> None:
        self._last_history = now
        sample = history_sample(now, list(self._projects()), self._gpus,
                                self._live_jobs(("running",)), self._sample)
        self._store.add_history(now, sample, self.config.history_max_rows)

    # ================================================================ events
    def _emit(self, type_: str, **fields: Any) -> int:
        seq = self._store.add_event(time.time(), {"type": type_, **fields})
        self.last_event_seq = seq
        if self._new_events is not None:
            self._new_events.set()
            self._new_events = asyncio.Event()
        return seq

    def _emit_job(self, job_id: str) -> None:
        rec = self._job(job_id)
        if rec is not None:
            self._emit("job", job_id=rec.id, state=rec.state, reason=rec.reason, user=rec.user, project=rec.project,
                       kind=rec.kind)

    def events_since(self, seq: int) -> list[dict[str, Any]]:
        """Events after ``seq`` (at most 1000), oldest first."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidRequest("since must be an integer event sequence number")
        return self._store.events_since(seq)

    async def wait_events(self, seq: int, timeout: float) -> list[dict[str, Any]]:
        """Long-poll: events after ``seq``, waiting up to ``timeout`` seconds for the first one."""
        events = self.events_since(seq)
        if events or timeout <= 0 or self._closing:
            return events
        if self._new_events is None:
            self._new_events = asyncio.Event()
        waiter = self._new_events
        try:
            await asyncio.wait_for(waiter.wait(), min(float(timeout), 300.0))
        except asyncio.TimeoutError:
            return []
        if self._closing:
            return []
        return self.events_since(seq)

__all__ = ["PAUSE_INTENTS", "assigned_gpus", "held_milli", "STOPPING_PROJECT", "WAIT_FOR_STOPPING", "Actor", "SchedulerCore", "ServiceConfig"]
