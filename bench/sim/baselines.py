"""The two baselines, written as ``schedule(snapshot) -> Decisions`` like the engine.

Both place a gang on the fitting node with the fewest free GPUs (best fit, ties
by node order) and give it the lowest-index free GPUs there; neither ever
pauses a job. Both depend on the snapshot's state only, not on its clock, so
the simulator may skip their cycles when nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.model import MILLI, Assignment, Decisions, Snapshot, Start, Workload

ScheduleFn = Callable[[Snapshot], Decisions]


def _free_gpus(snapshot: Snapshot, nodes: set[str] | None = None) -> dict[str, list[str]]:
    """Node name -> free GPU ids in index order (only ``nodes`` when given)."""
    used = {gpu_id for w in snapshot.workloads if w.assignment for gpu_id, _ in w.assignment.gpus}
    return {
        node.name: [g.id for g in sorted(node.gpus, key=lambda g: g.index) if g.id not in used]
        for node in snapshot.nodes
        if nodes is None or node.name in nodes
    }


def _best_fit(free: dict[str, list[str]], need: int) -> str | None:
    best: str | None = None
    for name, gpus in free.items():
        if len(gpus) >= need and (best is None or len(gpus) < len(free[best])):
            best = name
    return best


def _fifo(
    pending: list[Workload], free: dict[str, list[str]], backfill: bool, reason: str
) -> list[Start]:
    """Start pending jobs in submission order; strict FIFO stops at the first that does not fit."""
    starts: list[Start] = []
    total_free = sum(len(g) for g in free.values())
    for w in pending:
        if total_free == 0:
            break
        need = w.request.gpus
        node = _best_fit(free, need)
        if node is None:
            if backfill:
                continue
            break
        taken, free[node] = free[node][:need], free[node][need:]
        total_free -= need
        starts.append(Start(w.id, Assignment(node, tuple((g, MILLI) for g in taken)), False, reason))
    return starts


def _pending_in_order(snapshot: Snapshot) -> list[Workload]:
    return sorted((w for w in snapshot.workloads if not w.running), key=lambda w: (w.submitted_at, w.id))


def pooled_fifo(backfill: bool) -> ScheduleFn:
    """One queue for everybody, no quotas: strict FIFO, or FIFO that lets later jobs fill holes."""
    reason = "pooled FIFO with backfill" if backfill else "pooled strict FIFO"

    def schedule(snapshot: Snapshot) -> Decisions:
        free = _free_gpus(snapshot)
        return Decisions(starts=tuple(_fifo(_pending_in_order(snapshot), free, backfill, reason)))

    return schedule


def static_partitions(owner: dict[str, str], backfill: bool) -> ScheduleFn:
    """Each team runs only on its own nodes (``owner``: node -> team), FIFO within its partition."""
    teams_nodes: dict[str, set[str]] = {}
    for node, team in owner.items():
        teams_nodes.setdefault(team, set()).add(node)
    reason = "static partition FIFO" + (" with backfill" if backfill else "")

    def schedule(snapshot: Snapshot) -> Decisions:
        by_team: dict[str, list[Workload]] = {}
        for w in _pending_in_order(snapshot):
            by_team.setdefault(w.project, []).append(w)
        if not by_team:
            return Decisions()
        free_all = _free_gpus(snapshot)
        starts: list[Start] = []
        for team in sorted(by_team):
            nodes = teams_nodes.get(team, set())
            free = {n: g for n, g in free_all.items() if n in nodes}
            starts.extend(_fifo(by_team[team], free, backfill, reason))
        return Decisions(starts=tuple(starts))

    return schedule
