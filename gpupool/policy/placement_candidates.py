"""Which places a scorer compares: fewer candidates, never a different answer.

A placement query may have thousands of (node, GPU) places that fit. Most are
interchangeable: untouched GPUs of a node whose GPUs are alike score alike,
so a scorer needs only one of them. Narrowing here is kept apart from the
measures so that what counts as "the same place" is decided once for both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


def fraction_pairs(
    st: FreeState, cand: np.ndarray, ok: np.ndarray, request: Request
) -> tuple[np.ndarray, ...]:
    """Candidate (node, GPU) pairs for a fraction.

    Returns (cand index, slot, node, free share of the GPU, share taken, whole
    free GPUs after, GPUs of the node with more free share than this one).

    Untouched GPUs of a node that the request may use are interchangeable when
    the node's GPUs are alike, so only the first of them is a candidate; partly
    used GPUs are each a candidate. Both scorers of ``default``
    ask for the same pairs in one query, so the last answer is kept on the state.
    """
    cached = st.pair_cache
    if cached is not None and cached[0] is cand and cached[1] is request:
        return cached[2]
    free = st.free[cand]
    cap = st.cap[cand]
    full = (free == cap) & st.valid[cand]
    if st.gpus_alike:
        # untouched GPUs the request may use are interchangeable where a node's GPUs share capacity and
        # memory size: keep the first (a model restriction is in ``ok``: the first untouched GPU of the
        # node may be of another model)
        usable_full = full & ok
        pick = ok & ~full
        first = usable_full.argmax(axis=1)  # the first usable untouched GPU of each node (if any)
        at = np.arange(len(cand))
        pick[at, first] |= usable_full[at, first]
        kk, jj = pick.nonzero()
    else:
        kk, jj = ok.nonzero()
    rows = cand[kk]
    f_old = free[kk, jj]
    if request.gpu_memory_mib:
        need = -(-request.gpu_memory_mib * 1000 // st.gpu_mem[rows, jj])
    else:
        need = np.full(len(rows), request.gpu_milli, dtype=np.int64)
    whole = st.whole_free[rows] - (f_old == cap[kk, jj])
    # GPUs of the node with more free share than this one: tells a node state's distinct shares apart
    above = (st.free_or_neg[rows] > f_old[:, None]).sum(axis=1)
    out = (kk, jj, rows, f_old, need, whole, above)
    st.pair_cache = (cand, request, out)
    return out
