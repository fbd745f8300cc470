"""Turning a replay into the figures the benchmark reports."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from bench.sim.simulator import SimResult

HOUR = 3600.0


@dataclass(frozen=True)
class Summary:
    """One policy's row. Times in hours unless the name says otherwise."""

    policy: str
    jobs: int
    avg_jct_h: float
    p99_jct_h: float
    avg_queue_h: float
    p99_queue_h: float
    utilization: float  # busy GPU-seconds / capacity, inside the measurement window
    goodput: float  # the same without work later thrown away by pauses
    pauses: int
    paused_jobs: int
    lost_gpu_h: float
    violation_s: float  # the definition, summed over projects
    violation_gang_s: float  # only while a pending job would fit inside the project's guarantee
    violation_episodes: int
    violating_projects: tuple[str, ...]
    policy_calls: int
    skipped_cycles: int
    call_ms_mean: float
    call_ms_p99: float
    call_ms_max: float
    max_pending: int
    max_workloads: int
    drained_h: float  # last completion, hours after the window's start
    wall_s: float
    fairness_daily_mean: float = 1.0  # Jain's index of received / entitled GPU-seconds per day (bench.sim.daily)
    fairness_daily_min: float = 1.0
    # the replay with real job sizes (multi-node gangs): percentiles of queueing delay, of all jobs that
    # ran and of the large ones (>= large_gpus GPUs), shortfall GPU-hours, and the jobs the policy could
    # never run (refused: wider than the cluster, or than the team's partition); nan when there is no job
    queue_p50_h: float = 0.0
    queue_p95_h: float = 0.0
    large_gpus: int = 16
    large_jobs: int = 0
    large_queue_p50_h: float = math.nan
    large_queue_p95_h: float = math.nan
    large_queue_max_h: float = math.nan
    violation_gpu_h: float = 0.0
    violation_gang_gpu_h: float = 0.0
    violation_gang_episodes: int = 0
    never_ran: int = 0
    never_ran_gpu_h: float = 0.0  # their work had they run, GPUs x duration
    never_ran_reasons: tuple[str, ...] = ()  # one line per job: id, GPUs, team, the policy's reason
    gang_runs: int = 0  # starts of multi-node gangs (a restart after a pause counts again)
    gang_runs_across_racks: int = 0  # of those, starts whose replicas spanned more than one rack

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["violating_projects"] = list(self.violating_projects)
        data["never_ran_reasons"] = list(self.never_ran_reasons)
        for key, value in data.items():  # strict JSON has no NaN: a percentile of no jobs is null
            if isinstance(value, float) and math.isnan(value):
                data[key] = None
        return data


def _pct_h(values: np.ndarray, q: float) -> float:
    """The ``q``-th percentile in hours, nan for no values (a row with no such job says so)."""
    return float(np.percentile(values, q) / HOUR) if values.size else math.nan


def summarize(policy: str, result: SimResult, window_start: float, large_gpus: int = 16) -> Summary:
    """One policy's row. Jobs the policy refused for good are counted apart, never in the times."""
    never = result.never_ran
    jobs = [r for r in result.jobs if r.never is None]
    if not jobs or any(r.finish is None or r.first_start is None for r in jobs):
        raise ValueError(f"{policy}: every job must have finished (or been refused) before summarizing")
    jct = np.array([r.jct for r in jobs])
    queue = np.array([r.queueing for r in jobs])
    large = np.array([r.queueing for r in jobs if r.trace.gpus >= large_gpus])
    calls = np.array(result.calls.seconds) * 1000.0 if result.calls.seconds else np.zeros(1)
    capacity = result.capacity_gpu_s_window or 1.0
    return Summary(
        policy=policy,
        jobs=len(jobs),
        avg_jct_h=float(jct.mean() / HOUR),
        p99_jct_h=float(np.percentile(jct, 99) / HOUR),
        avg_queue_h=float(queue.mean() / HOUR),
        p99_queue_h=float(np.percentile(queue, 99) / HOUR),
        utilization=result.busy_gpu_s_window / capacity,
        goodput=(result.busy_gpu_s_window - result.lost_gpu_s_window) / capacity,
        pauses=sum(r.pauses for r in jobs),
        paused_jobs=sum(1 for r in jobs if r.pauses),
        lost_gpu_h=sum(r.lost_gpu_s for r in jobs) / HOUR,
        violation_s=sum(result.violation_s.values()),
        violation_gang_s=sum(result.violation_gang_s.values()),
        violation_episodes=result.violation_episodes,
        violating_projects=tuple(sorted(p for p, s in result.violation_s.items() if s > 0)),
        policy_calls=len(result.calls.seconds),
        skipped_cycles=result.calls.skipped_cycles,
        call_ms_mean=float(calls.mean()),
        call_ms_p99=float(np.percentile(calls, 99)),
        call_ms_max=float(calls.max()),
        max_pending=result.calls.max_pending,
        max_workloads=result.calls.max_workloads,
        drained_h=(result.end_time - window_start) / HOUR,
        wall_s=result.wall_s,
        fairness_daily_mean=float(np.mean(result.fairness_daily)) if result.fairness_daily else 1.0,
        fairness_daily_min=float(min(result.fairness_daily)) if result.fairness_daily else 1.0,
        queue_p50_h=_pct_h(queue, 50),
        queue_p95_h=_pct_h(queue, 95),
        large_gpus=large_gpus,
        large_jobs=int(large.size),
        large_queue_p50_h=_pct_h(large, 50),
        large_queue_p95_h=_pct_h(large, 95),
        large_queue_max_h=_pct_h(large, 100),
        violation_gpu_h=sum(result.violation_gpu_s.values()) / HOUR,
        violation_gang_gpu_h=sum(result.violation_gang_gpu_s.values()) / HOUR,
        violation_gang_episodes=result.violation_gang_episodes,
        never_ran=len(never),
        never_ran_gpu_h=sum(r.trace.gpus * r.trace.duration for r in never) / HOUR,
        gang_runs=sum(len(r.racks_per_run) for r in jobs if r.replicas > 1),
        gang_runs_across_racks=sum(1 for r in jobs if r.replicas > 1 for n in r.racks_per_run if n > 1),
        never_ran_reasons=tuple(f"{r.trace.id} ({r.trace.gpus} GPUs, team {r.trace.team}): {r.never}" for r in never),
    )


def per_team_jct_h(result: SimResult) -> dict[str, float]:
    """Average JCT per team: who pays for a policy's choices."""
    sums: dict[str, list[float]] = {}
    for r in result.jobs:
        if r.never is not None:
            continue
        sums.setdefault(r.trace.team, []).append(r.jct)
    return {team: float(np.mean(v) / HOUR) for team, v in sorted(sums.items())}
