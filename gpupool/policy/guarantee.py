"""Counting a project's training jobs against its guarantee: which are beyond it (preemptible).

Asked twice a cycle: as it starts (intake: the jobs other projects' reclaim
may pause) and at the end, for the projects whose running set changed
(outcome: the preemptible flags of the decisions). Reclaim picks victims
from the other end of the same order, so the flag tells the truth about what
may be paused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter

from gpupool.policy.cycle_state import CycleState, Started
from gpupool.policy.model import Workload

_by_id = attrgetter("id")
_by_start = attrgetter("started_at")


def _started_or_never(w: Workload) -> float:
    return w.started_at if w.started_at is not None else -math.inf


def sort_by_start(jobs: list[Workload], latest_first: bool = False) -> None:
    """Stable in-place sort of running jobs by start time; one without a start time counts as started first.

    A C-level key (no tuple per job) whenever every job has a start time: the
    engine sorts thousands of running jobs this way each cycle, after sorting
    by id and before sorting by priority, so equal keys keep the earlier order.
    """
    key = _started_or_never if any(v.started_at is None for v in jobs) else _by_start
    jobs.sort(key=key, reverse=latest_first)


def _new_then_priority(item: tuple[Workload, int]) -> tuple[int, int]:
    """Sort key, used reversed: higher priority first; within it running jobs (0) before new starts (1)."""
    return (item[0].priority, -item[1])


def over_guarantee(state: CycleState, name: str, new_starts: Sequence[tuple[int, Started]] = ()) -> set[str]:
    """Project ``name``'s training jobs beyond its guarantee (running, not paused, plus started).

    Jobs are counted against the guarantee by priority (highest first),
    then by start time (oldest first; this cycle's starts last, in start
    order); a job is preemptible when the jobs before it already fill the
    guarantee. The job that *crosses* the guarantee (it starts below it and
    ends above) is not: pausing it would take the project below its
    guarantee, which reclaim never does. So a project below its guarantee
    may start a gang bigger than what is left of it and keep it, and
    every flagged job can be paused alone without breaking the floor.
    """
    preempted, milli = state.preempted, state.milli
    running = [w for w in state.train_running[name] if w.id not in preempted]
    # (priority desc, start asc, id) as stable C-level sorts, last key first: this runs for
    # every project above its guarantee on thousands of jobs each cycle
    running.sort(key=_by_id)
    sort_by_start(running)
    # this cycle's starts come after every running job of their priority, in start order
    order = [(w, 0) for w in running] + [(s.workload, 1) for _, s in new_starts]
    order.sort(key=_new_then_priority, reverse=True)
    guarantee = state.projects[name].train_guarantee_milli
    if name in state.gang_projects:
        return flag_units(order, milli, guarantee)  # a gang is flagged whole or not at all
    total = 0
    over = set()
    for w, _ in order:
        m = milli[w.id]
        if total >= guarantee and total + m > guarantee:
            over.add(w.id)
        total += m
    return over


def flag_units(order: Sequence[tuple[Workload, int]], milli: dict[str, int], guarantee: int) -> set[str]:
    """The preemptible flag counted per unit: a gang is one unit (all replicas flagged or none).

    As :func:`over_guarantee`, with a gang's replicas summed at the place of
    its first replica in ``order``: a gang is preemptible when the units
    before it already fill the guarantee, so it can be paused whole without
    taking its project below the guarantee.
    """
    units: dict[str, list[str]] = {}
    for w, _ in order:
        if w.gang:
            units.setdefault(w.gang, []).append(w.id)
    total = 0
    over: set[str] = set()
    seen: set[str] = set()
    for w, _ in order:
        if w.gang:
            if w.gang in seen:
                continue
            seen.add(w.gang)
            ids = units[w.gang]
            m = sum(milli[i] for i in ids)
        else:
            ids = [w.id]
            m = milli[w.id]
        if total >= guarantee and total + m > guarantee:
            over.update(ids)
        total += m
    return over
