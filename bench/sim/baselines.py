"""The two baselines, written as ``schedule(snapshot) -> Decisions`` like the engine.

Both place a job on the fitting node with the fewest free GPUs (best fit, ties
by node order) and give it the lowest-index free GPUs there; neither ever
pauses a job. A multi-node gang (replicas linked by ``Workload.gang``) is one
unit in the queue: all its replicas start in one cycle or none does, inside
one rack when one can hold them (``_gang_plan``). A unit that could not start
even on empty nodes (the whole cluster, or for static partitions the team's
own nodes) is refused with a ``Reject`` rather than left waiting forever.
Both depend on the snapshot's state only, not on its clock, so the simulator
may skip their cycles when nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.policy.model import MILLI, Assignment, Decisions, Reject, Snapshot, Start, Workload

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


def _gang_plan(free: dict[str, list[str]], need: int, replicas: int, group_of: dict[str, str]) -> list[str] | None:
    """A node per replica (``need`` GPUs each), all or nothing: inside one rack when one can hold them all.

    Among the racks that can, the one with the fewest free GPUs (best fit at
    rack level, ties by node order); inside it, and across racks when no
    rack can, each replica goes to the fitting node with the fewest free
    GPUs, as a single job would.
    """
    room = {name: len(gpus) for name, gpus in free.items()}
    groups: dict[str, list[str]] = {}
    for name in room:
        groups.setdefault(group_of.get(name, ""), []).append(name)
    fitting = [g for g, names in groups.items() if sum(room[n] // need for n in names) >= replicas]
    if fitting:
        group = min(fitting, key=lambda g: sum(room[n] for n in groups[g]))  # min keeps the first on ties
        names = groups[group]
    elif sum(r // need for r in room.values()) >= replicas:
        names = list(room)
    else:
        return None
    local = {n: room[n] for n in names}
    plan: list[str] = []
    for _ in range(replicas):
        node = min((n for n in names if local[n] >= need), key=lambda n: local[n])
        local[node] -= need
        plan.append(node)
    return plan


def _units(pending: list[Workload]) -> list[list[Workload]]:
    """Pending work as units in queue order: a job, or every replica of a gang at its first replica's place."""
    units: dict[tuple[str, str], list[Workload]] = {}
    for w in pending:
        units.setdefault(("gang", w.gang) if w.gang else ("job", w.id), []).append(w)
    return list(units.values())


def _never_fits(unit: list[Workload], sizes: list[int]) -> bool:
    """Whether the unit could not start even on these nodes empty (``sizes``: their GPU counts)."""
    need = unit[0].request.gpus
    replicas = max(len(unit), unit[0].gang_size)
    return sum(size // need for size in sizes) < replicas if need else False


def _refuse(units: list[list[Workload]], sizes: list[int], scope: str) -> tuple[list[list[Workload]], list[Reject]]:
    """Split off the units that can never start on ``sizes`` (every replica refused, with the reason)."""
    kept: list[list[Workload]] = []
    rejects: list[Reject] = []
    for unit in units:
        if not _never_fits(unit, sizes):
            kept.append(unit)
            continue
        w = unit[0]
        shape = f"{max(len(unit), w.gang_size)} x {w.request.gpus} GPUs" if w.gang else f"{w.request.gpus} GPUs"
        why = (f"{shape} can never start on {scope} ({sum(sizes)} GPUs on {len(sizes)} nodes, "
               f"largest {max(sizes, default=0)})")
        rejects.extend(Reject(r.id, why) for r in unit)
    return kept, rejects


def _fifo(
    units: list[list[Workload]], free: dict[str, list[str]], backfill: bool, reason: str,
    group_of: dict[str, str],
) -> list[Start]:
    """Start pending units in submission order; strict FIFO stops at the first that does not fit."""
    starts: list[Start] = []
    total_free = sum(len(g) for g in free.values())
    for unit in units:
        if total_free == 0:
            break
        w = unit[0]
        need = w.request.gpus
        if not w.gang:
            node = _best_fit(free, need)
            if node is None:
                if backfill:
                    continue
                break
            taken, free[node] = free[node][:need], free[node][need:]
            total_free -= need
            starts.append(Start(w.id, Assignment(node, tuple((g, MILLI) for g in taken)), False, reason))
            continue
        plan = _gang_plan(free, need, len(unit), group_of) if len(unit) >= w.gang_size else None
        if plan is None:
            if backfill:
                continue
            break
        for replica, node in zip(unit, plan, strict=True):
            taken, free[node] = free[node][:need], free[node][need:]
            total_free -= need
            starts.append(Start(replica.id, Assignment(node, tuple((g, MILLI) for g in taken)), False,
                                f"{reason} (gang {w.gang}, all {len(unit)} replicas together)"))
    return starts


def _pending_in_order(snapshot: Snapshot) -> list[Workload]:
    return sorted((w for w in snapshot.workloads if not w.running), key=lambda w: (w.submitted_at, w.id))


def pooled_fifo(backfill: bool) -> ScheduleFn:
    """One queue for everybody, no quotas: strict FIFO, or FIFO that lets later jobs fill holes."""
    reason = "pooled FIFO with backfill" if backfill else "pooled strict FIFO"

    def schedule(snapshot: Snapshot) -> Decisions:
        free = _free_gpus(snapshot)
        sizes = [len(n.gpus) for n in snapshot.nodes]
        units, rejects = _refuse(_units(_pending_in_order(snapshot)), sizes, "the cluster")
        group_of = {n.name: n.group for n in snapshot.nodes}
        return Decisions(starts=tuple(_fifo(units, free, backfill, reason, group_of)), rejects=tuple(rejects))

    return schedule


def static_partitions(owner: dict[str, str], backfill: bool) -> ScheduleFn:
    """Each team runs only on its own nodes (``owner``: node -> team), FIFO within its partition.

    A job wider than its team's whole partition can never run here: it is
    refused (``Reject``, saying so), and the replay reports it as never run.
    """
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
        group_of = {n.name: n.group for n in snapshot.nodes}
        starts: list[Start] = []
        rejects: list[Reject] = []
        for team in sorted(by_team):
            nodes = teams_nodes.get(team, set())
            sizes = [len(n.gpus) for n in snapshot.nodes if n.name in nodes]
            units, refused = _refuse(_units(by_team[team]), sizes, f"team {team}'s partition")
            rejects.extend(refused)
            free = {n: g for n, g in free_all.items() if n in nodes}
            starts.extend(_fifo(units, free, backfill, reason, group_of))
        return Decisions(starts=tuple(starts), rejects=tuple(rejects))

    return schedule
