"""The event loop: arrivals, completions and scheduling cycles on a GPU cluster.

Time only moves from one event to the next: a job arrival, a job completion,
or a scheduling cycle. Cycles fall on multiples of ``cycle_s`` and are held only
while some job is pending (with nothing pending no policy can decide anything),
so a long drain of running jobs costs nothing. At each cycle the whole cluster
state goes to the policy as a :class:`~gpupool.policy.Snapshot`; its
preemptions are applied first, then its starts, and every decision is checked
against the cluster (a start on a busy GPU is a policy bug, reported as
:class:`InvalidDecision`, never silently absorbed).

Accounting that is easy to get wrong lives here on purpose, in one place:

* a paused job keeps only the work up to its last checkpoint; checkpoints are
  taken every ``checkpoint_interval_s`` of run time counted from each (re)start,
  and ``0`` means it checkpoints at the moment it is paused (nothing lost);
* GPU utilization counts busy GPU-seconds inside the measurement window,
  including work that is later thrown away (the GPU was busy all the same);
* a guarantee violation is time during which a project with pending demand
  holds fewer GPUs than ``min(guarantee, demand)``, counted beyond one cycle
  per episode (a job may always wait for the next cycle): :mod:`bench.sim.guarantees`.

Multi-node gangs (``SimConfig.gang_width`` > 0): a trace job wider than
``gang_width`` GPUs is one job here and several replica workloads in the
snapshot (:mod:`bench.sim.gangs`). The job is the unit of everything the
simulator does: its replicas start in one cycle or the start is a policy bug
(:class:`InvalidDecision`); a preempt of any replica pauses every replica,
with the job's progress kept up to its last checkpoint as for any pause; the
job completes when its duration has run with all replicas; a refusal
(``Reject``) of any replica means the job can never run under that policy,
which is recorded on the job (``JobRecord.never``) and reported, never
dropped.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

from bench.sim.daily import DailyLedger, daily_fairness
from bench.sim.gangs import replica_shape
from bench.sim.guarantees import GuaranteeBook
from bench.sim.records import (
    CallStats,
    InvalidDecision,
    JobRecord,
    ScheduleFn,
    SimConfig,
    SimResult,
    Stalled,
)
from bench.sim.trace import TraceJob
from gpupool.policy.model import (
    MILLI,
    Assignment,
    Kind,
    Node,
    Project,
    Request,
    Snapshot,
    Workload,
)
from gpupool.service.usage import DecayedUsage

INF = math.inf


class Simulator:
    """Replays ``jobs`` on ``nodes`` under one policy. Use once: ``Simulator(...).run()``."""

    def __init__(
        self,
        jobs: Iterable[TraceJob],
        nodes: tuple[Node, ...],
        projects: tuple[Project, ...],
        schedule: ScheduleFn,
        config: SimConfig | None = None,
    ) -> None:
        self.config = config or SimConfig()
        if self.config.cycle_s <= 0:
            raise ValueError("cycle_s must be positive")
        if self.config.checkpoint_interval_s < 0:
            raise ValueError("checkpoint_interval_s must be >= 0")
        if self.config.gang_width < 0:
            raise ValueError("gang_width must be >= 0")
        self.nodes = nodes
        self.projects = projects
        self.schedule = schedule
        self.jobs = sorted(jobs, key=lambda j: j.submit)
        self._records: dict[str, JobRecord] = {}  # job id -> its record
        self._job_of: dict[str, str] = {}  # replica workload id -> job id
        self._gpu_node: dict[str, str] = {}
        self._gpu_holder: dict[str, str | None] = {}
        for node in nodes:
            for gpu in node.gpus:
                if gpu.id in self._gpu_node:
                    raise ValueError(f"GPU id {gpu.id} appears twice in the cluster")
                self._gpu_node[gpu.id] = node.name
                self._gpu_holder[gpu.id] = None
        self._group = {node.name: node.group for node in nodes}
        widest = max((len(n.gpus) for n in nodes), default=0)
        known = {p.name for p in projects}
        for job in self.jobs:
            if job.team not in known:
                raise ValueError(f"job {job.id} belongs to {job.team}, which is not a project")
            if not self.config.gang_width and job.gpus > widest:
                raise ValueError(f"job {job.id} needs {job.gpus} GPUs; the widest node has {widest}")
        self._book = GuaranteeBook({p.name: p.train_guarantee_milli // MILLI for p in projects}, self.config.cycle_s)
        self._guards = self._book.guards
        self._live: dict[str, Workload] = {}  # replica workload id -> workload; insertion order = arrival order
        self._pending: set[str] = set()  # job ids
        self._running: set[str] = set()  # job ids
        self._requests: dict[int, Request] = {}
        self._heap: list[tuple[float, int, str, int]] = []  # (completion time, seq, job id, run number)
        self._seq = 0
        self._busy_window = 0.0
        self._lost_window = 0.0
        self.calls = CallStats()
        lo, _ = self._window()
        self._ledger = DailyLedger(lo if lo > -INF else (self.jobs[0].submit if self.jobs else 0.0))
        self._usage = DecayedUsage(self.config.usage_half_life_s)
        self._clock: float | None = None  # time up to which the ledger and the usage are counted

    # ------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cfg = self.config
        cycle = cfg.cycle_s
        n = len(self.jobs)
        i = 0
        now = self.jobs[0].submit if n else 0.0
        last_cycle_k = -math.inf
        dirty = True
        idle_cycles = 0
        while i < n or self._running or self._pending:
            t_arr = self.jobs[i].submit if i < n else INF
            t_fin = self._next_completion()
            t_cyc = INF
            if self._pending:
                k = max(last_cycle_k + 1, math.ceil(now / cycle))
                t_cyc = k * cycle
            t = min(t_arr, t_fin, t_cyc)
            now = t
            while self._heap and self._heap[0][0] <= t:
                _, _, job_id, token = heapq.heappop(self._heap)
                rec = self._records[job_id]
                if rec.runs == token and rec.run_start is not None:
                    self._complete(rec, t)
                    dirty = True
            while i < n and self.jobs[i].submit <= t:
                self._arrive(self.jobs[i])
                i += 1
                dirty = True
            if t_cyc <= t and self._pending:
                last_cycle_k = round(t / cycle)
                if dirty or not cfg.time_invariant_policy:
                    dirty = self._cycle(t)
                else:
                    self.calls.skipped_cycles += 1
                if not self._running and i >= n:
                    idle_cycles += 1
                    if idle_cycles >= cfg.stall_cycles and self._pending:
                        raise Stalled(
                            f"{len(self._pending)} jobs pending on an idle cluster for {idle_cycles} cycles "
                            "with no arrival left: the policy never starts them"
                        )
                else:
                    idle_cycles = 0
            self._book.check(t)
        self._book.check(now, closing=True)
        return self._result(now, time.perf_counter() - wall0)

    def _next_completion(self) -> float:
        heap = self._heap
        while heap:
            _, _, job_id, token = heap[0]
            rec = self._records[job_id]
            if rec.runs == token and rec.run_start is not None:
                return heap[0][0]
            heapq.heappop(heap)  # stale: the run it belonged to was paused
        return INF

    # ------------------------------------------------------------ events

    def _advance(self, t: float) -> None:
        """Count what each team held and wanted since the last event (call before anything changes)."""
        last = self._clock
        self._clock = t
        if last is None or t <= last:
            if last is None:
                self._usage.accrue(t, {})
            return
        ledger = self._ledger
        for team, guard in self._guards.items():
            ledger.add(ledger.wanted, team, last, t, guard.held + guard.pending_gpus)
            ledger.add(ledger.received, team, last, t, guard.held)
        if self._usage.half_life_s > 0:
            self._usage.accrue(t, {(team, "train"): guard.held * MILLI for team, guard in self._guards.items()})

    def _arrive(self, job: TraceJob) -> None:
        self._advance(job.submit)
        width = self.config.gang_width
        replicas, per = replica_shape(job.gpus, width) if width else (1, job.gpus)
        rec = JobRecord(job, replicas, per)
        self._records[job.id] = rec
        self._pending.add(job.id)
        self._guards[job.team].add_pending(job.gpus)
        for wid in rec.ids:
            self._job_of[wid] = job.id
            self._live[wid] = self._workload(rec, wid)

    def _complete(self, rec: JobRecord, t: float) -> None:
        self._advance(t)
        self._end_run(rec, t)
        rec.finish = t
        rec.assignments = {}
        rec.run_start = None
        self._running.discard(rec.trace.id)
        self._guards[rec.trace.team].held -= rec.trace.gpus
        for wid in rec.ids:
            del self._live[wid]

    def _cycle(self, t: float) -> bool:
        self._advance(t)
        projects = self.projects
        if self._usage.half_life_s > 0:
            recent = self._usage.average_milli(t, "train")
            projects = tuple(replace(p, recent_milli=recent.get(p.name, 0.0)) for p in projects)
        snapshot = Snapshot(
            nodes=self.nodes,
            projects=projects,
            workloads=tuple(self._live.values()),
            now=t,
            config=self.config.policy_config,
        )
        stats = self.calls
        stats.max_workloads = max(stats.max_workloads, len(snapshot.workloads))
        stats.max_pending = max(stats.max_pending, len(self._pending))
        t0 = time.perf_counter()
        decisions = self.schedule(snapshot)
        stats.seconds.append(time.perf_counter() - t0)
        for job_id, named in self._by_job((r.workload_id, r.reason) for r in decisions.rejects).items():
            self._refuse(job_id, named[0][1])
        for job_id in self._by_job((p.workload_id, None) for p in decisions.preempts):
            rec = self._records[job_id]
            if job_id not in self._running or rec.run_start is None:
                raise InvalidDecision(f"preempt of {job_id}, which is not running")
            self._pause(rec, t)  # a preempt of any replica pauses the whole gang
        for job_id, named in self._by_job((s.workload_id, s.assignment) for s in decisions.starts).items():
            self._start(self._records[job_id], named, t)
        return bool(decisions.starts or decisions.preempts or decisions.rejects)

    def _by_job(self, items: Iterable[tuple[str, object]]) -> dict[str, list[tuple[str, object]]]:
        """Decisions grouped by the job their workload belongs to, in the order they were given."""
        out: dict[str, list[tuple[str, object]]] = {}
        for wid, what in items:
            job_id = self._job_of.get(wid)
            if job_id is None:
                raise InvalidDecision(f"decision on {wid}, which is not a job of this replay")
            out.setdefault(job_id, []).append((wid, what))
        return out

    def _refuse(self, job_id: str, reason: object) -> None:
        """The policy says the job can never run: record why and take it out of the queue, whole."""
        rec = self._records[job_id]
        if job_id not in self._pending:
            raise InvalidDecision(f"reject of {job_id}, which is not pending")
        self._pending.discard(job_id)
        self._guards[rec.trace.team].drop_pending(rec.trace.gpus)
        rec.never = str(reason)
        for wid in rec.ids:
            del self._live[wid]

    def _start(self, rec: JobRecord, named: Sequence[tuple[str, object]], t: float) -> None:
        job_id = rec.trace.id
        if job_id not in self._pending:
            raise InvalidDecision(f"start of {named[0][0]}, which is not pending")
        wids = [wid for wid, _ in named]
        if sorted(wids) != sorted(rec.ids):
            raise InvalidDecision(
                f"start of {', '.join(sorted(wids))} of gang {job_id}: its {rec.replicas} replicas "
                "start together, each once, or none does"
            )
        want = rec.replica_gpus
        taken: set[str] = set()
        for wid, assignment in named:
            assert isinstance(assignment, Assignment)
            if len(assignment.gpus) != want or len({g for g, _ in assignment.gpus}) != want:
                raise InvalidDecision(f"start of {wid} on {len(assignment.gpus)} GPUs; it needs {want} whole GPUs")
            for gpu_id, milli in assignment.gpus:
                if self._gpu_node.get(gpu_id) != assignment.node:
                    raise InvalidDecision(f"start of {wid}: GPU {gpu_id} is not on node {assignment.node}")
                if milli != MILLI:
                    raise InvalidDecision(f"start of {wid}: {milli} milli-GPU on {gpu_id}; whole GPUs expected")
                holder = self._gpu_holder[gpu_id]
                if holder is not None:
                    raise InvalidDecision(f"start of {wid} on GPU {gpu_id}, which {holder} holds")
                if gpu_id in taken:
                    raise InvalidDecision(f"start of {wid} on GPU {gpu_id}, which another replica of {job_id} takes")
                taken.add(gpu_id)
        rec.assignments = {}
        for wid, assignment in named:
            assert isinstance(assignment, Assignment)
            for gpu_id, _ in assignment.gpus:
                self._gpu_holder[gpu_id] = wid
            rec.assignments[wid] = assignment
        self._pending.discard(job_id)
        self._running.add(job_id)
        guard = self._guards[rec.trace.team]
        guard.drop_pending(rec.trace.gpus)
        guard.held += rec.trace.gpus
        rec.runs += 1
        rec.racks_per_run.append(len({self._group[a.node] for a in rec.assignments.values()}))
        rec.run_start = t
        if rec.first_start is None:
            rec.first_start = t
        self._seq += 1
        heapq.heappush(self._heap, (t + rec.trace.duration - rec.saved, self._seq, job_id, rec.runs))
        for wid in rec.ids:
            self._live[wid] = self._workload(rec, wid)

    def _pause(self, rec: JobRecord, t: float) -> None:
        """Pause every replica: the job keeps its work up to its last checkpoint."""
        assert rec.run_start is not None
        ran = t - rec.run_start
        interval = self.config.checkpoint_interval_s
        kept = math.floor(ran / interval) * interval if interval > 0 else ran
        lost = ran - kept
        gpus = rec.trace.gpus
        self._end_run(rec, t, lost_s=lost)
        rec.saved += kept
        rec.lost_gpu_s += lost * gpus
        rec.pauses += 1
        rec.paused_at = t
        rec.run_start = None
        rec.assignments = {}
        job_id = rec.trace.id
        self._running.discard(job_id)
        self._pending.add(job_id)
        guard = self._guards[rec.trace.team]
        guard.held -= gpus
        guard.add_pending(gpus)
        for wid in rec.ids:
            self._live[wid] = self._workload(rec, wid)

    def _end_run(self, rec: JobRecord, t: float, lost_s: float = 0.0) -> None:
        """Free the GPUs of every replica and book the run's busy (and lost) GPU-seconds inside the window."""
        assert rec.assignments and rec.run_start is not None
        for assignment in rec.assignments.values():
            for gpu_id, _ in assignment.gpus:
                self._gpu_holder[gpu_id] = None
        lo, hi = self._window()
        gpus = rec.trace.gpus
        self._busy_window += gpus * max(0.0, min(t, hi) - max(rec.run_start, lo))
        if lost_s:
            lost_from = t - lost_s
            self._lost_window += gpus * max(0.0, min(t, hi) - max(lost_from, lo))

    def _window(self) -> tuple[float, float]:
        cfg = self.config
        if cfg.measure_end > cfg.measure_start:
            return cfg.measure_start, cfg.measure_end
        return -INF, INF

    def _workload(self, rec: JobRecord, wid: str) -> Workload:
        gpus = rec.replica_gpus
        request = self._requests.get(gpus)
        if request is None:
            request = self._requests[gpus] = Request(gpus=gpus)
        gang = rec.replicas > 1
        return Workload(
            id=wid,
            project=rec.trace.team,
            kind=Kind.TRAIN,
            request=request,
            priority=0,
            submitted_at=rec.trace.submit,
            assignment=rec.assignments.get(wid),
            started_at=rec.run_start,
            attempts=rec.runs,
            paused_at=rec.paused_at,
            gang=rec.trace.id if gang else "",
            gang_size=rec.replicas if gang else 0,
        )

    # ------------------------------------------------------------ result

    def _result(self, end: float, wall_s: float) -> SimResult:
        lo, hi = self._window()
        if hi == INF:
            lo = self.jobs[0].submit if self.jobs else 0.0
            hi = end
        gpus = sum(len(n.gpus) for n in self.nodes)
        guards = self._guards
        return SimResult(
            jobs=[self._records[j.id] for j in self.jobs],
            busy_gpu_s_window=self._busy_window,
            lost_gpu_s_window=self._lost_window,
            capacity_gpu_s_window=gpus * max(0.0, hi - lo),
            violation_s={p: g.seconds for p, g in guards.items()},
            violation_gang_s={p: g.seconds_gang for p, g in guards.items()},
            violation_episodes=sum(g.episodes for g in guards.values()),
            calls=self.calls,
            end_time=end,
            wall_s=wall_s,
            fairness_daily=daily_fairness(self._ledger, gpus, {p: g.guarantee for p, g in guards.items()},
                                          max(1, math.ceil((hi - lo) / self._ledger.day_s - 1e-9))),
            violation_gpu_s={p: g.gpu_s for p, g in guards.items()},
            violation_gang_gpu_s={p: g.gpu_s_gang for p, g in guards.items()},
            violation_gang_episodes=sum(g.episodes_gang for g in guards.values()),
            violation_log={p: list(g.log) for p, g in guards.items() if g.log},
        )
