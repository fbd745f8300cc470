"""Conversions between stored records, policy workloads and wire JSON.

Three views of one job: the :class:`~gpupool.service.store.JobRecord` (what is
durable), the policy :class:`~gpupool.policy.Workload` (what the engine
needs, in milli-GPU and MiB), and the wire Job of docs/design.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gpupool.policy import reasons as txt
from gpupool.policy.model import MILLI, Assignment, Kind, Request, Workload
from gpupool.service.placement_rules import rules_of
from gpupool.service.store import JobRecord, ProjectRecord

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
        rules_of(r),  # None unless it sets placement fields
    )
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= _INTERN_MAX:
            _INTERNED.clear()
        gpus, milli, gpu_memory_mib, model, cpu_milli, memory_mib, rules = key
        found = _INTERNED[key] = Request(
            gpus=gpus, gpu_milli=milli, gpu_memory_mib=gpu_memory_mib,
            gpu_models=frozenset({model}) if model else frozenset(), cpu_milli=cpu_milli, memory_mib=memory_mib,
            rules=rules,
        )
    return found


def assignment_of(rec: JobRecord) -> Assignment | None:
    if rec.state != "running" or rec.assignment is None:
        return None
    return Assignment(rec.assignment["node"], tuple((g["id"], int(g["milli"])) for g in rec.assignment.get("gpus", [])))


def replica_id(job_id: str, rank: int) -> str:
    """The policy workload id of a gang's replica: ``"<job id>/<rank>"`` (job ids never hold a ``/``)."""
    return f"{job_id}/{rank}"


def split_workload_id(workload_id: str) -> tuple[str, int | None]:
    """``"j-000007/1"`` -> ``("j-000007", 1)``; a plain job's id -> ``(id, None)``."""
    job_id, slash, rank = workload_id.partition("/")
    if slash and rank.isdigit():
        return job_id, int(rank)
    return workload_id, None


def replica_assignments(rec: JobRecord) -> list[dict[str, Any]]:
    """A running gang's per-replica wire assignments (``{"rank", "node", "gpus"}``), rank order; [] otherwise."""
    return list((rec.assignment or {}).get("replicas", [])) if rec.state == "running" else []


_GANG_START = re.compile(r"^starts on (?P<node>\S+) (?P<why>.*) as one of the \d+ replicas of gang (?P<gang>\S+) of "
                         r"(?P<size>.+), all started together on (?P<nodes>.+)$")


def job_reason(rec: JobRecord, reason: str) -> str:
    """A replica's policy reason as the job's own.

    The policy speaks of one replica ("starts on node-a ... as one of the 2
    replicas of gang j-000007 of 2 × 8 GPUs, all started together on node-a,
    node-b"; "gang j-000007 of 2 × 8 GPUs: only 1 node has room ..."); the
    job is the whole gang, so its reason names the size and every node:
    "starts 2 × 8 GPUs together on node-a, node-b ...", "2 × 8 GPUs: only 1
    node has room ...".
    """
    if rec.replicas <= 1:
        return reason
    m = _GANG_START.match(reason)
    if m is not None and m["gang"] == rec.id:
        return f"starts {m['size']} together on {m['nodes']} {m['why']}"
    return reason.replace(f"gang {rec.id} of ", "")


_RESUMED = re.compile(r"^resumed \(attempt \d+\): ")


def flag_reason(rec: JobRecord, preemptible: bool, guarantee_milli: int, project_milli: int) -> str:
    """A running training job's reason once its preemptible flag flipped, ``preemptible`` being the new flag.

    Why it is rewritten: the reason of a start says whether the job runs
    within its project's guarantee or "as preemptible" on idle GPUs, and the
    flag changes while it runs (the project's other jobs end, the admin
    changes the guarantee, a job of higher priority starts); ``describe``
    must not keep "as preemptible" once the job can no longer be paused for
    another project, nor the other way round. ``project_milli``: what the
    project's running training jobs hold now. A resumed job keeps its
    "resumed (attempt N): " prefix.
    """
    m = _RESUMED.match(rec.reason)
    prefix = m.group(0) if m else ""
    nodes = ", ".join(dict.fromkeys(str(r.get("node")) for r in (rec.assignment or {}).get("replicas", []))) \
        or str((rec.assignment or {}).get("node"))
    used, guarantee = txt.gpus(project_milli), txt.gpus(guarantee_milli)
    if preemptible:
        return (f"{prefix}runs on {nodes} as preemptible: project {rec.project} runs {used} of training, over its "
                f"guarantee of {guarantee}; this job is beyond the guarantee and may be paused to make room")
    return (f"{prefix}runs on {nodes} within project {rec.project}'s guarantee of {guarantee} (the project runs "
            f"{used} of training); no longer preemptible")


def workloads_of(rec: JobRecord) -> tuple[Workload, ...]:
    """The engine's view of a job: one workload, or one per replica for a multi-node gang.

    A gang's replicas share the job's request (per replica), priority,
    times and attempts, and are linked by ``gang`` (the job id) and
    ``gang_size``; a running gang's replica ``k`` has replica ``k``'s
    one-node assignment from the stored Job assignment.
    """
    w = workload_of(rec)
    if rec.replicas <= 1:
        return (w,)
    placed = {int(r["rank"]): r for r in replica_assignments(rec)}
    out = []
    for k in range(rec.replicas):
        a = None
        if w.assignment is not None and k in placed:
            r = placed[k]
            a = Assignment(r["node"], tuple((g["id"], int(g["milli"])) for g in r.get("gpus", [])))
        out.append(dataclasses.replace(w, id=replica_id(rec.id, k), assignment=a,
                                       started_at=w.started_at if a is not None else None,
                                       gang=rec.id, gang_size=rec.replicas))
    return tuple(out)


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
        "state": rec.state, "request": {**rec.request, "replicas": rec.replicas}, "priority": rec.priority,
        "submitted_at": rec.submitted_at, "started_at": rec.started_at, "finished_at": rec.finished_at,
        "attempts": rec.attempts, "preemptible": rec.preemptible, "reason": rec.reason,
        "assignment": rec.assignment if rec.state == "running" else None,
        "ran_on": rec.last_assignment if rec.state != "running" else None,
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


def project_to_wire(p: ProjectRecord, usage: dict[str, int], pending: int, paused: int = 0) -> dict[str, Any]:
    """Project JSON; ``usage`` holds milli for "build", "train" and "train_over_quota".

    ``pending``: its queued jobs; ``paused``: its paused ones, apart (as in the status's queue counts).
    """
    return {
        "name": p.name,
        "build_quota": gpus_text(p.build_quota_milli),
        "train_guarantee": gpus_text(p.train_guarantee_milli),
        "train_limit": None if p.train_limit_milli is None else gpus_text(p.train_limit_milli),
        "weight": p.weight,
        "usage": {k: gpus_text(usage.get(k, 0)) for k in ("build", "train", "train_over_quota")},
        "pending": pending,
        "paused": paused,
        "members": None if p.members is None else list(p.members),
    }
