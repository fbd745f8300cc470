"""Which places a policy compares: fewer candidates, never a different answer.

A placement query may have thousands of nodes, and (node, GPU) places, that
fit. Most are interchangeable: nodes in the same state score alike under every
policy, as do untouched GPUs of a node whose GPUs are alike, so a policy needs
only one of each (the first in tie order). A multi-GPU request goes inside one
topology group when any node can offer that. Narrowing is kept apart from the
policies so that what counts as "the same place" is decided once for all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState

DISTINCT_MIN = 96  # fewer candidates: scoring duplicate states costs less than finding them


def distinct_states(st: FreeState, cand: np.ndarray) -> np.ndarray:
    """One candidate per distinct node state: the first in tie order (result in node order).

    Nodes in the same state score alike under every policy and ties go by tie
    rank, so dropping the others changes no answer and saves most of the
    scoring work on large, uniform clusters.
    """
    if cand.size < DISTINCT_MIN:
        return cand
    keys = st.state_key[cand]
    # by state, then tie rank, then node order (both sorts are stable and cand is ascending,
    # so with tie ranks in node order sorting by state alone is the same order)
    if st.rank_is_order:
        order = keys.argsort(kind="stable")
    else:
        order = np.lexsort((st.tie_rank[cand], keys))
    by_state = keys[order]
    first = np.empty(by_state.size, dtype=bool)
    first[0] = True
    np.not_equal(by_state[1:], by_state[:-1], out=first[1:])
    if first.all():
        return cand
    return np.sort(cand[order[first]])


def prefer_one_group(st: FreeState, cand: np.ndarray, request: Request) -> np.ndarray:
    """Keep only nodes that can seat a multi-GPU request inside one topology group, if any can."""
    full = (st.free[cand] == st.cap[cand]) & st.whole_slot[cand]
    if request.gpu_models:
        full &= st.model_mask(request.gpu_models)[cand]
    topo = st.topo_id[cand]
    best = np.zeros(cand.size, dtype=np.int64)
    for grp in range(st.max_groups):
        best = np.maximum(best, (full & (topo == grp)).sum(axis=1))
    one = best >= request.gpus
    return cand[one] if one.any() else cand


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
