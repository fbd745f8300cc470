"""``GET /api/v1/report/series``: allocated vs used over time, per project, user or job, build and train apart.

The chart a team lead shows their manager: for each step of a range, the mean
GPUs a project held, the part of them that was measured and the part used.
It is the report (gpupool.service.report) cut into time buckets, read from
the same ``gpu_use`` rows by one GROUP BY per resolution (no table of its own),
then each job's project, user and kind from the jobs table.

- **Range and step.** ``since`` defaults to an hour ago; the series ends at
  the last 10 s boundary the samples have passed (``until``: everything before
  it is counted, so the last point does not dip). ``step`` (seconds) is rounded up to a multiple of the rows'
  resolution (10 s within the last day, 5 min further back) and up again so a
  series has at most ``MAX_POINTS`` points; without one, the smallest of
  ``STEPS`` that fits. Buckets start at multiples of ``step`` (Unix time; the
  range starts with the bucket holding ``since``); the last one may be
  shorter, ending at ``until``.
- **Values** are mean GPUs over the seconds sampled in each bucket (the
  history's clock rows, ``SAMPLED``; the bucket's length for rows from before
  them): ``allocated`` (held), ``measured`` (held where use could be measured)
  and ``used``. A bucket takes each interval between two samples by its
  middle, so with a 5 s tick a 10 s bucket holds 5, 10 or 15 s of samples;
  dividing by its length would draw a steady job as a saw. What
  was held but not measured (``allocated - measured``) is unknown, not idle;
  idle is ``measured - used``.
- **Who sees what**: as the report. An admin everything; a user the projects
  they may use (``by=project``, every job of them counted), their own row
  (``by=user``) and jobs (``by=job``).
- **Size**: the ``MAX_SERIES - 1`` series that held most, the rest summed
  into one named ``(other)`` per kind.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from gpupool.service.actor import Actor
from gpupool.service.membership import is_member
from gpupool.service.store import ProjectRecord, Store
from gpupool.service.use_history import SAMPLED, UseHistory
from gpupool.wire.errors import InvalidRequest

BY = ("project", "user", "job")
DEFAULT_RANGE_S = 3600.0
MAX_POINTS = 360
"""Buckets the range's span is cut into at most; a series has one more when the range starts mid-bucket."""
MAX_SERIES = 50
MAX_STEP_S = 366 * 86400
OTHER = "(other)"
STEPS = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value or math.isinf(value):
        raise InvalidRequest(f"{what} must be a number of seconds, not {str(value)[:40]!r}")
    return float(value)


def pick_step(span: float, res: int, asked: float | None) -> int:
    """The bucket length: ``asked`` (or the smallest of STEPS that fits) rounded up to ``res``, at most
    MAX_POINTS buckets over ``span``."""
    least = max(res, math.ceil(span / MAX_POINTS))
    if asked is None:
        step = next((s for s in STEPS if s >= least), math.ceil(least / 86400) * 86400)
    else:
        step = max(int(math.ceil(asked)), least)
    return int(math.ceil(step / res) * res)


def build_series(actor: Actor, history: UseHistory, store: Store, projects: Mapping[str, ProjectRecord],
                 since: Any = None, step: Any = None, by: Any = None, now: float | None = None) -> dict[str, Any]:
    """The reply: ``{"since", "until", "step", "by", "series": [{<by>, "kind", "t", "allocated", "measured",
    "used"}]}`` (the value lists hold one figure per bucket start in ``t``, GPUs)."""
    by = "project" if by is None else by
    if by not in BY:
        raise InvalidRequest(f"by must be one of {', '.join(BY)}, not {str(by)[:40]!r}")
    clock = time.time() if now is None else now
    start = _number(since, "since")
    start = clock - DEFAULT_RANGE_S if start is None else min(max(start, 0.0), clock)
    asked = _number(step, "step")
    if asked is not None and not 0 < asked <= MAX_STEP_S:
        raise InvalidRequest(f"step must be a number of seconds above 0 and at most {MAX_STEP_S} (a year), "
                             f"not {step!r}")
    last = history.last_sample_t
    # every sampled interval whose middle lies before the last sample's 10 s boundary is counted: the end
    until = int((clock if last is None else min(last, clock)) // history.fine_s) * history.fine_s
    # which rows hold the range depends on now (10 s rows are kept a day), not on the last sample
    res = max([r for r, _, _ in history.ranges(start, clock)] or [history.fine_s])
    bucket = pick_step(until - start, res, asked)
    first = int(start // bucket) * bucket  # the range starts with its bucket
    parts = history.ranges(first, clock)

    # one scan per resolution, summed per bucket and job (each bucket's clock row among them), then each job's
    # project, user and kind from one read of the jobs table: cheaper than joining every row to it
    per_job: dict[tuple[int, int], list[float]] = {}  # (bucket, job num) -> [alloc, measured, used]

    def add(t: int, num: int, alloc: float, measured: float, used: float) -> None:
        cell = per_job.setdefault((t, num), [0.0, 0.0, 0.0])
        cell[0] += alloc
        cell[1] += measured
        cell[2] += used

    for r, lo, hi in parts:
        for row in store.query("SELECT (t / ?) * ?, job, SUM(alloc), SUM(measured), SUM(used) FROM gpu_use "
                               "WHERE res = ? AND t >= ? AND t < ? GROUP BY 1, 2",
                               [bucket, bucket, r, max(lo, first), min(hi, until)]):
            add(int(row[0]), int(row[1]), float(row[2]), float(row[3]), float(row[4]))
    for t, num, v in history.unwritten():
        if first <= t < until:
            add(t // bucket * bucket, num, v.alloc, v.measured, v.used)

    info = _jobs(store, sorted({num for _, num in per_job if num != SAMPLED}))
    sampled: dict[int, float] = {}  # bucket -> milliseconds sampled in it (the history's clock rows)
    sums: dict[tuple[str, str], dict[int, list[float]]] = {}  # (key, kind) -> bucket -> [alloc, measured, used]
    for (t, num), c in per_job.items():
        if num == SAMPLED:
            sampled[t] = sampled.get(t, 0.0) + c[0]
            continue
        job = info.get(num)
        if job is None or not (actor.admin or by == "project" or job["user"] == actor.user):
            continue  # a job the store no longer has, or another user's
        cell = sums.setdefault((job[by], job["kind"]), {}).setdefault(t, [0.0, 0.0, 0.0])
        for k in range(3):
            cell[k] += c[k]

    if not actor.admin and by == "project":
        sums = {k: v for k, v in sums.items()
                if k[0] in projects and is_member(projects[k[0]].members, actor.user, actor.groups)}
    starts = list(range(first, until, bucket))
    seconds = [sampled[t] / 1000.0 if sampled.get(t, 0.0) > 0 else max(1.0, min(t + bucket, until) - t)
               for t in starts]
    series = [_one(by, key, kind, cells, starts, seconds) for (key, kind), cells in _capped(sums)]
    return {"since": float(first), "until": float(max(until, first)), "step": bucket, "by": by, "series": series}


def _capped(sums: dict[tuple[str, str], dict[int, list[float]]]) -> list[tuple[tuple[str, str], dict[int, list[float]]]]:
    """The MAX_SERIES series that held most (sorted by key, kind), the rest summed per kind into ``(other)``."""
    if len(sums) <= MAX_SERIES:
        return sorted(sums.items())
    ranked = sorted(sums.items(), key=lambda kv: (-sum(c[0] for c in kv[1].values()), kv[0]))
    keep = dict(ranked[:MAX_SERIES - 1])
    for (_, kind), cells in ranked[MAX_SERIES - 1:]:
        other = keep.setdefault((OTHER, kind), {})
        for t, c in cells.items():
            o = other.setdefault(t, [0.0, 0.0, 0.0])
            for i in range(3):
                o[i] += c[i]
    return sorted(keep.items())


def _one(by: str, key: str, kind: str, cells: dict[int, list[float]], starts: list[int],
         seconds: list[float]) -> dict[str, Any]:
    """One series' wire shape: mean GPUs over the seconds sampled in each bucket."""
    out: dict[str, Any] = {by if by != "job" else "job_id": key, "kind": kind, "t": starts,
                           "allocated": [], "measured": [], "used": []}
    for t, span in zip(starts, seconds, strict=True):
        c = cells.get(t, (0.0, 0.0, 0.0))
        for i, name in enumerate(("allocated", "measured", "used")):
            out[name].append(round(c[i] / 1000.0 / span, 4))
    return out


def _jobs(store: Store, nums: list[int]) -> dict[int, dict[str, str]]:
    """num -> {"project", "user", "job", "kind"} (in chunks: SQLite's parameter limit)."""
    out: dict[int, dict[str, str]] = {}
    for i in range(0, len(nums), 500):
        part = nums[i:i + 500]
        for r in store.query(f"SELECT num, id, project, user, kind FROM jobs WHERE num IN "
                             f"({', '.join('?' for _ in part)})", part):
            out[int(r[0])] = {"job": str(r[1]), "project": str(r[2]), "user": str(r[3]), "kind": str(r[4])}
    return out
