"""Reading the Philly trace and cutting a replay window out of it.

The trace is read with the standard ``csv`` module (82k rows, under a second)
so the benchmark needs nothing beyond the project's own dependencies.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

DAY_S = 86_400.0


@dataclass(frozen=True)
class TraceJob:
    """One training job as the trace describes it."""

    id: str
    submit: float  # Unix seconds (UTC)
    duration: float  # seconds of work on its GPUs
    gpus: int
    team: str


@dataclass(frozen=True)
class Window:
    """The jobs kept for a replay, and what was left out and why."""

    start: float
    end: float
    jobs: tuple[TraceJob, ...]
    excluded: Counter[str] = field(default_factory=Counter)  # reason -> jobs
    excluded_gpu_s: Counter[str] = field(default_factory=Counter)  # reason -> GPU-seconds

    @property
    def days(self) -> float:
        return (self.end - self.start) / DAY_S


def parse_time(text: str) -> float:
    """``YYYY-MM-DD[ HH:MM:SS]`` (UTC) to Unix seconds."""
    fmt = "%Y-%m-%d %H:%M:%S" if " " in text.strip() else "%Y-%m-%d"
    try:
        moment = datetime.strptime(text.strip(), fmt)
    except ValueError as exc:
        raise ValueError(f"bad time {text!r}: expected YYYY-MM-DD or 'YYYY-MM-DD HH:MM:SS'") from exc
    return moment.replace(tzinfo=timezone.utc).timestamp()


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def load_jobs(path: Path) -> list[TraceJob]:
    """All jobs of ``philly.csv``, sorted by submission time (ties keep file order)."""
    jobs: list[TraceJob] = []
    with open(path, newline="") as handle:
        for row_no, row in enumerate(csv.DictReader(handle), start=2):
            try:
                submit = parse_time(row["timestamp"])
                duration = float(row["duration"])
                gpus = int(row["num_gpus"])
                team = row["cluster"].strip()
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{row_no}: unreadable job row ({exc})") from exc
            if duration < 0 or gpus < 1 or not team:
                raise ValueError(f"{path}:{row_no}: job needs duration >= 0, num_gpus >= 1 and a cluster")
            jobs.append(TraceJob(f"j{row_no - 2:06d}", submit, duration, gpus, team))
    jobs.sort(key=lambda j: j.submit)
    return jobs


def load_vc_sizes(path: Path) -> dict[str, int]:
    """``philly_vc.csv``: virtual cluster (team) -> node count, in file order."""
    sizes: dict[str, int] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                sizes[row["vc"].strip()] = int(row["node num"])
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}: unreadable virtual-cluster row {row} ({exc})") from exc
    if not sizes or any(n < 0 for n in sizes.values()) or sum(sizes.values()) == 0:
        raise ValueError(f"{path}: needs at least one virtual cluster with a positive node count")
    return sizes


def offered_load(jobs: list[TraceJob] | tuple[TraceJob, ...], start: float, end: float) -> float:
    """Average GPUs the jobs submitted in [start, end) would keep busy inside it if each started at once.

    Work that would spill past ``end`` is not counted: this is the demand the
    window itself puts on the cluster, the figure the cluster is sized against.
    """
    busy = sum(j.gpus * min(j.duration, end - j.submit) for j in jobs if start <= j.submit < end)
    return busy / (end - start)


def cut_window(
    jobs: list[TraceJob], start: float, days: float, teams: dict[str, int], max_gpus: int | None
) -> Window:
    """Jobs submitted in [start, start + days), minus the ones left out of the replay.

    Left out, and counted: jobs wider than ``max_gpus`` (one node, in the
    replay where every job runs on one node; ``None`` keeps every size, for the
    replay with multi-node gangs); jobs of teams absent from
    ``philly_vc.csv``, because they have no quota to be measured against.
    """
    end = start + days * DAY_S
    kept: list[TraceJob] = []
    excluded: Counter[str] = Counter()
    excluded_gpu_s: Counter[str] = Counter()
    for job in jobs:
        if not start <= job.submit < end:
            continue
        reason = None
        if max_gpus is not None and job.gpus > max_gpus:
            reason = f"wider than {max_gpus} GPUs"
        elif job.team not in teams:
            reason = "team not in philly_vc.csv"
        if reason:
            excluded[reason] += 1
            excluded_gpu_s[reason] += job.gpus * job.duration
        else:
            kept.append(job)
    return Window(start, end, tuple(kept), excluded, excluded_gpu_s)


def busiest_window(jobs: list[TraceJob], days: int, teams: dict[str, int], max_gpus: int | None) -> float:
    """Start (a UTC midnight) of the ``days``-long window with the highest offered load."""
    if not jobs:
        raise ValueError("the trace has no jobs")
    first = math.floor(jobs[0].submit / DAY_S) * DAY_S
    last = jobs[-1].submit
    best_start, best_load = first, -1.0
    start = first
    while start + days * DAY_S <= last + DAY_S:
        window = cut_window(jobs, start, days, teams, max_gpus)
        load = offered_load(window.jobs, window.start, window.end)
        if load > best_load:
            best_start, best_load = start, load
        start += DAY_S
    return best_start


def daily_demand(jobs: list[TraceJob], start: float, end: float) -> list[tuple[str, float]]:
    """GPU-days submitted per UTC day in [start, end): how the busy window was chosen."""
    per_day: dict[float, float] = {}
    for job in jobs:
        if start <= job.submit < end:
            day = math.floor(job.submit / DAY_S) * DAY_S
            per_day[day] = per_day.get(day, 0.0) + job.gpus * job.duration / DAY_S
    return [(format_time(d)[:10], v) for d, v in sorted(per_day.items())]


def proportional_guarantees(sizes: dict[str, int], total_gpus: int) -> dict[str, int]:
    """Whole-GPU guarantees in proportion to ``sizes``, summing exactly to ``total_gpus``.

    Largest-remainder rounding, ties broken by team order in the file, so the
    split is deterministic and nobody is more than one GPU off their share.
    """
    weight = sum(sizes.values())
    exact = {team: total_gpus * n / weight for team, n in sizes.items()}
    shares = {team: math.floor(v) for team, v in exact.items()}
    spare = total_gpus - sum(shares.values())
    order = sorted(sizes, key=lambda t: (-(exact[t] - shares[t]), list(sizes).index(t)))
    for team in order[:spare]:
        shares[team] += 1
    return shares
