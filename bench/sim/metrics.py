"""Turning a replay into the figures the benchmark reports."""

from __future__ import annotations

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

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["violating_projects"] = list(self.violating_projects)
        return data


def summarize(policy: str, result: SimResult, window_start: float) -> Summary:
    jobs = result.jobs
    if not jobs or any(r.finish is None or r.first_start is None for r in jobs):
        raise ValueError(f"{policy}: every job must have finished before summarizing")
    jct = np.array([r.jct for r in jobs])
    queue = np.array([r.queueing for r in jobs])
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
    )


def per_team_jct_h(result: SimResult) -> dict[str, float]:
    """Average JCT per team: who pays for a policy's choices."""
    sums: dict[str, list[float]] = {}
    for r in result.jobs:
        sums.setdefault(r.trace.team, []).append(r.jct)
    return {team: float(np.mean(v) / HOUR) for team, v in sorted(sums.items())}
