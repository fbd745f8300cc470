"""Where a multi-node gang's replicas go: pure functions over per-node room.

The gang planner (:mod:`gpupool.policy.gangs`) asks placement how many
replicas fit on each node (:meth:`~gpupool.policy.placement.FreeState.replicas_fit`,
one vectorised pass) and then picks nodes here: as few as possible, packed
before spread, inside one node group (a rack) when one can hold every
replica, so the replicas' collective traffic stays short. Reclaim asks the
per-node ledger the same question node by node (:func:`ledger_room`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Node, Request

if TYPE_CHECKING:
    from gpupool.policy.capacity import Ledger


def group_ids(nodes: tuple[Node, ...]) -> np.ndarray:
    """Per node, a small id of its node group (nodes without a group share one)."""
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(n.group, len(ids)) for n in nodes], dtype=np.int64).reshape(len(nodes))


def _pick(cands: np.ndarray, room: np.ndarray, need: int, whole: np.ndarray) -> list[tuple[int, int]]:
    """Nodes for ``need`` replicas among ``cands`` (their room adds up to at least ``need``).

    Largest room first (packing replicas onto a node before spreading, so
    the fewest nodes); the last node is the one with the least room that
    still holds what is left (best fit keeps roomier nodes whole). Ties: fewer
    whole free GPUs, then node order.
    """
    order = sorted(cands.tolist(), key=lambda i: (-int(room[i]), int(whole[i]), i))
    picks: list[tuple[int, int]] = []
    left = need
    taken: set[int] = set()
    for i in order:
        if left <= 0:
            break
        if i in taken:
            continue
        fitting = [j for j in order if j not in taken and room[j] >= left]
        if fitting:
            j = min(fitting, key=lambda j: (int(room[j]), int(whole[j]), j))
            picks.append((j, left))
            return picks
        taken.add(i)
        picks.append((i, int(room[i])))
        left -= int(room[i])
    return picks


def choose_nodes(room: np.ndarray, size: int, groups: np.ndarray, whole: np.ndarray) -> list[tuple[int, int]] | None:
    """Where ``size`` replicas go: [(node index, replicas there)], or None when they do not all fit.

    ``room``: replicas that fit per node now. One node group that holds
    them all is preferred (the one needing the fewest nodes, then the least
    room left over, then the lowest group id); otherwise groups are filled
    roomiest first. Deterministic: ties go by index.
    """
    cands = np.flatnonzero(room > 0)
    if int(room[cands].sum()) < size:
        return None
    by_group: dict[int, np.ndarray] = {}
    for g in np.unique(groups[cands]).tolist():
        by_group[g] = cands[groups[cands] == g]
    best: tuple[int, int, int, list[tuple[int, int]]] | None = None
    picks: list[tuple[int, int]]
    for g, members in by_group.items():
        total = int(room[members].sum())
        if total < size:
            continue
        picks = _pick(members, room, size, whole)
        spare = sum(int(room[i]) for i, _ in picks) - size
        key = (len(picks), spare, g, picks)
        if best is None or key[:3] < best[:3]:
            best = key
    if best is not None:
        return best[3]
    picks = []
    left = size
    for g in sorted(by_group, key=lambda g: (-int(room[by_group[g]].sum()), g)):
        members = by_group[g]
        total = int(room[members].sum())
        take = _pick(members, room, min(left, total), whole)
        picks += take
        left -= sum(n for _, n in take)
        if left <= 0:
            break
    return picks


def ledger_room(ledger: Ledger, node: str, req: Request) -> int:
    """How many copies of ``req`` fit on ``node`` by the ledger (1 or 0 for a request that is not whole GPUs)."""
    if not req.gpus:
        return 1 if ledger.fits(node, req) else 0
    if not ledger.allows(node, req):
        return 0
    if req.gpu_models:
        free = ledger.gpu[node]
        whole = sum(1 for g in ledger.nodes[node].gpus
                    if g.model in req.gpu_models and free[g.id] >= g.capacity_milli > 0)
    else:
        whole = ledger.whole[node]
    room = whole // req.gpus
    if req.cpu_milli:
        room = min(room, max(ledger.cpu[node], 0) // req.cpu_milli)
    if req.memory_mib:
        room = min(room, max(ledger.mem[node], 0) // req.memory_mib)
    return max(room, 0)
