"""The replay's records: its configuration, each job's life, and the run's result.

Kept apart from the event loop (:mod:`bench.sim.simulator`) so the loop's
file holds only the loop; everything here is plain data the benchmark's
report (:mod:`bench.sim.metrics`) reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.sim.gangs import replica_ids
from bench.sim.guarantees import Episode
from bench.sim.trace import TraceJob
from gpupool.policy.model import Assignment, Decisions, PolicyConfig, Snapshot

ScheduleFn = Callable[[Snapshot], Decisions]


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
    # 0: every job runs on one node (a job wider than the widest node is refused up front, as before gangs);
    # > 0: a job wider than this many GPUs runs as a gang of identical replicas (bench.sim.gangs)
    gang_width: int = 0


@dataclass
class JobRecord:
    """One job's life in the replay; the mutable part is private to the simulator."""

    trace: TraceJob
    replicas: int = 1  # workloads the job is in the snapshot (> 1: a multi-node gang)
    replica_gpus: int = 0  # whole GPUs per replica (0: the job's own count)
    saved: float = 0.0  # work (seconds) kept by checkpoints
    run_start: float | None = None
    assignments: dict[str, Assignment] = field(default_factory=dict)  # replica workload id -> where it runs
    first_start: float | None = None
    finish: float | None = None
    runs: int = 0
    paused_at: float | None = None
    pauses: int = 0
    lost_gpu_s: float = 0.0
    racks_per_run: list[int] = field(default_factory=list)  # node groups (racks) its replicas spanned, per run
    never: str | None = None  # the policy refused it: the reason it can never run under that policy
    ids: tuple[str, ...] = ()  # replica workload ids

    def __post_init__(self) -> None:
        if not self.replica_gpus:
            self.replica_gpus = self.trace.gpus
        self.ids = replica_ids(self.trace.id, self.replicas)

    @property
    def assignment(self) -> Assignment | None:
        """Where a one-replica job runs (the first replica's place for a gang); None unless running."""
        return next(iter(self.assignments.values()), None)

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
    violation_gpu_s: dict[str, float] = field(default_factory=dict)  # project -> shortfall GPU-seconds (issue's)
    violation_gang_gpu_s: dict[str, float] = field(default_factory=dict)  # the same, gang-aware
    violation_gang_episodes: int = 0
    violation_log: dict[str, list[Episode]] = field(default_factory=dict)  # project -> its literal episodes

    @property
    def never_ran(self) -> list[JobRecord]:
        """Jobs the policy refused for good: they can never run under it (reported, not dropped)."""
        return [r for r in self.jobs if r.never is not None]
