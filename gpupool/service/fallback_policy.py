"""A plain first-fit policy, used only for a cycle where the policy engine fails.

Same signature as :func:`gpupool.policy.schedule` (Snapshot -> Decisions) so
the service can fall back to it if the engine raises (or fails to import). It never preempts: pending work, highest
priority then oldest first, takes the first GPUs with room; build work is
held to its project's fixed quota and train work to its limit.
"""

from __future__ import annotations

from gpupool.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Kind,
    Reject,
    Snapshot,
    Start,
    Wait,
    Workload,
)
from gpupool.policy.node_rules import allows


def _milli_for(w: Workload, memory_mib: int) -> int:
    req = w.request
    if req.gpu_milli:
        return req.gpu_milli
    if req.gpu_memory_mib:
        return min(MILLI, -(-req.gpu_memory_mib * MILLI // max(1, memory_mib)))
    return 0


def schedule(snapshot: Snapshot) -> Decisions:
    """First-fit over the snapshot; see the module docstring."""
    used: dict[str, int] = {}
    usage: dict[tuple[str, Kind], int] = {}
    for w in snapshot.workloads:
        if w.assignment is not None:
            for gid, m in w.assignment.gpus:
                used[gid] = used.get(gid, 0) + m
            usage[(w.project, w.kind)] = usage.get((w.project, w.kind), 0) + w.assignment.total_milli
    projects = {p.name: p for p in snapshot.projects}
    starts: list[Start] = []
    rejects: list[Reject] = []
    waits: list[Wait] = []
    pending = sorted((w for w in snapshot.workloads if w.assignment is None), key=lambda w: (-w.priority, w.submitted_at, w.id))
    for w in pending:
        proj = projects.get(w.project)
        if proj is None:
            rejects.append(Reject(w.id, f"project {w.project!r} no longer exists"))
            continue
        pool = BUILD_POOL if w.kind is Kind.BUILD else TRAIN_POOL
        placed: Assignment | None = None
        for node in snapshot.nodes:
            if pool not in node.pools:
                continue
            if (w.request.rules is not None or node.taints) and not allows(w.request.rules, dict(node.labels),
                                                                           node.taints):
                continue  # its nodeSelector, affinity or a taint it does not tolerate keeps it off this node
            gpus = [g for g in node.gpus if not w.request.gpu_models or g.model in w.request.gpu_models]
            if w.request.gpus:
                free = [g for g in gpus if used.get(g.id, 0) == 0 and g.capacity_milli > 0]
                if len(free) >= w.request.gpus:
                    placed = Assignment(node.name, tuple((g.id, g.capacity_milli) for g in free[: w.request.gpus]))
            elif w.request.gpu_milli or w.request.gpu_memory_mib:
                for g in gpus:
                    m = _milli_for(w, g.memory_mib)
                    if used.get(g.id, 0) + m <= g.capacity_milli:
                        placed = Assignment(node.name, ((g.id, m),))
                        break
            else:
                placed = Assignment(node.name, ())
            if placed is not None:
                break
        if placed is None:
            waits.append(Wait(w.id, "waiting for free GPUs"))
            continue
        key = (w.project, w.kind)
        total = usage.get(key, 0) + placed.total_milli
        if w.kind is Kind.BUILD and total > proj.build_quota_milli:
            waits.append(Wait(w.id, f"project {w.project!r} build quota is in use"))
            continue
        if w.kind is Kind.TRAIN and proj.train_limit_milli is not None and total > proj.train_limit_milli:
            waits.append(Wait(w.id, f"project {w.project!r} is at its training limit"))
            continue
        for gid, m in placed.gpus:
            used[gid] = used.get(gid, 0) + m
        usage[key] = total
        preemptible = w.kind is Kind.TRAIN and total > proj.train_guarantee_milli
        starts.append(Start(w.id, placed, preemptible, "started (first-fit fallback policy)"))
    over: list[str] = []
    acc: dict[str, int] = {}
    running = sorted((w for w in snapshot.workloads if w.assignment is not None and w.kind is Kind.TRAIN),
                     key=lambda w: (w.started_at or 0.0, w.id))
    for w in running:
        assert w.assignment is not None
        acc[w.project] = acc.get(w.project, 0) + w.assignment.total_milli
        proj = projects.get(w.project)
        if proj is not None and acc[w.project] > proj.train_guarantee_milli:
            over.append(w.id)
    return Decisions(starts=tuple(starts), rejects=tuple(rejects), waits=tuple(waits), preemptible=tuple(sorted(over)))
