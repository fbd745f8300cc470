"""The event loop: arrivals, completions and scheduling cycles on a GPU cluster.

Time only moves from one event to the next: a job arrival, a job completion,
or a scheduling cycle. Cycles fall on multiples of ``cycle_s`` and are held only
while some job is pending (with nothing pending no policy can decide anything),
so a long drain of running jobs costs nothing. At each cycle the whole cluster
state goes to the policy as a :class:`~scheduler.policy.Snapshot`; its
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
  per episode (a job may always wait for the next cycle).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from bench.sim.daily import DailyLedger, daily_fairness
from bench.sim.trace import TraceJob
from scheduler.policy.model import (
    MILLI,
    Assignment,
    Decisions,
    Kind,
    Node,
    PolicyConfig,
    Project,
    Request,
    Snapshot,
    Workload,
)
from scheduler.service.usage import DecayedUsage

ScheduleFn = Callable[[Snapshot], Decisions]
INF = math.inf


class InvalidDecision(Exception):
    """The policy asked for something the cluster cannot do (a bug in the policy)."""


class Stalled(Exception):
    """Jobs are pending on an idle cluster with nothing left to happen: the policy never starts them."""


@dataclass(frozen=True)
class SimConfig:
    """How the replay runs. Every knob that moves a result is stated here."""

    cycle_s: float = 60.0
    checkpoint_interval_s: float = 1800.0
    measure_start: float = 0.0  # utilization window (defaults to the whole run when start == end)
    measure_end: float = 0.0
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    time_invariant_policy: bool = False  # decisions depend on state only: skip cycles where nothing changed
    stall_cycles: int = 10_000  # idle cycles with pending jobs and nothing else to happen before Stalled
    usage_half_life_s: float = 0.0  # > 0: projects carry their decayed recent use (fair share over time)


@dataclass
class JobRecord:
    """One job's life in the replay; the mutable part is private to the simulator."""

    trace: TraceJob
    saved: float = 0.0  # work (seconds) kept by checkpoints
    run_start: float | None = None
    assignment: Assignment | None = None
    first_start: float | None = None
    finish: float | None = None
    runs: int = 0
    paused_at: float | None = None
    pauses: int = 0
    lost_gpu_s: float = 0.0

    @property
    def jct(self) -> float:
        assert self.finish is not None
        return self.finish - self.trace.submit

    @property
    def queueing(self) -> float:
        assert self.first_start is not None
        return self.first_start - self.trace.submit


@dataclass
class CallStats:
    """Wall time of the policy calls, and the largest snapshot it was given."""

    seconds: list[float] = field(default_factory=list)
    max_workloads: int = 0
    max_pending: int = 0
    skipped_cycles: int = 0


@dataclass
class SimResult:
    jobs: list[JobRecord]
    busy_gpu_s_window: float
    lost_gpu_s_window: float
    capacity_gpu_s_window: float
    violation_s: dict[str, float]  # project -> seconds, the definition
    violation_gang_s: dict[str, float]  # project -> seconds, only when a pending job fits inside the guarantee
    violation_episodes: int
    calls: CallStats
    end_time: float
    wall_s: float
    fairness_daily: list[float] = field(default_factory=list)  # Jain's index per day of the window (bench.sim.daily)


@dataclass
class _Guard:
    """Per project: what it holds and wants, and the open violation episodes."""

    guarantee: int  # GPUs
    held: int = 0
    pending_gpus: int = 0
    pending_sizes: Counter[int] = field(default_factory=Counter)
    since: float | None = None
    since_gang: float | None = None
    seconds: float = 0.0
    seconds_gang: float = 0.0
    episodes: int = 0


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
        self.nodes = nodes
        self.projects = projects
        self.schedule = schedule
        self.jobs = sorted(jobs, key=lambda j: j.submit)
        self._records: dict[str, JobRecord] = {}
        self._gpu_node: dict[str, str] = {}
        self._gpu_holder: dict[str, str | None] = {}
        for node in nodes:
            for gpu in node.gpus:
                if gpu.id in self._gpu_node:
                    raise ValueError(f"GPU id {gpu.id} appears twice in the cluster")
                self._gpu_node[gpu.id] = node.name
                self._gpu_holder[gpu.id] = None
        widest = max((len(n.gpus) for n in nodes), default=0)
        known = {p.name for p in projects}
        for job in self.jobs:
            if job.team not in known:
                raise ValueError(f"job {job.id} belongs to {job.team}, which is not a project")
            if job.gpus > widest:
                raise ValueError(f"job {job.id} needs {job.gpus} GPUs; the widest node has {widest}")
        self._guards = {p.name: _Guard(p.train_guarantee_milli // MILLI) for p in projects}
        self._live: dict[str, Workload] = {}  # insertion order = arrival order
        self._pending: set[str] = set()
        self._running: set[str] = set()
        self._requests: dict[int, Request] = {}
        self._heap: list[tuple[float, int, str, int]] = []
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
                _, _, wid, token = heapq.heappop(self._heap)
                rec = self._records[wid]
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
                    if idle_cycles >= cfg.stall_cycles:
                        raise Stalled(
                            f"{len(self._pending)} jobs pending on an idle cluster for {idle_cycles} cycles "
                            "with no arrival left: the policy never starts them"
                        )
                else:
                    idle_cycles = 0
            self._check_guarantees(t)
        self._check_guarantees(now, closing=True)
        return self._result(now, time.perf_counter() - wall0)

    def _next_completion(self) -> float:
        heap = self._heap
        while heap:
            _, _, wid, token = heap[0]
            rec = self._records[wid]
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
        rec = JobRecord(job)
        self._records[job.id] = rec
        self._pending.add(job.id)
        guard = self._guards[job.team]
        guard.pending_gpus += job.gpus
        guard.pending_sizes[job.gpus] += 1
        self._live[job.id] = self._workload(rec)

    def _complete(self, rec: JobRecord, t: float) -> None:
        self._advance(t)
        self._end_run(rec, t)
        rec.finish = t
        rec.assignment = None
        rec.run_start = None
        self._running.discard(rec.trace.id)
        self._guards[rec.trace.team].held -= rec.trace.gpus
        del self._live[rec.trace.id]

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
        if decisions.rejects:
            first = decisions.rejects[0]
            raise InvalidDecision(
                f"policy rejected training job {first.workload_id} ({first.reason}); every job here fits a node"
            )
        for preempt in decisions.preempts:
            self._pause(preempt.workload_id, t)
        for start in decisions.starts:
            self._start(start.workload_id, start.assignment, t)
        return bool(decisions.starts or decisions.preempts)

    def _start(self, wid: str, assignment: Assignment, t: float) -> None:
        rec = self._records.get(wid)
        if rec is None or wid not in self._pending:
            raise InvalidDecision(f"start of {wid}, which is not pending")
        want = rec.trace.gpus
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
        for gpu_id, _ in assignment.gpus:
            self._gpu_holder[gpu_id] = wid
        self._pending.discard(wid)
        self._running.add(wid)
        guard = self._guards[rec.trace.team]
        guard.pending_gpus -= want
        guard.pending_sizes[want] -= 1
        if not guard.pending_sizes[want]:
            del guard.pending_sizes[want]
        guard.held += want
        rec.runs += 1
        rec.run_start = t
        rec.assignment = assignment
        if rec.first_start is None:
            rec.first_start = t
        self._seq += 1
        heapq.heappush(self._heap, (t + rec.trace.duration - rec.saved, self._seq, wid, rec.runs))
        self._live[wid] = self._workload(rec)

    def _pause(self, wid: str, t: float) -> None:
        rec = self._records.get(wid)
        if rec is None or wid not in self._running or rec.run_start is None:
            raise InvalidDecision(f"preempt of {wid}, which is not running")
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
        rec.assignment = None
        self._running.discard(wid)
        self._pending.add(wid)
        guard = self._guards[rec.trace.team]
        guard.held -= gpus
        guard.pending_gpus += gpus
        guard.pending_sizes[gpus] += 1
        self._live[wid] = self._workload(rec)

    def _end_run(self, rec: JobRecord, t: float, lost_s: float = 0.0) -> None:
        """Free the GPUs and book the run's busy (and lost) GPU-seconds inside the window."""
        assert rec.assignment is not None and rec.run_start is not None
        for gpu_id, _ in rec.assignment.gpus:
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

    def _workload(self, rec: JobRecord) -> Workload:
        gpus = rec.trace.gpus
        request = self._requests.get(gpus)
        if request is None:
            request = self._requests[gpus] = Request(gpus=gpus)
        return Workload(
            id=rec.trace.id,
            project=rec.trace.team,
            kind=Kind.TRAIN,
            request=request,
            priority=0,
            submitted_at=rec.trace.submit,
            assignment=rec.assignment,
            started_at=rec.run_start,
            attempts=rec.runs,
            paused_at=rec.paused_at,
        )

    # ------------------------------------------------------------ guarantees

    def _check_guarantees(self, t: float, closing: bool = False) -> None:
        grace = self.config.cycle_s
        for guard in self._guards.values():
            short = False
            short_gang = False
            if guard.pending_gpus and not closing:
                short = guard.held < min(guard.guarantee, guard.held + guard.pending_gpus)
                short_gang = guard.held + min(guard.pending_sizes) <= guard.guarantee
            if short and guard.since is None:
                guard.since = t
            elif not short and guard.since is not None:
                over = t - guard.since - grace
                if over > 0:
                    guard.seconds += over
                    guard.episodes += 1
                guard.since = None
            if short_gang and guard.since_gang is None:
                guard.since_gang = t
            elif not short_gang and guard.since_gang is not None:
                guard.seconds_gang += max(0.0, t - guard.since_gang - grace)
                guard.since_gang = None

    # ------------------------------------------------------------ result

    def _result(self, end: float, wall_s: float) -> SimResult:
        lo, hi = self._window()
        if hi == INF:
            lo = self.jobs[0].submit if self.jobs else 0.0
            hi = end
        gpus = sum(len(n.gpus) for n in self.nodes)
        return SimResult(
            jobs=[self._records[j.id] for j in self.jobs],
            busy_gpu_s_window=self._busy_window,
            lost_gpu_s_window=self._lost_window,
            capacity_gpu_s_window=gpus * max(0.0, hi - lo),
            violation_s={p: g.seconds for p, g in self._guards.items()},
            violation_gang_s={p: g.seconds_gang for p, g in self._guards.items()},
            violation_episodes=sum(g.episodes for g in self._guards.values()),
            calls=self.calls,
            end_time=end,
            wall_s=wall_s,
            fairness_daily=daily_fairness(self._ledger, gpus, {p: g.guarantee for p, g in self._guards.items()},
                                          max(1, math.ceil((hi - lo) / self._ledger.day_s - 1e-9))),
        )
