"""The scheduler service core: the one object the HTTP API drives, made of parts that share one store.

Contract (see docs/design.md): methods take and return plain dicts in the wire
shapes (Job, Project, Pool), raise :mod:`gpupool.wire.errors` exceptions for bad
input or forbidden actions, and run on the asyncio loop of the process.
Authorization lives in the core (its jobs API), not in the HTTP layer, so
every caller gets it.

:class:`SchedulerCore` builds the parts, holds them, runs their loops and
hands the public methods on. Each part is a plain class given what it
needs (docs/service.md, "Inside the core"):

- :class:`~gpupool.service.book.JobBook`: the store, the live-job mirror, projects, events;
- :class:`~gpupool.service.pool_state.PoolState`: the backend's nodes and GPUs, request limits, samples;
- :class:`~gpupool.service.attempts.Attempts`: start, stop, settle and recover attempts;
- :class:`~gpupool.service.cycle.CycleRunner`: snapshot -> policy -> decisions, deferred and coalesced;
- :class:`~gpupool.service.api_methods.JobsApi`: the public reads and actions, with authorization;
- :class:`~gpupool.service.periodic.PeriodicWork` and :class:`~gpupool.service.standing.Standing`:
  the tick's work, and the projects' usage figures;
- :class:`~gpupool.service.foreign.ForeignJobs`: only with a backend that ``AdoptsForeignPods``.

The backend comes from ``gpupool.app`` (:func:`gpupool.app.backend.build_core`),
the one place that picks one from the config; the core imports only the seam,
:mod:`gpupool.backends.base`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.backends.base import AdoptsForeignPods, Backend, Executor
from gpupool.backends.settings import resolve_mode
from gpupool.service.actor import Actor
from gpupool.service.api_methods import JobsApi
from gpupool.service.attempts import PAUSE_INTENTS, Attempts
from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.config import ServiceConfig
from gpupool.service.cycle import STOPPING_PROJECT, WAIT_FOR_STOPPING, CycleRunner, PolicyFn
from gpupool.service.foreign import ForeignJobs
from gpupool.service.idle import IdleWatch
from gpupool.service.jobs import assigned_gpus, held_milli
from gpupool.service.metrics import Metrics
from gpupool.service.periodic import PeriodicWork
from gpupool.service.pool_state import PoolState
from gpupool.service.recent_use import RecentUse
from gpupool.service.recovery import recover_attempts
from gpupool.service.report import build_report
from gpupool.service.reported_use import ReportedUse, load_node_agent_token
from gpupool.service.standing import Standing
from gpupool.service.state_dir import lock_state_dir, prepare_state_dir
from gpupool.service.store import Store
from gpupool.service.tokens import TokenStore, load_or_create_admin_token
from gpupool.service.usage import DecayedUsage
from gpupool.service.use_history import MAX_GAP_S, UseHistory
from gpupool.service.use_metrics import JobUseGauges
from gpupool.service.use_series import build_series
from gpupool.service.watchdog import Watchdog

log = logging.getLogger("gpupool.service")


class SchedulerCore:
    """Durable job state, a scheduling cycle on every event, and execution through a backend.

    ``make_backend`` is called once the core holds its state directory (a
    second service on the same directory is refused before it connects
    anywhere); ``policy`` replaces :func:`gpupool.policy.schedule` (tests,
    benchmarks), with the first-fit fallback for any cycle where it raises.
    """

    def __init__(self, config: ServiceConfig, make_backend: Callable[[], Backend], *,
                 policy: PolicyFn | None = None) -> None:
        self.config = config
        self.state_dir = config.state_dir
        self.owner_jobs = resolve_mode(config.run_jobs_as) == "owner"
        """Whether training jobs run as their owners' Unix accounts (a root service), not as ours."""
        prepare_state_dir(self.state_dir, jobs_enter=self.owner_jobs)
        self._lock = lock_state_dir(self.state_dir)
        try:
            store = Store(config.database, synchronous=config.sqlite_synchronous)
        except BaseException:
            self._lock.close()
            raise
        for suffix in ("", "-wal", "-shm"):  # SQLite makes its files by the umask (often 0644)
            db_file = Path(f"{config.database}{suffix}")
            if db_file.exists():
                os.chmod(db_file, 0o600)
        try:
            self.backend: Backend = make_backend()
        except BaseException:  # e.g. an unknown model in the simulation spec: free the state dir again
            store.close()
            self._lock.close()
            raise
        self.simulated: bool = bool(self.backend.simulated)
        self.admin_token = load_or_create_admin_token(self.state_dir, config.admin_token)
        self.tokens = TokenStore(store, self.admin_token, config.admin_user)
        self.hub: Any = None
        """With ``config.hub``: the JupyterHub identity check (gpupool.service.hub) the API asks for
        tokens that are not gpupool's."""
        if config.hub:
            from gpupool.service.hub import HubIdentity

            self.hub = HubIdentity(self)
        metrics = Metrics()
        self.registry = metrics.registry
        metrics.simulated.set(1 if self.simulated else 0)
        self.life = Lifecycle()
        saved_t, saved = store.load_usage()
        self.book = JobBook(store, DecayedUsage(config.usage_half_life_s, saved, saved_t), self.life)
        self.pool_state = PoolState(config, self.backend)
        pod_jobs = getattr(self.backend, "pod_jobs", None)  # a backend whose jobs are pods (Kubernetes)
        node_of_token = getattr(self.backend, "node_agent_node", None)  # agents' own tokens (Kubernetes)
        self.reported_use = ReportedUse(load_node_agent_token(self.state_dir), lambda: self.pool_state.nodes,
                                        pod_jobs if callable(pod_jobs) else None,
                                        node_of_token=node_of_token if callable(node_of_token) else None)
        """GPU use the node agents report (POST /api/v1/nodes/{node}/use), merged into each tick's sample."""
        if self.reported_use.enabled:
            self.pool_state.reported = self.reported_use.sample
        metrics.follow(lambda: (self.book.live.values(), self.pool_state.gpus))  # read at each scrape, not per cycle
        watchdog = Watchdog(config.watchdog if not self.simulated else "off", config.watchdog_grace_s)
        foreign = self.backend.foreign_pods if isinstance(self.backend, AdoptsForeignPods) else None
        host = ForeignJobs(self.book, self.pool_state, metrics,
                           end=lambda rec, why: self.attempts.finish(rec, "cancelled", why),
                           request_cycle=lambda: self.cycles.request()) if foreign is not None else None
        self.attempts = Attempts(config, self.book, self.pool_state, self.backend.executor, metrics, watchdog,
                                 self.life, request_cycle=lambda: self.cycles.request(), foreign=foreign,
                                 foreign_host=host)
        self.cycles = CycleRunner(config, self.book, self.pool_state, self.attempts, metrics, self.life, policy)
        self.standing = Standing(self.book, self.pool_state)
        self.jobs_api = JobsApi(config, self.book, self.pool_state, self.attempts, self.cycles, self.standing,
                                self.tokens, metrics, self.life, self.backend.executor, foreign)
        self.use_history = UseHistory(store, fine_keep_s=config.use_fine_keep_s, coarse_keep_s=config.use_coarse_keep_s,
                                      max_gap_s=max(MAX_GAP_S, 3 * config.tick_s))
        self.jobs_api.recent = RecentUse(self.use_history)
        self.registry.register(JobUseGauges(lambda: self.book.live.values(), self.jobs_api.recent))
        self.idle = IdleWatch(self.book, self.attempts, metrics, max_gap_s=max(MAX_GAP_S, 3 * config.tick_s),
                              foreign=foreign)
        self.jobs_api.idle = self.idle
        self.periodic = PeriodicWork(config, self.book, self.pool_state, self.attempts, self.cycles, self.standing,
                                     metrics, watchdog, self.use_history, self.idle)
        self.metrics = metrics
        self._tasks: list[asyncio.Task[None]] = []

    # ================================================================ lifecycle
    async def start(self) -> None:
        """Recover what the store says was running, then run the cycle, monitor and tick loops."""
        if self.life.started:
            return
        self.book.new_events = asyncio.Event()
        recover_attempts(self.attempts)
        self.life.started = True
        self.cycles.run()
        woken = asyncio.Event()
        if self.attempts.foreign is not None:
            self.attempts.foreign.on_new_work(_waker(asyncio.get_running_loop(), woken))
        self._tasks = [
            asyncio.create_task(self._monitor(woken), name="gpupool-monitor"),
            asyncio.create_task(self._loop(self.config.tick_s, self.periodic.tick), name="gpupool-tick"),
        ]
        n = len(self.pool_state.gpus)
        self.book.emit("pool", reason=f"scheduler started with {n} {'simulated ' if self.simulated else ''}"
                       f"GPU{'' if n == 1 else 's'}")

    async def stop(self) -> None:
        """Stop the loops; then pause running jobs (``on_shutdown="stop"``) or leave them for re-adoption."""
        if self.life.closing:
            return
        self.life.closing = True
        self.cycles.cancel_pending()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        attempts = self.attempts
        if self.life.started and self.config.on_shutdown == "stop":
            for rec in self.book.live_jobs(("running",), kind="train"):
                if rec.stop_intent is None:
                    attempts.begin_stop(rec, "shutdown", "service shutdown; resumes on the next start")
            if attempts.stop_tasks:
                await asyncio.gather(*attempts.stop_tasks.values(), return_exceptions=True)
            deadline = time.monotonic() + 5
            while attempts.procs and time.monotonic() < deadline:
                attempts.check_processes()
                if attempts.procs:
                    await asyncio.sleep(0.05)
        else:
            for stopping in attempts.stop_tasks.values():
                stopping.cancel()
        self.book.emit("pool", reason="scheduler stopped")
        try:
            self.use_history.flush(time.time(), everything=True)  # the open 10 s buckets too
        except Exception:
            log.exception("could not write the last allocated-vs-used figures")
        self.book.store.close()
        self.backend.close()
        self._lock.close()  # releases the flock: another service may now use the state dir

    async def _loop(self, period: float, fn: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(period)
            self._iteration(fn)

    async def _monitor(self, woken: asyncio.Event) -> None:
        """The monitor's tick every ``poll_s``, or at once when the backend says new work waits.

        A burst of new work (pods created by the hundred) is taken a tick at a
        time, at most one tick per ``cycle_min_interval_s``: each tick queues
        what arrived since the last, and one cycle places it.
        """
        loop = asyncio.get_running_loop()
        last = float("-inf")
        while True:
            # The poll is a timer that sets the same event (not asyncio.wait_for, which in Python 3.11 may swallow
            # the task's cancellation when the event is set at that moment: the service's stop would then hang).
            poll = loop.call_later(self.config.poll_s, woken.set)
            try:
                await woken.wait()
            finally:
                poll.cancel()
            gap = self.config.cycle_min_interval_s - (loop.time() - last)
            if gap > 0:  # woken soon after the last tick: what arrives meanwhile shares the next
                await asyncio.sleep(gap)
            woken.clear()
            last = loop.time()
            self._iteration(self.attempts.check_processes)

    def _iteration(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # one bad iteration must not end the service
            log.exception("scheduler loop %s failed", getattr(fn, "__name__", fn))
            self.book.reload()  # a rolled-back transaction may have left the mirror ahead of the store

    # ================================================================ shared state, as callers see it
    @property
    def executor(self) -> Executor[Any]:
        """The backend's executor, as the core's parts use it."""
        return self.attempts.executor

    @executor.setter
    def executor(self, executor: Executor[Any]) -> None:
        """Run attempts through ``executor`` from now on (tests and benchmarks wrap the backend's)."""
        self.attempts.executor = executor
        self.jobs_api.executor = executor

    @property
    def last_event_seq(self) -> int:
        return self.book.last_event_seq

    @property
    def cycle_pending(self) -> bool:
        """Whether a deferred cycle is scheduled and has not run yet."""
        return self.cycles.pending

    # ================================================================ the public methods (gpupool.api calls these)
    def status(self, actor: Actor | None = None) -> dict[str, Any]:
        return self.jobs_api.status(actor)

    def pool(self) -> dict[str, Any]:
        return self.jobs_api.pool_view()

    def list_projects(self, actor: Actor | None = None) -> list[dict[str, Any]]:
        return self.jobs_api.list_projects(actor)

    def set_project(self, actor: Actor, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        return self.jobs_api.set_project(actor, name, fields)

    def delete_project(self, actor: Actor, name: str) -> None:
        self.jobs_api.delete_project(actor, name)

    async def submit(self, actor: Actor, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return await self.jobs_api.submit(actor, spec)

    def list_jobs(self, actor: Actor, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.jobs_api.list_jobs(actor, filters)

    def get_job(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return self.jobs_api.get_job(actor, job_id)

    async def pause(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return await self.jobs_api.pause(actor, job_id)

    async def resume(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return await self.jobs_api.resume(actor, job_id)

    async def cancel(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return await self.jobs_api.cancel(actor, job_id)

    def renew(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return self.jobs_api.renew(actor, job_id)

    def read_log(self, actor: Actor, job_id: str, offset: int = 0, limit: int | None = None,
                 replica: int | None = None) -> dict[str, Any]:
        return self.jobs_api.read_log(actor, job_id, offset, limit, replica)

    def history(self, since: float | None = None) -> dict[str, Any]:
        return self.jobs_api.history(since)

    def report(self, actor: Actor, since: float | None = None, by: str | None = None) -> dict[str, Any]:
        """Allocated, used and idle GPU-hours since ``since`` per project, user or job (gpupool.service.report)."""
        return build_report(actor, self.use_history, self.book.store, self.book.projects(), since, by)

    def report_series(self, actor: Actor, since: float | None = None, step: float | None = None,
                      by: str | None = None) -> dict[str, Any]:
        """Allocated, measured and used GPUs over time per project, user or job (gpupool.service.use_series)."""
        return build_series(actor, self.use_history, self.book.store, self.book.projects(), since, step, by)

    def create_token(self, actor: Actor, user: str) -> dict[str, Any]:
        return self.jobs_api.create_token(actor, user)

    def authenticate(self, token: str | None) -> Actor | None:
        return self.reported_use.authenticate(token) or self.jobs_api.authenticate(token)

    async def node_agent(self, token: str) -> Actor | None:
        """The node agent holding ``token``, its own service account token (bound to its node), or None."""
        return await self.reported_use.authenticate_own(token)

    def report_node_use(self, actor: Actor, node: str, body: Any) -> dict[str, Any]:
        """A node agent's GPU use on its node, per pod (gpupool.service.reported_use)."""
        return self.reported_use.record(actor, node, body)

    def events_since(self, seq: int) -> list[dict[str, Any]]:
        """Events after ``seq`` (at most 1000), oldest first."""
        return self.book.events_since(seq)

    async def wait_events(self, seq: int, timeout: float) -> list[dict[str, Any]]:
        """Long-poll: events after ``seq``, waiting up to ``timeout`` seconds for the first one."""
        return await self.book.wait_events(seq, timeout)

    def recent_gpu_hours(self) -> dict[str, dict[str, float]]:
        return self.standing.recent_gpu_hours()

    def fair_share_standing(self) -> dict[str, dict[str, Any]]:
        return self.standing.fair_share_standing()


__all__ = ["PAUSE_INTENTS", "assigned_gpus", "held_milli", "STOPPING_PROJECT", "WAIT_FOR_STOPPING", "Actor",
           "SchedulerCore", "ServiceConfig"]


def _waker(loop: asyncio.AbstractEventLoop, woken: asyncio.Event) -> Callable[[], None]:
    """A function any thread may call, as often as it likes, to set ``woken`` on ``loop``.

    Calls while it is already set cost nothing (reading the flag from another
    thread may at worst schedule one set too many); after the loop has closed
    a call does nothing.
    """
    def wake() -> None:
        if not woken.is_set():
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop has closed (the service stopped)
                pass
    return wake
