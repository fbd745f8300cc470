"""Which GPUs of the chosen node a request gets, and the assignment that names them.

Every policy first picks a node (and, for a fraction, the scorers pick the GPU
too); seating the request on that node is the same for all of them: whole GPUs
inside one topology group when one has room, a fraction on the first (or, for
``bestfit``, the fullest) GPU that holds it, and the milli-GPU each GPU gives.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Assignment, Request

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


def whole_usable(st: FreeState, i: int, request: Request) -> np.ndarray:
    """Slots of node ``i`` wholly free (and of an allowed model) for whole-GPU work."""
    ok = (st.free[i] == st.cap[i]) & st.whole_slot[i]
    if request.gpu_models:
        ok &= st.model_mask(request.gpu_models)[i]
    return np.flatnonzero(ok)


def whole_slots(st: FreeState, i: int, usable: np.ndarray, n: int) -> list[int]:
    """``n`` whole free GPUs on node ``i``: inside one topology group when one has room.

    Among groups that can hold the request the one with the fewest free GPUs is
    used (it keeps larger groups intact); else GPUs come from the fullest-free
    groups first. Within a group, lowest slot first.
    """
    if n == 1 or st.max_groups <= 1:
        return [int(s) for s in usable[:n]]
    by_group: dict[int, list[int]] = {}
    for s in usable:
        by_group.setdefault(int(st.topo_id[i, s]), []).append(int(s))
    fitting = [g for g, slots in by_group.items() if len(slots) >= n]
    if fitting:
        g = min(fitting, key=lambda x: (len(by_group[x]), by_group[x][0]))
        return by_group[g][:n]
    groups = sorted(by_group.values(), key=lambda slots: (-len(slots), slots[0]))
    picked = [s for slots in groups for s in slots][:n]
    return sorted(picked)


def slots_on(st: FreeState, i: int, ok_row: np.ndarray | None, request: Request, least_free: bool = False) -> list[int]:
    """GPU slots on node ``i`` for the request (empty for CPU-only work).

    ``ok_row``: the node's usable slots (None: any wholly free GPU, or CPU-only
    work); ``least_free``: a fraction goes on the usable GPU with the least free share.
    """
    if request.gpus:
        usable = np.flatnonzero(ok_row) if ok_row is not None else whole_usable(st, i, request)
        return whole_slots(st, i, usable, request.gpus)
    if ok_row is None:
        return []
    usable = np.flatnonzero(ok_row)
    if least_free:
        free = st.free[i, usable]
        return [int(usable[int(np.argmin(free))])]
    return [int(usable[0])]


def assignment_on(st: FreeState, i: int, slots: list[int], request: Request) -> Assignment:
    """The assignment of ``request`` to GPU ``slots`` of node ``i``: each GPU's id and the milli-GPU it gives."""
    gpus = []
    for s in slots:
        if request.gpus:
            milli = int(st.cap[i, s])
        elif request.gpu_memory_mib:
            milli = math.ceil(request.gpu_memory_mib * 1000 / int(st.gpu_mem[i, s]))
        else:
            milli = request.gpu_milli
        gpus.append((st.gpu_ids[i][s], milli))
    return Assignment(node=st.names[i], gpus=tuple(gpus))
