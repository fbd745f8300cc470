"""The scheduler service core: the one object the HTTP API drives.

Contract (see docs/design.md): methods take and return plain dicts in the wire
shapes (Job, Project, Pool), raise :mod:`scheduler.errors` exceptions for bad
input or forbidden actions, and run on the asyncio loop of the process.
Authorization lives here, not in the HTTP layer, so every caller gets it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from scheduler.envbuilder import gpu_environment, mps_running
from scheduler.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from scheduler.executor.accounts import check_reachable, job_account, job_environment, resolve_mode
from scheduler.executor.local import LocalExecutor, ProcessHandle
from scheduler.inventory import GpuInfo, GpuSample, Inventory, detect
from scheduler.policy import schedule
from scheduler.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Decisions,
    Gpu,
    Node,
    PolicyConfig,
    Project,
    Snapshot,
    Start,
    Workload,
)
from scheduler.service import fallback_policy
from scheduler.service.build_quota import build_holders, check_build_quota
from scheduler.service.config import ServiceConfig
from scheduler.service.jobs import job_to_wire, project_to_wire, workload_of
from scheduler.service.membership import is_member, unix_groups, validate_members
from scheduler.service.metrics import Metrics
from scheduler.service.tokens import TokenStore, load_or_create_admin_token
from scheduler.service.validation import (
    PoolLimits,
    validate_project,
    validate_spec,
    validate_user,
)
from scheduler.service.views import history_sample, job_filters, pool_view, read_log_chunk
from scheduler.service.watchdog import Reading, Watchdog, job_of_process
from scheduler.store import LIVE_STATES, JobRecord, ProjectRecord, Store


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user name, whether they hold the admin token, and their groups (project membership)."""

    user: str
    admin: bool = False
    groups: frozenset[str] = frozenset()


def assigned_gpus(rec: JobRecord) -> list[dict[str, Any]]:
    """The per-GPU entries (id, milli, memory_limit...) of a job's stored assignment; [] when it has none."""
    return (rec.assignment or {}).get("gpus", [])


def held_milli(rec: JobRecord) -> int:
    """Milli-GPU a job's assignment holds, summed over its GPUs (0 with no assignment).

    One definition, so that project usage and the build-quota check count a job's
    share the same way.
    """
    return sum(int(g["milli"]) for g in assigned_gpus(rec))


# The implementation (class SchedulerCore) is built in this module by the
# service work. Its public surface, which scheduler.api relies on:
#
#   SchedulerCore(config: ServiceConfig)           config from scheduler.service.config
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

log = logging.getLogger("scheduler.service")

PAUSE_INTENTS = {"pause": "paused by user", "preempt": "paused to make room", "shutdown": "paused by a service shutdown"}
_WORKLOAD_FIELDS = frozenset({"state", "assignment", "started_at", "attempts", "paused_at", "priority", "request",
                              "project", "kind", "submitted_at"})
"""Job fields the policy's Workload is built from; other changes (reason, pid...) keep the cached one."""
WAIT_FOR_STOPPING = "waiting for stopping jobs to release their GPUs"
STOPPING_PROJECT = "\x00stopping"
"""Pseudo-project of stopping jobs in the held view: not a valid project name, so never a real one."""

PolicyFn = Callable[[Snapshot], Decisions]


def _lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold an exclusive lock on ``<state_dir>/service.lock`` for the core's lifetime.

    Two services on one state dir would both start jobs on the same GPUs. The
    kernel drops the lock when the process dies (kill -9 included), so a crash
    never leaves a stale lock behind.
    """
    f = open(state_dir / "service.lock", "a+")  # kept open: the lock lives as long as this file
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise Unavailable(f"another gpupool scheduler (pid {holder}) is using the state directory {state_dir}") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class SchedulerCore:
    """Durable job state, a scheduling cycle on every event, and local execution.

    ``inventory`` and ``policy`` may be injected (tests, benchmarks); by
    default the inventory comes from NVML or the simulation spec, and the
    policy is :func:`scheduler.policy.schedule`, with the first-fit fallback
    for any cycle where the engine raises.
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        inventory: Inventory | None = None,
        policy: PolicyFn | None = None,
    ) -> None:
        self.config = config or ServiceConfig()
        self.state_dir = self.config.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Jobs of other accounts (a root service) must enter the state dir to reach their own job's
        # directory: 0711 lets them in but not list it; every secret in it is a 0600 file.
        self._owner_jobs = resolve_mode(self.config.run_jobs_as) == "owner"
        os.chmod(self.state_dir, 0o711 if self._owner_jobs else 0o700)
        if self._owner_jobs:
            check_reachable(self.state_dir)
        self._lock = _lock_state_dir(self.state_dir)
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
            self._inventory = inventory or detect(self.config.simulate, self.config.default_simulation,
                                                  self.config.node_name)
        except BaseException:  # e.g. an unknown model in the simulation spec: free the state dir again
            self._store.close()
            self._lock.close()
            raise
        self.simulated: bool = bool(self._inventory.simulated)
        self.executor = LocalExecutor(self.config.jobs_dir, traversable=self._owner_jobs)
        self.admin_token = load_or_create_admin_token(self.state_dir, self.config.admin_token)
        self.tokens = TokenStore(self._store, self.admin_token, self.config.admin_user)
        self._metrics = Metrics()
        self.registry = self._metrics.registry
        self._metrics.simulated.set(1 if self.simulated else 0)
        self._policy_override = policy
        self._gpus: dict[str, GpuInfo] = {g.id: g for g in self._inventory.gpus()}
        self._gpu_node: dict[str, str] = {}
        self._nodes = self._build_nodes()
        self._pool_limits: PoolLimits | None = None
        self._project_cache: dict[str, ProjectRecord] | None = None
        self._procs: dict[str, ProcessHandle] = {}
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
        self._reload_live()
        self._last_cycle = 0.0
        self._last_cycle_s = 0.0
        self._cycle_handle: asyncio.Handle | None = None  # a deferred cycle waiting to run
        self._mps_checked: tuple[float, bool] | None = None

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
        self._emit("pool", reason=f"scheduler started with {len(self._gpus)} "
                   f"{'simulated ' if self.simulated else ''}GPU(s)")

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
        self._inventory.close()
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
        self._workloads: dict[str, Workload] = {}

    def _workload(self, rec: JobRecord) -> Workload:
        """The policy view of a live job, rebuilt only after the job changed."""
        w = self._workloads.get(rec.id)
        if w is None:
            w = self._workloads[rec.id] = workload_of(rec)
        return w

    def _update(self, job_id: str, **changes: Any) -> None:
        self._store.update_job(job_id, **changes)
        if not _WORKLOAD_FIELDS.isdisjoint(changes):
            self._workloads.pop(job_id, None)
        rec = self._live.get(job_id)
        if rec is None:
            return
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
        return [r for r in sorted(self._live.values(), key=lambda r: r.num)
                if r.state in states and (kind is None or r.kind == kind) and (project is None or r.project == project)]

    # ================================================================ pool model
    def _build_nodes(self) -> tuple[Node, ...]:
        cfg = self.config
        gpus = sorted(self._gpus.values(), key=lambda g: g.index)
        cpu_milli = int(cfg.host_cpu() * 1000)
        mem_mib = cfg.host_memory() // (1024 * 1024)

        def node(name: str, members: list[GpuInfo], pools: frozenset[str]) -> Node:
            for g in members:
                self._gpu_node[g.id] = name
            return Node(name, cpu_milli, mem_mib,
                        tuple(Gpu(g.id, g.index, g.model, g.memory // (1024 * 1024), g.topology_group) for g in members),
                        pools)

        if cfg.build_gpus is None:
            return (node(cfg.node_name, gpus, frozenset({BUILD_POOL, TRAIN_POOL})),)
        n = min(cfg.build_gpus, len(gpus))
        return (node(f"{cfg.node_name}-build", gpus[:n], frozenset({BUILD_POOL})),
                node(cfg.node_name, gpus[n:], frozenset({TRAIN_POOL})))

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
        return PoolLimits(models, max_gpus, self.config.host_cpu(), self.config.host_memory(), len(self._gpus))

    def _policy_config(self) -> PolicyConfig:
        c = self.config
        return PolicyConfig(min_runtime_s=c.min_runtime_s, resume_backoff_s=c.resume_backoff_s,
                            starvation_s=c.starvation_s, placement=c.placement)

    def _allocations(self, running: list[JobRecord]) -> dict[str, int]:
        used: dict[str, int] = {}
        for rec in running:
            for g in assigned_gpus(rec):
                used[g["id"]] = used.get(g["id"], 0) + int(g["milli"])
        return used

    # ================================================================ scheduling cycle
    def _schedule(self, snapshot: Snapshot) -> Decisions:
        fn: PolicyFn = self._policy_override or schedule
        try:
            return fn(snapshot)
        except Exception:
            if fn is fallback_policy.schedule:
                raise
            log.exception("policy engine failed; using the first-fit fallback for this cycle")
            return fallback_policy.schedule(snapshot)

    def _snapshot(self, live: list[JobRecord], hold_stopping: bool = False) -> Snapshot:
        """The policy's input. User-paused jobs (sticky) are left out.

        Jobs already being stopped are left out too (``hold_stopping=False``, the
        view the cycle decides on): they are leaving, and showing them as running
        would make the policy preempt a second victim for the same waiting job
        during the grace period. With ``hold_stopping=True`` they are shown as
        running in a project the snapshot does not list, which the engine treats
        as capacity held by no project: it places around them and never pauses
        them. The cycle asks for that view only to re-place a start that landed
        on a GPU a stopping job still holds.
        """
        projects = tuple(
            Project(p.name, p.build_quota_milli, p.train_guarantee_milli, p.train_limit_milli, p.weight)
            for p in self._projects().values()
        )
        workloads: list[Workload] = []
        for r in live:
            if r.state == "paused" and r.user_paused:
                continue
            if r.stop_intent is None:
                workloads.append(self._workload(r))
            elif hold_stopping:
                w = self._workload(r)
                if w.assignment is not None:
                    workloads.append(dataclasses.replace(w, project=STOPPING_PROJECT))
        return Snapshot(self._nodes, projects, tuple(workloads), time.time(), self._policy_config())

    def _cycle(self) -> None:
        """One scheduling cycle: snapshot -> policy -> preempt, start, reject, wait."""
        if not self._started or self._closing:
            return
        if self._cycle_handle is not None:  # this cycle covers whatever asked for that one
            self._cycle_handle.cancel()
            self._cycle_handle = None
        t0 = time.perf_counter()
        self._last_cycle = time.monotonic()
        live = self._live_jobs()
        by_id = {r.id: r for r in live}
        decisions = self._schedule(self._snapshot(live))
        for p in decisions.preempts:
            rec = by_id.get(p.workload_id)
            if rec is None or rec.state != "running" or rec.stop_intent is not None:
                continue
            if rec.kind != "train":
                log.warning("policy asked to preempt build job %s; build shares are never paused", rec.id)
                continue
            self._metrics.pauses.labels("preempt").inc()
            self._begin_stop(rec, "preempt", p.reason)
        running = [r for r in live if r.state == "running"]
        used = self._allocations(running)
        around_stopping: dict[str, Start] | None = None  # the policy's starts with stopping jobs' GPUs held
        for s in decisions.starts:
            rec = by_id.get(s.workload_id)
            if rec is None or rec.state not in ("queued", "paused") or (rec.state == "paused" and rec.user_paused):
                continue
            problem = self._check_fits(s, used)
            if problem == WAIT_FOR_STOPPING:
                # Placed on a GPU a stopping job still holds: ask the policy (once per cycle) where it
                # would go with those GPUs taken; other free GPUs may fit it now.
                if around_stopping is None:
                    held = self._schedule(self._snapshot(live, hold_stopping=True))
                    around_stopping = {x.workload_id: x for x in held.starts}
                alt = around_stopping.get(rec.id)
                if alt is not None and self._check_fits(alt, used) is None:
                    s, problem = alt, None
            if problem:
                self._set_reason(rec, problem)
                continue
            for gid, m in s.assignment.gpus:
                used[gid] = used.get(gid, 0) + m
            self._start(rec, s)
        with self._store.transaction():
            for rj in decisions.rejects:
                rec = by_id.get(rj.workload_id)
                if rec is not None and rec.state in ("queued", "paused"):
                    self._finish(rec, "rejected", rj.reason)
            for w in decisions.waits:
                rec = by_id.get(w.workload_id)
                if rec is not None and rec.state in ("queued", "paused") and not rec.user_paused:
                    self._set_reason(rec, w.reason)
            over = set(decisions.preemptible)
            for rec in running:
                if rec.kind == "train" and rec.stop_intent is None and rec.preemptible != (rec.id in over):
                    self._update(rec.id, preemptible=rec.id in over)
        self._last_cycle_s = time.perf_counter() - t0
        self._metrics.cycle.observe(self._last_cycle_s)
        self._update_gauges()

    def _request_cycle(self, urgent: bool = False) -> None:
        """Run a cycle now (``urgent``), else soon: one deferred cycle covers every request made before it.

        Train submits and process exits only ask for a cycle; it runs on a later
        loop iteration, so a burst of requests (everything that reached the loop
        meanwhile) shares one policy run whatever the queue length. Cycles run at
        most once every max(``cycle_min_interval_s``, 2 x the last cycle), so the
        loop keeps at least half of its time for requests.
        """
        if urgent:
            self._cycle()
            return
        if self._cycle_handle is not None:
            return
        # At most one cycle per max(cycle_min_interval_s, 2 x the last cycle): a quiet service
        # decides at once, a busy one spends at most about half of the loop on cycles.
        interval = max(self.config.cycle_min_interval_s, 2 * self._last_cycle_s)
        wait = interval - (time.monotonic() - self._last_cycle)
        loop = asyncio.get_running_loop()
        self._cycle_handle = (loop.call_later(wait, self._deferred_cycle) if wait > 0
                              else loop.call_soon(self._deferred_cycle))

    @property
    def cycle_pending(self) -> bool:
        """Whether a deferred cycle is scheduled and has not run yet."""
        return self._cycle_handle is not None

    def _deferred_cycle(self) -> None:
        self._cycle_handle = None
        try:
            self._cycle()
        except Exception:
            log.exception("deferred scheduling cycle failed")
            self._reload_live()  # a rolled-back transaction may have left the mirror ahead of the store

    def _check_fits(self, s: Start, used: dict[str, int]) -> str | None:
        """Our own guard against double-booking, whatever the policy says."""
        for gid, m in s.assignment.gpus:
            if gid not in self._gpus:
                return f"policy placed it on unknown GPU {gid}"
            if m <= 0 or used.get(gid, 0) + m > MILLI:
                return WAIT_FOR_STOPPING
        return None

    def _set_reason(self, rec: JobRecord, reason: str) -> None:
        if rec.reason != reason:
            self._update(rec.id, reason=reason)
            rec.reason = reason

    def _mps(self) -> bool:
        """Whether to add MPS limits: the config, else a detection cached for a minute (it scans /proc)."""
        if self.config.mps is not None:
            return self.config.mps
        now = time.monotonic()
        if self._mps_checked is None or now - self._mps_checked[0] > 60:
            self._mps_checked = (now, mps_running())
        return self._mps_checked[1]

    def _assignment_wire(self, rec: JobRecord, s: Start) -> dict[str, Any]:
        gpus = []
        want_mem = rec.request.get("gpu_memory")
        for gid, m in s.assignment.gpus:
            g = self._gpus[gid]
            limit = min(int(want_mem), g.memory) if want_mem and m < MILLI else g.memory * m // MILLI
            gpus.append({"id": gid, "index": g.index, "model": g.model, "milli": m, "memory_limit": limit})
        return {"node": s.assignment.node, "gpus": gpus}

    def _start(self, rec: JobRecord, s: Start) -> None:
        """Record "starting attempt N" durably, then act (spawn, or grant the lease)."""
        attempt = rec.attempts + 1
        now = time.time()
        assignment = self._assignment_wire(rec, s)
        shares = [(g["id"], g["milli"], g["memory_limit"]) for g in assignment["gpus"]]
        gpu_env = gpu_environment(rec.id, rec.project, shares, attempt, attempt > 1, self.simulated,
                                  mps=self._mps(),
                                  pythonpath=rec.job_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")))
        fields: dict[str, Any] = dict(
            state="running", attempts=attempt, assignment=assignment, started_at=now, preemptible=s.preemptible,
            pid=None, pid_start=None, stop_intent=None, exit_code=None,
        )
        if rec.kind == "build":
            fields.update(env=gpu_env, reason=s.reason, lease_expires_at=now + self.config.lease_s)
            self._transition(rec.id, **fields)
            return
        # "running" is committed, with its event, before the process exists: a service killed
        # before the spawn finds the launch ticket unclaimed at restart and requeues the job.
        self._transition(rec.id, reason=(f"resumed (attempt {attempt}): " if attempt > 1 else "") + s.reason,
                         **fields)
        try:
            run_as = job_account(rec.user, self.config.run_jobs_as, self.config.allow_root_jobs)
            env = job_environment(dict(os.environ), run_as)
            env.update(rec.job_env)
            env.update(gpu_env)
            handle = self.executor.spawn(rec.id, attempt, rec.command or [], rec.workdir, env, run_as)
        except Exception as e:  # cannot spawn: a clear, final failure rather than a retry loop
            self._finish(rec, "failed", f"could not start: {e}")
            return
        self._procs[rec.id] = handle
        self._update(rec.id, pid=handle.pid, pid_start=handle.start_time)

    # ================================================================ stopping and finishing
    def _begin_stop(self, rec: JobRecord, intent: str, reason: str) -> None:
        """Record the intent, then ask the job's process to stop (SIGKILL after the grace) in the background.

        A command that has already ended is settled from its own exit status
        instead: the stop comes too late, and a finished job never runs again.
        """
        handle = self._procs.get(rec.id)
        if handle is not None and not self.executor.alive(handle):
            self._settle_ended(rec.id, handle)
            return
        self._transition(rec.id, stop_intent=intent, reason=reason)
        if handle is None:
            fresh = self._job(rec.id)
            if fresh is not None:
                self._finish_attempt(fresh, None)
            return
        self._spawn_stop(rec.id, handle)

    def _spawn_stop(self, job_id: str, handle: ProcessHandle) -> None:
        """Stop this attempt's process group in the background (once per attempt)."""
        key = (job_id, handle.attempt)
        if key in self._stop_tasks:
            return
        task = asyncio.get_running_loop().create_task(self.executor.stop(handle, self.config.pause_grace_s))
        self._stop_tasks[key] = task
        task.add_done_callback(lambda _t: self._stop_tasks.pop(key, None))

    def _check_processes(self) -> None:
        """Monitor: settle every attempt whose wrapper has ended."""
        ended = [(jid, h) for jid, h in list(self._procs.items()) if not self.executor.alive(h)]
        for jid, h in ended:
            self._settle_ended(jid, h)
        if ended and not self._closing:
            self._request_cycle()

    def _settle_ended(self, job_id: str, handle: ProcessHandle) -> None:
        """An attempt's wrapper has ended: forget its process and record how the attempt ended."""
        self._procs.pop(job_id, None)
        self.executor.reap_group(handle)
        rec = self._job(job_id)
        if rec is None or rec.state != "running" or rec.attempts != handle.attempt:
            return
        self._finish_attempt(rec, self.executor.exit_code(job_id, handle.attempt))

    def _finish_attempt(self, rec: JobRecord, code: int | None, lost: bool = False) -> None:
        """An attempt's process is gone: decide the job's next state from the stop intent and the exit code.

        A command that ended on its own before the stop reached it (its wrapper
        says so) has finished: its exit status wins over the intent.
        """
        intent = rec.stop_intent
        if intent is not None and code is not None and self.executor.ended_on_its_own(rec.id, rec.attempts):
            intent = None
        self._watchdog.forget(rec.id)
        if intent in PAUSE_INTENTS:
            reason = rec.reason or PAUSE_INTENTS[intent]
            self._transition(rec.id, state="paused", paused_at=time.time(), assignment=None, pid=None,
                             pid_start=None, stop_intent=None, exit_code=code, reason=reason,
                             user_paused=(intent == "pause"), preemptible=False)
            if intent != "preempt":
                self._metrics.pauses.labels(intent).inc()
        elif intent == "cancel":
            self._finish(rec, "cancelled", rec.reason or "cancelled", exit_code=code)
        elif intent == "watchdog":
            self._finish(rec, "failed", rec.reason, exit_code=code)
        elif lost:
            self._transition(rec.id, state="paused", paused_at=time.time(), assignment=None, pid=None,
                             pid_start=None, stop_intent=None, user_paused=False, preemptible=False,
                             reason="process lost during restart; requeued")
        elif code is None:
            self._finish(rec, "failed", "the process ended without an exit status (killed from outside?)")
        elif code == 0:
            self._finish(rec, "succeeded", "exited with code 0", exit_code=0)
        else:
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self._finish(rec, "failed", how, exit_code=code)
        ev = self._settled.pop(rec.id, None)
        if ev is not None:
            ev.set()

    def _finish(self, rec: JobRecord, state: str, reason: str, exit_code: int | None = None) -> None:
        self._transition(rec.id, state=state, reason=reason, finished_at=time.time(), exit_code=exit_code,
                         assignment=None, pid=None, pid_start=None, stop_intent=None, env={},
                         lease_expires_at=None)
        self._metrics.finished.labels(state).inc()
        ev = self._settled.pop(rec.id, None)
        if ev is not None:
            ev.set()

    async def _await_grant(self, job_id: str) -> None:
        """A build share waiting only for preempted jobs to stop: give them ``reply_wait_s`` to do so.

        A kernel asking for its share then gets it in the submit reply in the
        common case (victims that checkpoint promptly), not one poll later.
        """
        deadline = time.monotonic() + self.config.reply_wait_s
        while time.monotonic() < deadline:
            rec = self._job(job_id)
            if rec is None or rec.state != "queued":
                return
            # Shares are released when a stopping job's exit is recorded (its stop_intent cleared).
            if not any(r.stop_intent is not None for r in self._live.values()):
                return
            await asyncio.sleep(0.02)

    async def _await_settled(self, job_id: str) -> None:
        rec = self._job(job_id)
        if rec is None or rec.state != "running" or rec.stop_intent is None:
            return
        ev = self._settled.setdefault(job_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), self.config.reply_wait_s)
        except asyncio.TimeoutError:
            pass

    # ================================================================ recovery
    def _recover(self) -> None:
        """Make the store true again after a restart (crash or not): adopt, finish or requeue each running job."""
        for rec in self._live_jobs(("running",)):
            if any(g["id"] not in self._gpus for g in assigned_gpus(rec)):
                missing = "its GPU is no longer in the pool"
            else:
                missing = ""
            if rec.kind == "build":
                if missing:
                    self._finish(rec, "cancelled", missing)
                continue
            attempt = rec.attempts
            handle: ProcessHandle | None = None
            code: int | None = None
            if rec.pid:
                handle = self.executor.adopt(rec.id, attempt, rec.pid, rec.pid_start or 0)
                outcome = "running" if handle else "gone"
            else:
                u = self.executor.recover_unrecorded(rec.id, attempt)
                outcome, handle, code = u.outcome, u.handle, u.exit_code
                if outcome == "not-started":
                    self._transition(rec.id, state="queued" if attempt <= 1 else "paused", attempts=attempt - 1,
                                     assignment=None, started_at=None, stop_intent=None,
                                     reason="start interrupted by a service restart; requeued")
                    continue
                if outcome == "lost":
                    outcome = "gone"
            if outcome == "running" and handle is not None:
                self._procs[rec.id] = handle
                if not rec.pid:
                    self._update(rec.id, pid=handle.pid, pid_start=handle.start_time)
                log.info("re-adopted job %s (pid %d)", rec.id, handle.pid)
                if rec.stop_intent is not None:
                    self._spawn_stop(rec.id, handle)
                elif missing:
                    self._begin_stop(rec, "preempt", missing)
                continue
            if code is None:
                code = self.executor.exit_code(rec.id, attempt)
            fresh = self._job(rec.id)
            assert fresh is not None
            if code is None and fresh.stop_intent is None:
                self._finish_attempt(fresh, None, lost=True)
            else:
                self._finish_attempt(fresh, code)

    # ================================================================ periodic work
    def _tick(self) -> None:
        now = time.time()
        # (a scan, not _live_jobs: that sorts every live job, and ticks come every few seconds)
        expired = [r for r in self._live.values()
                   if r.kind == "build" and r.state in ("queued", "running")
                   and r.lease_expires_at is not None and r.lease_expires_at < now]
        for rec in sorted(expired, key=lambda r: r.num):
            self._finish(rec, "cancelled", "lease expired (not renewed)")
        if not self.simulated and now - self._sample_t >= min(self.config.tick_s, self.config.history_interval_s):
            self._refresh_sample()
            self._run_watchdog(now)
        if now - self._last_history >= self.config.history_interval_s:
            self._record_history(now)
        self._trim_events()
        self._cycle()

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
            self._sample = self._inventory.sample()
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

    def _update_gauges(self) -> None:
        self._metrics.update(self._live.values(), self._gpus)  # order-free: no sorted copy of the live jobs

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

    # ================================================================ reads
    def _job_or_404(self, job_id: Any) -> JobRecord:
        if not isinstance(job_id, str):
            raise NotFound(f"no job {job_id!r}")
        rec = self._job(job_id)
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        return rec

    def _owned(self, actor: Actor, job_id: str, action: str) -> JobRecord:
        rec = self._job_or_404(job_id)
        if not (actor.admin or actor.user == rec.user):
            raise Forbidden(f"only {rec.user} (the owner) or an admin may {action} job {rec.id}")
        return rec

    def _wire(self, actor: Actor, rec: JobRecord) -> dict[str, Any]:
        return job_to_wire(rec, show_env=actor.admin or actor.user == rec.user)

    def get_job(self, actor: Actor, job_id: str) -> dict[str, Any]:
        return self._wire(actor, self._job_or_404(job_id))

    def list_jobs(self, actor: Actor, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Jobs newest first; filters: project, user, state ("a,b" or a list), kind, limit."""
        q = job_filters(filters, self.config.max_list)
        recs = self._store.jobs(q["states"], project=q["project"], user=q["user"], kind=q["kind"],
                                limit=q["limit"], newest_first=True)
        return [self._wire(actor, r) for r in recs]

    def read_log(self, actor: Actor, job_id: str, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """A chunk of the job's log from byte ``offset``; ``eof`` once the job is final and all is read."""
        rec = self._owned(actor, job_id, "read the log of")
        data, nxt, size = read_log_chunk(self.executor.log_path(rec.id), offset, limit)
        # A build job has no process, so no log will ever come: eof at once.
        eof = nxt >= size and (not rec.live or rec.kind == "build")
        return {"data": data, "offset": nxt, "eof": eof}

    def _project_usage(self) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        usage: dict[str, dict[str, int]] = {}
        pending: dict[str, int] = {}
        for rec in self._live_jobs():
            if rec.state == "running":
                u = usage.setdefault(rec.project, {})
                u[rec.kind] = u.get(rec.kind, 0) + held_milli(rec)
            else:
                pending[rec.project] = pending.get(rec.project, 0) + 1
        return usage, pending

    def list_projects(self, actor: Actor | None = None) -> list[dict[str, Any]]:
        """Every project with its usage; with ``actor``, ``member`` says whether they may submit into it."""
        usage, pending = self._project_usage()
        out = []
        for p in self._projects().values():
            u = dict(usage.get(p.name, {}))
            u["train_over_quota"] = max(0, u.get("train", 0) - p.train_guarantee_milli)
            wire = project_to_wire(p, u, pending.get(p.name, 0))
            if actor is not None:
                wire["member"] = self._may_use(actor, p)
            out.append(wire)
        return out

    @staticmethod
    def _may_use(actor: Actor, project: ProjectRecord) -> bool:
        return actor.admin or is_member(project.members, actor.user, actor.groups)

    def pool(self) -> dict[str, Any]:
        if not self.simulated and time.time() - self._sample_t > 2:
            self._refresh_sample()
        return pool_view(self._nodes, self._gpus, self._live_jobs(("running",)), self._sample,
                         self._limits().memory, self.simulated)  # read once, not /proc/meminfo per call

    def status(self, actor: Actor | None = None) -> dict[str, Any]:
        counts = {"pending": 0, "running": 0, "paused": 0}
        for rec in self._live_jobs():
            counts["pending" if rec.state == "queued" else rec.state] += 1
        return {"simulated": self.simulated, "pool": self.pool(), "projects": self.list_projects(actor),
                "queue": counts}

    def history(self, since: float | None = None) -> dict[str, Any]:
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
            raise InvalidRequest("since must be a time in Unix seconds")
        return {"samples": self._store.history_since(None if since is None else float(since))}

    # ================================================================ projects
    def set_project(self, actor: Actor, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Create or change a project (admin only); quotas in GPUs."""
        self._check_open()
        if not actor.admin:
            raise Forbidden("only an admin may change projects")
        members = fields.get("members", ...) if isinstance(fields, dict) else ...
        if members is not ...:
            fields = {k: v for k, v in fields.items() if k != "members"}
        changes = validate_project(name, fields, len(self._gpus))
        if members is not ...:
            changes["members"] = validate_members(members, validate_user)
        cur = self._store.project(name) or ProjectRecord(name=name, created_at=time.time())
        for k, v in changes.items():
            setattr(cur, k, v)
        self._project_cache = None
        self._store.upsert_project(cur)
        self._emit("project", project=name, reason=f"project {name} set by {actor.user}")
        self._cycle()
        return next(p for p in self.list_projects() if p["name"] == name)

    def delete_project(self, actor: Actor, name: str) -> None:
        self._check_open()
        if not actor.admin:
            raise Forbidden("only an admin may delete projects")
        if not isinstance(name, str) or self._store.project(name) is None:
            raise NotFound(f"no project {name!r}")
        live = self._store.count_live_jobs(name)
        if live:
            raise Conflict(f"project {name!r} still has {live} live job(s); cancel them first")
        self._project_cache = None
        self._store.delete_project(name)
        self._emit("project", project=name, reason=f"project {name} deleted by {actor.user}")

    # ================================================================ jobs
    def _estimate_milli(self, request: dict[str, Any]) -> int:
        if request.get("gpus"):
            return int(request["gpus"]) * MILLI
        if request.get("gpu_fraction"):
            return int(round(request["gpu_fraction"] * MILLI))
        if request.get("gpu_memory"):
            mems = [g.memory for g in self._gpus.values() if not request.get("gpu_model") or g.model == request["gpu_model"]]
            biggest = max(mems, default=1)
            return min(MILLI, -(-int(request["gpu_memory"]) * MILLI // biggest))
        return 0

    def _check_build_quota(self, project: ProjectRecord, request: dict[str, Any]) -> None:
        holders = build_holders(self._live_jobs(("queued", "running"), kind="build", project=project.name),
                                held_milli, self._estimate_milli)
        check_build_quota(project, self._estimate_milli(request), holders)

    async def submit(self, actor: Actor, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Validate, store as queued, decide; ``(job, created)`` (created False for a client_key match).

        A build job is decided in the call (the reply says running, or why it waits);
        a train job is returned queued and decided by the cycle that runs next.
        """
        self._check_open()
        projects = self._projects()
        names = set(projects)
        js = validate_spec(spec, names, self._limits())
        if js.client_key is not None:
            existing = self._store.live_job_by_key(actor.user, js.client_key)
            if existing is not None:
                return self._wire(actor, existing), False
        project = projects[js.project]
        if not self._may_use(actor, project):
            raise Forbidden(f"{actor.user} is not a member of project {project.name!r}; "
                            "an admin can add you (gpupool projects set NAME --members ...)")
        request = js.request()
        if js.kind == "build":
            self._check_build_quota(project, request)
        else:
            job_account(actor.user, self.config.run_jobs_as, self.config.allow_root_jobs)  # refused now, not at start
        now = time.time()
        with self._store.transaction():
            num = self._store.next_job_number()
            job_id = f"j-{num:06d}"
            rec = JobRecord(
                id=job_id, num=num, name=js.name, project=js.project, user=actor.user, kind=js.kind, state="queued",
                request=request, priority=js.priority, submitted_at=now, reason="queued",
                workdir=js.workdir or (str(self.executor.default_workdir(job_id)) if js.kind == "train" else ""),
                command=js.command, job_env=js.env, labels=js.labels, client_key=js.client_key,
                lease_expires_at=now + self.config.lease_s if js.kind == "build" else None,
            )
            self._store.insert_job(rec)
            self._live[job_id] = rec
            self._emit_job(job_id)  # same transaction: one disk sync per submit
        self._metrics.submitted.labels(js.kind).inc()
        # A kernel waits on its build share: decide now. A train submit returns at once
        # (queued) and the next loop iteration's cycle decides every train job submitted
        # meanwhile, so a burst runs the policy once, not once per job.
        self._request_cycle(urgent=js.kind == "build")
        if js.kind == "build":
            await self._await_grant(job_id)
        fresh = self._job(job_id)
        assert fresh is not None
        return self._wire(actor, fresh), True

    async def pause(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Pause (sticky: not resumed until the user resumes): SIGTERM, grace, SIGKILL; keeps the workdir."""
        self._check_open()
        rec = self._owned(actor, job_id, "pause")
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; only live jobs can be paused")
        if rec.kind == "build":
            raise Conflict(f"job {rec.id} is a build share; cancel it to release the GPU")
        reason = f"paused by {actor.user}"
        if rec.state in ("queued", "paused"):
            self._transition(rec.id, state="paused", user_paused=True, reason=reason,
                             paused_at=rec.paused_at or time.time())
        elif rec.stop_intent in ("preempt", "shutdown"):
            self._update(rec.id, stop_intent="pause", reason=reason)
        elif rec.stop_intent is None:
            self._metrics.pauses.labels("user").inc()
            self._begin_stop(rec, "pause", reason)
        await self._await_settled(rec.id)
        return self.get_job(actor, rec.id)

    async def resume(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Put a paused job back in the queue (it restarts in its workdir with GPUPOOL_RESUME=1)."""
        self._check_open()
        rec = self._owned(actor, job_id, "resume")
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; only paused jobs can be resumed")
        if rec.state == "paused":
            self._transition(rec.id, user_paused=False, reason=f"resumed by {actor.user}; waiting for GPUs")
            self._cycle()
        elif rec.state == "running" and rec.stop_intent == "pause":
            self._update(rec.id, stop_intent="preempt")  # still stopping; requeued, not sticky
        return self.get_job(actor, rec.id)

    async def cancel(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Stop for good; a build job releases its share at once."""
        self._check_open()
        rec = self._owned(actor, job_id, "cancel")
        if not rec.live:
            raise Conflict(f"job {rec.id} is already {rec.state}")
        reason = f"cancelled by {actor.user}"
        if rec.state != "running" or rec.kind == "build":
            self._finish(rec, "cancelled", reason)
            self._request_cycle()  # what it frees is handed out by the next cycle (mass cancels share it)
        elif rec.stop_intent is None:
            self._begin_stop(rec, "cancel", reason)
        else:
            self._update(rec.id, stop_intent="cancel", reason=reason)
        await self._await_settled(rec.id)
        return self.get_job(actor, rec.id)

    def renew(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Extend a build job's lease by ``lease_s`` from now."""
        self._check_open()
        rec = self._owned(actor, job_id, "renew")
        if rec.kind != "build":
            raise Conflict(f"job {rec.id} is a train job; only build jobs hold leases")
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; its lease cannot be renewed")
        self._update(rec.id, lease_expires_at=time.time() + self.config.lease_s)
        return self.get_job(actor, rec.id)

    # ================================================================ tokens
    def create_token(self, actor: Actor, user: str) -> dict[str, Any]:
        if not actor.admin:
            raise Forbidden("only an admin may create tokens")
        user = validate_user(user)
        if user == self.config.admin_user:
            # Ownership is by user name: a plain token named like the admin would own the admin's jobs.
            raise InvalidRequest(f"{user!r} is the admin's name; choose another user name")
        return {"user": user, "token": self.tokens.create(user)}

    def authenticate(self, token: str | None) -> Actor | None:
        found = self.tokens.lookup(token)
        if found is None:
            return None
        return Actor(found[0], found[1], unix_groups(found[0]))


__all__ = ["Actor", "SchedulerCore", "ServiceConfig"]
