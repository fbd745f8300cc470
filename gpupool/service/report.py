"""``GET /api/v1/report``: allocated, used and idle GPU-hours per project, user or job, build and train apart.

Who sees what (the rule of docs/design.md): an admin sees everything; a user
sees their own jobs (``by=job``), their own row (``by=user``) and the totals
of the projects they may use (``by=project``: open projects and those whose
members include them), every job of such a project counted. Rows come from
:class:`gpupool.service.use_history.UseHistory`; the job's project, user and
kind from the jobs table.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpupool.service.actor import Actor
from gpupool.service.membership import is_member
from gpupool.service.store import ProjectRecord, Store
from gpupool.service.use_history import Totals, UseHistory
from gpupool.wire.errors import InvalidRequest

BY = ("project", "user", "job")
DEFAULT_SINCE_S = 30 * 86400.0
_HOUR_MILLI = 3600.0 * 1000.0  # milli-GPU-seconds in a GPU-hour


def _jobs(store: Store, nums: list[int]) -> dict[int, tuple[str, str, str, str, str]]:
    """num -> (id, name, project, user, kind), in chunks (SQLite's parameter limit)."""
    out: dict[int, tuple[str, str, str, str, str]] = {}
    for i in range(0, len(nums), 500):
        part = nums[i:i + 500]
        for r in store.query(f"SELECT num, id, name, project, user, kind FROM jobs WHERE num IN "
                             f"({', '.join('?' for _ in part)})", part):
            out[int(r[0])] = (str(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]))
    return out


def _figures(t: Totals) -> dict[str, Any]:
    """The wire figures of one row: GPU-hours, efficiency (used over measured; None when nothing was measured)."""
    return {
        "allocated_gpu_hours": round(t.alloc / _HOUR_MILLI, 6),
        "used_gpu_hours": round(t.used / _HOUR_MILLI, 6),
        "idle_gpu_hours": round(max(0.0, t.measured - t.used) / _HOUR_MILLI, 6),
        "unmeasured_gpu_hours": round(max(0.0, t.alloc - t.measured) / _HOUR_MILLI, 6),
        "efficiency": round(t.used / t.measured, 4) if t.measured > 0 else None,
        "peak_memory": t.peak_mem,
    }


def check_query(since: Any, by: Any, now: float) -> tuple[float, str]:
    """``since`` (Unix seconds; default 30 days ago) and ``by`` (default project), or a 400 saying why."""
    if by is None:
        by = "project"
    if by not in BY:
        raise InvalidRequest(f"by must be one of {', '.join(BY)}, not {str(by)[:40]!r}")
    if since is None:
        return now - DEFAULT_SINCE_S, by
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not since == since:
        raise InvalidRequest("since must be a time in Unix seconds")
    return min(max(float(since), 0.0), now), by  # before 1970 nothing was recorded (and SQLite's ints end)


def build_report(actor: Actor, history: UseHistory, store: Store, projects: Mapping[str, ProjectRecord],
                 since: Any = None, by: Any = None, now: float | None = None) -> dict[str, Any]:
    """The report's reply: ``{"since", "until", "by", "rows": [...]}``, rows sorted by their key, then kind."""
    until = time.time() if now is None else now
    start, by = check_query(since, by, until)
    totals = history.totals(start, until)
    info = _jobs(store, sorted(totals))

    def visible(project: str, user: str) -> bool:
        if actor.admin:
            return True
        if by == "project":
            p = projects.get(project)
            return p is not None and is_member(p.members, actor.user, actor.groups)
        return user == actor.user

    grouped: dict[tuple[str, str], Totals] = {}
    about: dict[tuple[str, str], dict[str, str]] = {}  # by job: its name, project and user
    for num, t in totals.items():
        if num not in info:
            continue  # a job the store no longer has
        job_id, name, project, user, kind = info[num]
        if not visible(project, user):
            continue
        key = {"project": (project, kind), "user": (user, kind), "job": (job_id, kind)}[by]
        grouped.setdefault(key, Totals()).add(t.alloc, t.measured, t.used, t.peak_mem)
        if by == "job":
            about[key] = {"name": name, "project": project, "user": user}
    rows = []
    for key, total in sorted(grouped.items(), key=lambda kv: kv[0]):
        row: dict[str, Any] = {by if by != "job" else "job_id": key[0], "kind": key[1]}
        row.update(about.get(key, {}))
        row.update(_figures(total))
        rows.append(row)
    return {"since": start, "until": until, "by": by, "rows": rows}
