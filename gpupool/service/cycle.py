"""The scheduling cycle of the service core: snapshot -> policy -> preempt, start, reject, wait.

:class:`CycleRunner` is one of the core's parts (gpupool.service.core builds
them): it turns the live jobs into the policy's snapshot, runs the policy (the
first-fit fallback when the engine raises), and applies its decisions through
the attempts, never handing out a GPU share that is still held. When cycles
run, and why they are deferred and coalesced, is in :meth:`CycleRunner.request`.
Other schedulers' work on the pool's nodes (a backend that ``HoldsOutsideWork``)
is in the snapshot as running work of no project and in the double-booking guard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from gpupool.policy import PolicyCache, schedule
from gpupool.policy.model import MILLI, Decisions, Project, Snapshot, Start, Workload
from gpupool.service import fallback_policy
from gpupool.service.attempts import Attempts
from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.config import ServiceConfig
from gpupool.service.jobs import assigned_gpus, flag_reason, held_milli, job_reason, split_workload_id
from gpupool.service.metrics import Metrics
from gpupool.service.pool_state import PoolState
from gpupool.service.store import JobRecord

log = logging.getLogger("gpupool.service")

PolicyFn = Callable[[Snapshot], Decisions]
WAIT_FOR_STOPPING = "waiting for stopping jobs to release their GPUs"
STOPPING_PROJECT = "\x00stopping"
"""Pseudo-project of stopping jobs in the held view: not a valid project name, so never a real one."""


def _by_job(starts: tuple[Start, ...] | list[Start]) -> dict[str, list[tuple[int, Start]]]:
    """The policy's starts per job, in the order of each job's first start; a gang's as (rank, start) in
    rank order, a plain job's as one (0, start)."""
    out: dict[str, list[tuple[int, Start]]] = {}
    for s in starts:
        job_id, rank = split_workload_id(s.workload_id)
        out.setdefault(job_id, []).append((rank or 0, s))
    for v in out.values():
        if len(v) > 1:
            v.sort(key=lambda x: x[0])
    return out


def _gang_job(workload_id: str, by_id: dict[str, JobRecord], decided: set[str]) -> JobRecord | None:
    """The gang job a replica's decision is about; None once its first replica's decision was taken.

    A gang's replicas share one decision and one reason, so the job takes the
    first and the rest cost a split and a set lookup.
    """
    job_id = split_workload_id(workload_id)[0]
    if job_id in decided:
        return None
    decided.add(job_id)
    return by_id.get(job_id)


class CycleRunner:
    """Scheduling cycles of the core: when they run, what the policy sees, and carrying out its decisions."""

    def __init__(self, config: ServiceConfig, book: JobBook, pool: PoolState, attempts: Attempts, metrics: Metrics,
                 life: Lifecycle, policy: PolicyFn | None = None) -> None:
        self.config = config
        self.book = book
        self.pool = pool
        self.attempts = attempts
        self.metrics = metrics
        self.life = life
        self.policy_override = policy
        self.policy_cache = PolicyCache()  # the policy's carries from cycle to cycle: this core's alone
        self._handle: asyncio.Handle | None = None  # a deferred cycle waiting to run
        self._last_cycle = 0.0
        self._last_cycle_s = 0.0

    # ================================================================ scheduling cycle
    def decide(self, snapshot: Snapshot) -> Decisions:
        """The policy's decisions on ``snapshot``; the first-fit fallback's for a cycle where the policy raises."""
        fn: PolicyFn = self.policy_override or schedule
        try:
            if fn is schedule:  # the engine starts from what its last cycle here left (gpupool/policy/cache.py)
                return schedule(snapshot, self.policy_cache)
            return fn(snapshot)
        except Exception:
            if fn is fallback_policy.schedule:
                raise
            log.exception("policy engine failed; using the first-fit fallback for this cycle")
            return fallback_policy.schedule(snapshot)

    def snapshot(self, live: list[JobRecord] | None, hold_stopping: bool = False) -> Snapshot:
        """:meth:`_jobs_snapshot`, with other schedulers' work as running work of no project (placed around,
        never paused)."""
        snap = self._jobs_snapshot(live, hold_stopping)
        outside = self.pool.outside
        if outside is None or not outside.holdings:
            return snap
        return dataclasses.replace(snap, workloads=snap.workloads + outside.workloads())

    def allocations(self, running: list[JobRecord] | None = None) -> dict[str, int]:
        """Milli-GPU held per GPU by ``running`` (None: every running job, from the view, kept per job), and by
        other schedulers' work (a whole GPU each)."""
        if running is None:
            used = self.book.view.used(self.book.live, self.book.shown)
        else:
            used = {}
            for rec in running:
                for g in assigned_gpus(rec):
                    used[g["id"]] = used.get(g["id"], 0) + int(g["milli"])
        for _holder, gpu_ids in self.pool.outside_holdings():
            for gid in gpu_ids:
                used[gid] = used.get(gid, 0) + MILLI
        return used

    def _jobs_snapshot(self, live: list[JobRecord] | None, hold_stopping: bool = False) -> Snapshot:
        """The policy's input: ``live`` (None: every live job, from the core's per-job view). User-paused
        jobs (sticky) are left out.

        Jobs already being stopped are left out too (``hold_stopping=False``, the
        view the cycle decides on): they are leaving, and showing them as running
        would make the policy preempt a second victim for the same waiting job
        during the grace period. With ``hold_stopping=True`` they are shown as
        running in a project the snapshot does not list, which the engine treats
        as capacity held by no project: it places around them and never pauses
        them. The cycle asks for that view only to re-place a start that landed
        on a GPU a stopping job still holds.
        """
        now = time.time()
        recent = self.book.usage.average_milli(now, "train")  # {} when no history is kept (half-life 0)
        projects = tuple(
            Project(p.name, p.build_quota_milli, p.train_guarantee_milli, p.train_limit_milli, p.weight,
                    recent.get(p.name, 0.0))
            for p in self.book.projects().values()
        )
        if live is None and not hold_stopping:
            # kept per job between cycles: only the jobs written since the last cycle are rebuilt
            return Snapshot(self.pool.nodes, projects, self.book.view.workloads(self.book.live, self.book.shown), now,
                            self.pool.policy_config())
        if live is None:
            live = self.book.live_jobs()
        workloads: list[Workload] = []
        for r in live:
            shown = self.book.shown(r)  # the one rule of who the policy sees (the view's too)
            if shown or not hold_stopping or r.stop_intent is None:
                workloads.extend(shown)
            else:  # a stopping job, shown as capacity held by no project (a paused one holds none)
                workloads.extend(dataclasses.replace(w, project=STOPPING_PROJECT)
                                 for w in self.book.workloads_of(r) if w.assignment is not None)
        return Snapshot(self.pool.nodes, projects, tuple(workloads), now, self.pool.policy_config())

    def run(self) -> None:
        """One scheduling cycle: snapshot -> policy -> preempt, start, reject, wait."""
        if not self.life.started or self.life.closing:
            return
        if self._handle is not None:  # this cycle covers whatever asked for that one
            self._handle.cancel()
            self._handle = None
        t0 = time.perf_counter()
        self._last_cycle = time.monotonic()
        by_id = dict(self.book.live)  # the live jobs as this cycle began (a job that ends during it stays here)
        if self.book.holding:
            self.book.release_holds()
        decisions = self.decide(self.snapshot(None))
        stopped: set[str] = set()
        for p in decisions.preempts:
            job_id = split_workload_id(p.workload_id)[0]
            rec = by_id.get(job_id)
            if rec is None or job_id in stopped or rec.state != "running" or rec.stop_intent is not None:
                continue
            stopped.add(job_id)  # a gang is paused whole: its first replica's preempt stops the job
            if rec.kind != "train":
                log.warning("policy asked to preempt build job %s; build shares are never paused", rec.id)
                continue
            self.metrics.pauses.labels("preempt").inc()
            self.attempts.begin_stop(rec, "preempt", job_reason(rec, p.reason))
        running = [r for r in by_id.values() if r.state == "running"]
        used = self.allocations(None)  # every running job's shares, the same sums as over `running`
        around_stopping: dict[str, Start] | None = None  # the policy's starts with stopping jobs' GPUs held
        for job_id, starts in _by_job(decisions.starts).items():
            rec = by_id.get(job_id)
            if rec is None or rec.state not in ("queued", "paused") or (rec.state == "paused" and rec.user_paused):
                continue
            if len(starts) != rec.replicas or (rec.replicas > 1 and {k for k, _ in starts} != set(range(rec.replicas))):
                # never expected (the policy starts a gang whole or not at all): start nothing rather than part
                self.set_reason(rec, f"waiting: the policy placed {len(starts)} of its {rec.replicas} replicas; "
                                      "all replicas start together or none")
                continue
            placed = [x for _, x in starts]
            problem = self.check_all_fit(placed, used)
            if problem == WAIT_FOR_STOPPING:
                # Placed on a GPU a stopping job still holds: ask the policy (once per cycle) where it
                # would go with those GPUs taken; other free GPUs may fit it now.
                if around_stopping is None:
                    held = self.decide(self.snapshot(sorted(by_id.values(), key=lambda r: r.num),
                                                         hold_stopping=True))
                    around_stopping = {x.workload_id: x for x in held.starts}
                alt = [a for x in placed if (a := around_stopping.get(x.workload_id)) is not None]
                if len(alt) == len(placed) and self.check_all_fit(alt, used) is None:
                    placed, problem = alt, None
            if problem:
                self.set_reason(rec, problem)
                continue
            for x in placed:
                for gid, m in x.assignment.gpus:
                    used[gid] = used.get(gid, 0) + m
            self.attempts.start(rec, placed)
        decided: set[str] = set()  # gangs whose first replica's decision was taken
        with self.book.store.transaction():
            for rj in decisions.rejects:
                rec = by_id.get(rj.workload_id) or _gang_job(rj.workload_id, by_id, decided)
                if rec is not None and rec.state in ("queued", "paused"):
                    self.attempts.finish(rec, "rejected", job_reason(rec, rj.reason))
            for w in decisions.waits:
                reason = w.reason
                rec = by_id.get(w.workload_id)  # a plain job's workload has the job's id: one lookup
                if rec is None:
                    rec = _gang_job(w.workload_id, by_id, decided)
                    if rec is None:
                        continue
                    reason = job_reason(rec, reason)
                if rec.state in ("queued", "paused") and not rec.user_paused:
                    self.set_reason(rec, reason)
            over = {split_workload_id(i)[0] for i in decisions.preemptible}
            project_milli: dict[str, int] = {}  # per project whose flags flip: what its training jobs hold now
            for rec in running:
                if rec.kind == "train" and rec.stop_intent is None and rec.preemptible != (rec.id in over):
                    self.flip_preemptible(rec, rec.id in over, project_milli)
        self._last_cycle_s = time.perf_counter() - t0
        self.metrics.cycle.observe(self._last_cycle_s)

    def flip_preemptible(self, rec: JobRecord, preemptible: bool, project_milli: dict[str, int]) -> None:
        """Set a running job's preemptible flag and say so in its reason (:func:`flag_reason`).

        ``project_milli`` caches, for this cycle, what each project's running
        training jobs hold (those being stopped left out): a flip is rare, but
        lowering a guarantee may flip thousands of jobs in one cycle.
        """
        held = project_milli.get(rec.project)
        if held is None:
            held = project_milli[rec.project] = sum(
                held_milli(r) for r in self.book.live.values()
                if r.project == rec.project and r.kind == "train" and r.state == "running" and r.stop_intent is None)
        project = self.book.projects().get(rec.project)
        guarantee = project.train_guarantee_milli if project is not None else 0
        self.book.update(rec.id, preemptible=preemptible, reason=flag_reason(rec, preemptible, guarantee, held))

    def request(self, urgent: bool = False) -> None:
        """Run a cycle now (``urgent``), else soon: one deferred cycle covers every request made before it.

        Train submits and process exits only ask for a cycle; it runs on a later
        loop iteration, so a burst of requests (everything that reached the loop
        meanwhile) shares one policy run whatever the queue length. Cycles run at
        most once every max(``cycle_min_interval_s``, 2 x the last cycle), so the
        loop keeps at least half of its time for requests.
        """
        if urgent:
            self.run()
            return
        if self._handle is not None:
            return
        # At most one cycle per max(cycle_min_interval_s, 2 x the last cycle): a quiet service
        # decides at once, a busy one spends at most about half of the loop on cycles.
        interval = max(self.config.cycle_min_interval_s, self._last_cycle_s / self.config.cycle_busy_share)
        wait = interval - (time.monotonic() - self._last_cycle)
        loop = asyncio.get_running_loop()
        self._handle = (loop.call_later(wait, self._deferred) if wait > 0
                        else loop.call_soon(self._deferred))

    def cancel_pending(self) -> None:
        """Drop a deferred cycle not run yet (the core is stopping)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @property
    def pending(self) -> bool:
        """Whether a deferred cycle is scheduled and has not run yet."""
        return self._handle is not None

    def _deferred(self) -> None:
        self._handle = None
        try:
            self.run()
        except Exception:
            log.exception("deferred scheduling cycle failed")
            self.book.reload()  # a rolled-back transaction may have left the mirror ahead of the store

    def check_all_fit(self, starts: list[Start], used: dict[str, int]) -> str | None:
        """:meth:`_check_fits` for every replica of a job (one for a plain job): the first problem, or None.

        A gang's replicas are checked against each other too (on a copy of
        ``used``: a few gang starts a cycle, so the copy is cheap next to the
        policy run that decided them).
        """
        if len(starts) == 1:
            return self.check_fits(starts[0], used)
        taken = dict(used)
        for s in starts:
            problem = self.check_fits(s, taken)
            if problem:
                return problem
            for gid, m in s.assignment.gpus:
                taken[gid] = taken.get(gid, 0) + m
        return None

    def check_fits(self, s: Start, used: dict[str, int]) -> str | None:
        """Our own guard against double-booking, whatever the policy says."""
        for gid, m in s.assignment.gpus:
            if gid not in self.pool.gpus:
                return f"policy placed it on unknown GPU {gid}"
            if m <= 0 or used.get(gid, 0) + m > MILLI:
                return WAIT_FOR_STOPPING
        return None

    def set_reason(self, rec: JobRecord, reason: str) -> None:
        if rec.reason != reason:
            self.book.update(rec.id, reason=reason)
            rec.reason = reason
