"""Conversions between stored records, policy workloads and wire JSON.

Three views of one job: the :class:`~scheduler.store.JobRecord` (what is
durable), the policy :class:`~scheduler.policy.Workload` (what the engine
needs, in milli-GPU and MiB), and the wire Job of docs/design.md.
"""

from __future__ import annotations

from typing import Any

from scheduler.policy.model import MILLI, Assignment, Kind, Request, Workload
from scheduler.store import JobRecord, ProjectRecord

MIB = 1024 * 1024


def assigned_gpus(rec: JobRecord) -> list[dict[str, Any]]:
    """The per-GPU entries (id, milli, memory_limit...) of a job's stored assignment; [] when it has none."""
    return (rec.assignment or {}).get("gpus", [])


def held_milli(rec: JobRecord) -> int:
    """Milli-GPU a job's assignment holds, summed over its GPUs (0 with no assignment).

    One definition, so that project usage and the build-quota check count a job's
    share the same way.
    """
    return sum(int(g["milli"]) for g in assigned_gpus(rec))


def gpus_text(milli: int) -> float | int:
    """milli -> GPUs for the wire: whole numbers as ints (``2``), fractions as floats (``0.25``)."""
    return milli // MILLI if milli % MILLI == 0 else milli / MILLI


_INTERNED: dict[tuple[Any, ...], Request] = {}
_INTERN_MAX = 4096


def request_of(rec: JobRecord) -> Request:
    """The policy Request of a stored job; equal requests are one shared object.

    Queues hold many jobs asking for the same thing. Sharing the (immutable)
    Request lets the engine and placement group them by identity instead of
    hashing each one, and keeps one object per distinct request in memory.
    """
    r = rec.request
    memory = r.get("gpu_memory") or 0
    key = (
        int(r.get("gpus") or 0),
        int(round((r.get("gpu_fraction") or 0) * MILLI)),
        -(-int(memory) // MIB) if memory else 0,
        r.get("gpu_model") or None,
        int(round((r.get("cpu") or 0) * 1000)),
        -(-int(r.get("memory") or 0) // MIB),
    )
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= _INTERN_MAX:
            _INTERNED.clear()
        gpus, milli, gpu_memory_mib, model, cpu_milli, memory_mib = key
        found = _INTERNED[key] = Request(
            gpus=gpus, gpu_milli=milli, gpu_memory_mib=gpu_memory_mib,
            gpu_models=frozenset({model}) if model else frozenset(), cpu_milli=cpu_milli, memory_mib=memory_mib,
        )
    return found


def assignment_of(rec: JobRecord) -> Assignment | None:
    if rec.state != "running" or rec.assignment is None:
        return None
    return Assignment(rec.assignment["node"], tuple((g["id"], int(g["milli"])) for g in rec.assignment.get("gpus", [])))


def workload_of(rec: JobRecord) -> Workload:
    """The engine's view: a running job has an assignment; queued and paused ones are pending."""
    return Workload(
        id=rec.id,
        project=rec.project,
        kind=Kind.BUILD if rec.kind == "build" else Kind.TRAIN,
        request=request_of(rec),
        priority=rec.priority,
        submitted_at=rec.submitted_at,
        assignment=assignment_of(rec),
        started_at=rec.started_at if rec.state == "running" else None,
        attempts=rec.attempts,
        paused_at=rec.paused_at,
    )


def job_to_wire(rec: JobRecord, show_env: bool) -> dict[str, Any]:
    """The Job JSON; ``env`` only for build jobs and only when the caller may see it."""
    out: dict[str, Any] = {
        "id": rec.id, "name": rec.name, "project": rec.project, "user": rec.user, "kind": rec.kind,
        "state": rec.state, "request": dict(rec.request), "priority": rec.priority,
        "submitted_at": rec.submitted_at, "started_at": rec.started_at, "finished_at": rec.finished_at,
        "attempts": rec.attempts, "preemptible": rec.preemptible, "reason": rec.reason,
        "assignment": rec.assignment if rec.state == "running" else None,
        "exit_code": rec.exit_code, "workdir": rec.workdir, "command": rec.command,
        "labels": dict(rec.labels), "lease_expires_at": rec.lease_expires_at,
    }
    if rec.client_key is not None:
        out["client_key"] = rec.client_key
    if rec.image is not None:
        out["image"] = rec.image
    if rec.kind == "build" and show_env and rec.state == "running":
        out["env"] = dict(rec.env)
    return out


def project_to_wire(p: ProjectRecord, usage: dict[str, int], pending: int) -> dict[str, Any]:
    """Project JSON; ``usage`` holds milli for "build", "train" and "train_over_quota"."""
    return {
        "name": p.name,
        "build_quota": gpus_text(p.build_quota_milli),
        "train_guarantee": gpus_text(p.train_guarantee_milli),
        "train_limit": None if p.train_limit_milli is None else gpus_text(p.train_limit_milli),
        "weight": p.weight,
        "usage": {k: gpus_text(usage.get(k, 0)) for k in ("build", "train", "train_over_quota")},
        "pending": pending,
        "members": None if p.members is None else list(p.members),
    }
