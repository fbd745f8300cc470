"""Where a request could fit, node by node: the pool-wide questions besides finding it a place.

:meth:`~gpupool.policy.placement.FreeState.find` answers "where does this go
now" on the hot path, with every shortcut. The engine also asks questions over
the whole pool that ``find`` does not: which nodes would hold it (now, or were
they empty: whether it could ever fit), which node is nearest to holding it
(the starvation rule reserves that one), how many replicas of a gang each node
takes. They are answered here, plainly, over every node; ``find`` shares only
the per-GPU fit test (:func:`gpu_ok`) with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpupool.policy.model import Request

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


def need_per_gpu(st: FreeState, request: Request) -> np.ndarray | int:
    """Milli a fractional/memory request takes on each GPU (memory: per GPU size)."""
    if request.gpu_memory_mib:
        need = -(-request.gpu_memory_mib * 1000 // st.gpu_mem)
        # (a GPU that reports no memory size never holds a memory request)
        return np.where((need <= st.cap) & st.has_memory, need, np.iinfo(np.int64).max)
    return request.gpu_milli


def gpu_ok(st: FreeState, request: Request, free: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, Any]:
    """(usable GPU slots, node mask) for a GPU request on the given free matrix."""
    if request.gpus:
        ok = (free == cap) & st.whole_slot
        if request.gpu_models:
            ok &= st.model_mask(request.gpu_models)
        return ok, ok.sum(axis=1) >= request.gpus
    ok = free >= need_per_gpu(st, request)
    ok &= st.valid
    if request.gpu_models:
        ok &= st.model_mask(request.gpu_models)
    return ok, ok.any(axis=1)


def rows_fitting(st: FreeState, request: Request, empty: bool, ruled: bool = True) -> np.ndarray:
    """Per node, whether ``request`` fits (``empty``: were the node empty); ``ruled``: where its rules allow.

    The plain, unhurried form of ``find``'s test: for answers kept per
    shape (whether it could ever fit, why it cannot), not for the hot path.
    """
    if empty:
        free, cpu, mem = st.cap, st.cpu_total, st.mem_total
    else:
        free, cpu, mem = st.free, st.cpu_free, st.mem_free
    mask = (cpu >= request.cpu_milli) & (mem >= request.memory_mib)
    if request.gpus or request.gpu_milli or request.gpu_memory_mib:
        _, gmask = gpu_ok(st, request, free, st.cap)
        mask &= gmask
    allowed = st.allowed(request) if ruled else None
    if allowed is not None:
        mask &= allowed
    return mask


def closest(st: FreeState, request: Request, skip: Iterable[str] = ()) -> str | None:
    """The node nearest to holding a GPU ``request`` now, among those that would hold it empty.

    Nearest: most whole free GPUs of an allowed model (for a fraction or a
    memory request: the largest free share on one), then the most free CPU,
    then memory; ties by node order. Nodes in ``skip`` are left out. The
    starvation rule reserves this node for a job that waited too long.
    """
    allowed = st.valid
    if request.gpu_models:
        allowed = allowed & st.model_mask(request.gpu_models)
    if request.gpu_memory_mib:
        allowed = allowed & st.has_memory
    ok = (st.cpu_total >= request.cpu_milli) & (st.mem_total >= request.memory_mib)
    if request.gpus:
        whole = allowed & st.whole_slot
        ok &= whole.sum(axis=1) >= request.gpus
        score = ((st.free >= st.cap) & whole).sum(axis=1)
    else:
        need = need_per_gpu(st, request)
        ok &= (allowed & (st.cap >= need) & (st.cap > 0)).any(axis=1)
        # the largest free share on an allowed GPU, over-full ones (below 0) included
        score = np.where(allowed, st.free, np.iinfo(np.int64).min).max(axis=1) if len(ok) else ok
    for name in skip:
        i = st.node_index.get(name)
        if i is not None:
            ok[i] = False
    ruled = st.allowed(request)
    if ruled is not None:
        ok &= ruled
    idx = np.flatnonzero(ok)
    if not len(idx):
        return None
    best = np.lexsort((-idx, st.mem_free[idx], st.cpu_free[idx], score[idx]))[-1]
    return st.names[int(idx[best])]


def replicas_fit(st: FreeState, request: Request, empty: bool = False) -> np.ndarray:
    """Per node, how many copies of a whole-GPU ``request`` fit now (``empty``: on the node were it empty).

    A multi-node gang's replicas may share a node; this is what the gang
    planner (:mod:`gpupool.policy.gangs`) spreads them over, in one
    vectorised pass instead of one ``find`` per replica and node.
    """
    if empty:
        free, cpu, mem = st.cap, st.cpu_total, st.mem_total
    else:
        free, cpu, mem = st.free, st.cpu_free, st.mem_free
    if request.gpu_models or empty:
        ok = (free >= st.cap) & st.whole_slot
        if request.gpu_models:
            ok &= st.model_mask(request.gpu_models)
        whole = ok.sum(axis=1)
    else:
        whole = st.whole_free
    room = whole // max(request.gpus, 1)
    if request.cpu_milli:
        room = np.minimum(room, np.maximum(cpu, 0) // request.cpu_milli)
    if request.memory_mib:
        room = np.minimum(room, np.maximum(mem, 0) // request.memory_mib)
    allowed = st.allowed(request)
    if allowed is not None:
        room = np.where(allowed, room, 0)
    return np.maximum(room, 0)
