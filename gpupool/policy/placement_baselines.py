"""The FGD paper's simple baselines: ``firstfit`` and ``bestfit``.

Kept for comparison (``bench/packing.py`` measures ``default`` against them
and against the published figures), not for production: neither looks at what
the coming work could still use.

``bestfit``
    Node score ``int(100 * (1 - (0.5 * cpu_after / 128000 + 0.5 * gpu_after / 8000)))``,
    highest wins, ties by tie order; a fraction goes on the fitting GPU with the least free share.
``firstfit``
    The first node in tie order that fits; lowest-index GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request
from gpupool.policy.placement_slots import slots_on

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState

# BestFit's normalisers are the paper's (the largest openb node: 128 cores, 8 GPUs).
_BESTFIT_CPU = 128_000.0
_BESTFIT_GPU = 8_000.0


def choose_firstfit(st: FreeState, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
    """(node, GPU slots): the first candidate in tie order (``ok``: usable slots per candidate, or None)."""
    k = int(np.argmin(st.tie_rank[cand]))
    return int(cand[k]), slots_on(st, int(cand[k]), ok[k] if ok is not None else None, request)


def choose_bestfit(st: FreeState, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
    """(node, GPU slots): the candidate BestFit scores highest (``ok``: usable slots per candidate, or None)."""
    gpu_take = request.gpus * 1000 if request.gpus else request.gpu_milli
    if request.gpu_memory_mib:
        gpu_take = 0  # per-GPU; BestFit is defined for milli requests, score as if free
    gpu_after = np.where(st.valid[cand], st.free[cand], 0).sum(axis=1) - gpu_take
    cpu_after = st.cpu_free[cand] - request.cpu_milli
    score = (100.0 * (1.0 - (0.5 * cpu_after / _BESTFIT_CPU + 0.5 * gpu_after / _BESTFIT_GPU))).astype(np.int64)
    order = np.lexsort((st.tie_rank[cand], -score))
    k = int(order[0])
    i = int(cand[k])
    return i, slots_on(st, i, ok[k] if ok is not None else None, request, least_free=True)
