"""What is done to all of a gang's replicas at once: they wait together, they start together.

Shared by the gang phases (set-up, a gang's turn, gang reclaim), kept below
them so that none of them calls into another for it.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter

import numpy as np

from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang import Gang
from gpupool.policy.gang_nodes import group_ids
from gpupool.policy.model import TRAIN_POOL, Wait
from gpupool.policy.nodecache import for_nodes

_by_id = attrgetter("id")


def wait_all(state: CycleState, gang: Gang, why: str) -> None:
    """Every pending replica of ``gang`` waits for ``why``."""
    # one per replica, built in C (see Wait)
    state.waits.extend(map(tuple.__new__, repeat(Wait), zip(map(_by_id, gang.pending), repeat(why))))


def seat_gang(state: CycleState, gang: Gang, plan: list[tuple[str, int]], note: str) -> None:
    """Start every replica where ``plan`` says (the capacity is known to be there)."""
    ledger = state.cap.ledger
    req = gang.request
    where = ", ".join(node + (f" ×{n}" if n > 1 else "") for node, n in plan)
    text = (f"as one of the {gang.size} replicas of {gang.text}, all started together on {where}"
            + (" " + note if note else ""))
    replicas = iter(gang.pending)
    for node, n in plan:
        for _ in range(n):
            a = ledger.assign_on(node, req)
            assert a is not None, "the gang's plan counted room that is not there"
            state.start(next(replicas), req, a, text)  # (commits: the next replica sees the room taken)


def gang_groups(state: CycleState) -> np.ndarray:
    """The train pool's node groups as small ids, in its node order (kept with the node list)."""
    return for_nodes("gang groups", state.cap.states[TRAIN_POOL].nodes, group_ids)
