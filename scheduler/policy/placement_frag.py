"""Fragmentation-aware placement: the measure behind the ``default`` and ``fgd`` policies.

Idea (after Weng et al., "Beware of Fragmentation", ATC'23): free GPU share is
only useful if some request that will come can use it. For a request *type*
``m`` (GPU shape, CPU need, allowed models) a node's free GPU share is
*fragmented* when ``m`` cannot use it:

* if ``m`` cannot run on the node at all (not enough CPU, no GPU with a large
  enough free share, too few whole free GPUs, wrong model), all of the node's
  free share is fragmented;
* otherwise the free share on GPUs that ``m`` cannot use (a fraction smaller
  than ``m`` asks; a partly used GPU for a whole-GPU type) is fragmented.

The node's expected fragmentation is the sum over types weighted by how often
each type is asked for. A request goes where it increases the pool's expected
fragmentation least. Whole free GPUs are never fragmented for any type, which
is what keeps them (and whole nodes) free for large jobs; counting CPU
exhaustion as fragmentation keeps CPU-heavy work from stranding GPUs.

Computation, per node and GPU shape ``s`` (types grouped by shape so the CPU
part is one table lookup): with ``Su[node, s]`` the free share on GPUs ``s``
cannot use, ``Ftot`` the node's free share, ``fits[node, s]`` whether the GPU
part of ``s`` fits and ``Pc[node, s]`` the weight of shape-``s`` types whose
CPU need fits the node's free CPU,

    frag(node) = Ftot * sum(p) + sum_s fits * Pc * (Su - Ftot)

A placement changes one node (one GPU for a fraction; whole free GPUs, which
count in no ``Su``, for whole-GPU work), so the increase for every candidate
(node, GPU) pair is computed at once from cached ``Su`` rows. Memory is a hard
constraint only; it is not part of the measure (it is rarely what strands
GPUs). Nodes are assumed to carry one GPU model (the first GPU's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from scheduler.policy.model import Request

if TYPE_CHECKING:
    from scheduler.policy.placement import FreeState

Shape = tuple
"""("w", n, models) whole GPUs, ("f", milli, models) a fraction, ("m", mib, models) GPU memory."""


def request_shape(request: Request) -> Shape | None:
    """The GPU shape of a request; None for CPU-only work (it fragments no GPU)."""
    models = tuple(sorted(request.gpu_models))
    if request.gpus:
        return ("w", request.gpus, models)
    if request.gpu_milli:
        return ("f", request.gpu_milli, models)
    if request.gpu_memory_mib:
        return ("m", request.gpu_memory_mib, models)
    return None


def _volume(shape: Shape) -> float:
    """Milli-GPU a request of this shape takes (memory shapes: counted as half a GPU)."""
    kind, amount, _ = shape
    return 1000.0 * amount if kind == "w" else float(amount) if kind == "f" else 500.0


def fraction_pairs(
    st: FreeState, cand: np.ndarray, ok: np.ndarray, request: Request
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate (node, GPU) pairs for a fraction: (cand index, slot, node, free, need, whole GPUs after).

    Untouched GPUs of a node are interchangeable, so only the first of them is a
    candidate; partly used GPUs are each a candidate. Both scorers of ``default``
    ask for the same pairs in one query, so the last answer is kept on the state.
    """
    cached = st.pair_cache
    if cached is not None and cached[0] is cand and cached[1] is request:
        return cached[2]
    free = st.free[cand]
    cap = st.cap[cand]
    full = (free == cap) & st.valid[cand]
    first_full = full & (np.cumsum(full, axis=1) == 1)
    kk, jj = np.nonzero(ok & (~full | first_full))
    rows = cand[kk]
    f_old = free[kk, jj]
    if request.gpu_memory_mib:
        need = -(-request.gpu_memory_mib * 1000 // st.gpu_mem[rows, jj])
    else:
        need = np.full(len(rows), request.gpu_milli, dtype=np.int64)
    whole = st.whole_free[rows] - (f_old == cap[kk, jj])
    out = (kk, jj, rows, f_old, need, whole)
    st.pair_cache = (cand, request, out)
    return out


class FragModel:
    """Expected-fragmentation cache for one :class:`FreeState`, and the choice it drives."""

    REFRESH_MIN = 32  # re-weigh the learned mix after this many new requests ...
    REFRESH_FRACTION = 0.05  # ... or this share of what was seen, whichever is larger

    def __init__(self, state: FreeState, fixed: Iterable[Request] | None = None) -> None:
        self.state = state
        self.counts: dict[tuple[Shape, int], float] = {}
        self.fixed = fixed is not None
        self._seen_since = 0
        self._total = 0.0
        self._dirty = True  # the mix moved: weights (and maybe tables) are out of date
        self._new_type = True  # a request type the tables lack was seen: full rebuild needed
        self._shapes: list[Shape] = []
        if fixed is not None:
            for r in fixed:
                self._count(r)
        self.rebuild()

    # ------------------------------------------------------------ the request mix

    def _count(self, request: Request, times: int = 1) -> bool:
        shape = request_shape(request)
        if shape is None:
            return False
        key = (shape, request.cpu_milli)
        new = key not in self.counts
        self.counts[key] = self.counts.get(key, 0.0) + float(times)
        self._total += float(times)
        return new

    def observe(self, request: Request) -> None:
        """Learn from a request asked for (no-op when the mix was given)."""
        if self.fixed:
            return
        new = self._count(request)
        self._seen_since += 1
        if new:
            self._dirty = self._new_type = True
        elif self._seen_since >= max(self.REFRESH_MIN, self.REFRESH_FRACTION * self._total):
            self._dirty = True

    def observe_many(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.observe(r)

    def observe_counts(self, counts: Iterable[tuple[Request, int]]) -> None:
        """Learn ``times`` requests like ``r`` for each ``(r, times)`` (no-op when the mix was given).

        Counts and flags end exactly as after observing the requests one by one
        in order of first appearance: whole numbers added to floats are exact,
        a type is new at its first appearance whatever the grouping, and the
        refresh test (``seen - 0.05 * total``) only grows call by call, so
        testing it after each group sets the same flags as after each call.
        """
        if self.fixed:
            return
        for r, times in counts:
            if times <= 0:
                continue
            new = self._count(r, times)
            self._seen_since += times
            if new:
                self._dirty = self._new_type = True
            elif self._seen_since >= max(self.REFRESH_MIN, self.REFRESH_FRACTION * self._total):
                self._dirty = True

    # ------------------------------------------------------------ tables

    def rebuild(self) -> None:
        """Recompute weights, per-shape tables and every node's fragmentation."""
        st = self.state
        n = len(st.names)
        shapes = sorted({k[0] for k in self.counts}, key=repr)
        self._shapes = shapes
        s_count = len(shapes)
        sidx = {s: k for k, s in enumerate(shapes)}
        self._sidx = sidx
        self._weigh()
        self.whole = np.array([s[0] == "w" for s in shapes], dtype=bool)
        self.n_whole = np.array([s[1] if s[0] == "w" else 0 for s in shapes], dtype=np.int64)
        # a whole-GPU type can use only untouched GPUs: its demand is the node's GPU capacity
        demand, self.allowed, self.node_cap = self._shape_tables(shapes)
        self.demand = demand
        self.su = self._unusable(st.free, st.valid, demand) if n else np.zeros((0, s_count))
        self.ftot = np.where(st.valid, st.free, 0).sum(axis=1).astype(np.float64)
        self.frag_now = self._frag(np.arange(n), self.su, self.ftot, st.whole_free, st.max_share, st.cpu_free)
        self._kept = None
        self._dirty = self._new_type = False
        self._seen_since = 0

    def _shape_tables(
        self, shapes: list[Shape], whole_demand: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(demand, allowed, GPU capacity per node) for ``shapes``.

        ``demand[node, s]``: share one request of shape s takes on a GPU of the
        node (whole GPUs: ``whole_demand``, or the node's GPU capacity when None);
        ``allowed[node, s]``: the shape's models allow the node (and it has GPUs).
        """
        st = self.state
        n = len(st.names)
        node_model = st.model_id[:, 0] if n else np.zeros(0, dtype=np.int64)
        gpu_mem = st.gpu_mem[:, 0] if n else np.zeros(0, dtype=np.int64)  # at least 1 (see _Layout)
        cap = st.cap.max(axis=1) if n else np.zeros(0, dtype=np.int64)
        demand = np.zeros((n, len(shapes)), dtype=np.int64)
        allowed = np.ones((n, len(shapes)), dtype=bool)
        for k, (kind, amount, models) in enumerate(shapes):
            if kind == "w":
                demand[:, k] = cap if whole_demand is None else whole_demand
            elif kind == "f":
                demand[:, k] = amount
            else:
                demand[:, k] = -(-amount * 1000 // gpu_mem)
            if models:
                ids = [st.models[m] for m in models if m in st.models]
                allowed[:, k] = np.isin(node_model, ids)
        allowed &= st.valid[:, :1]
        return demand, allowed, cap

    def _weigh(self) -> None:
        """cpu_table[level, s]: weight of shape-s types whose CPU need is within ``cpu_levels[level-1]``."""
        cpus = sorted({c for (_, c) in self.counts})
        self.cpu_levels = np.asarray(cpus, dtype=np.int64)
        table = np.zeros((len(cpus) + 1, len(self._shapes)))
        total = sum(self.counts.values()) or 1.0
        for (shape, cpu), cnt in sorted(self.counts.items(), key=repr):
            level = int(np.searchsorted(self.cpu_levels, cpu, side="left")) + 1
            table[level:, self._sidx[shape]] += cnt / total
        self.cpu_table = table
        self.p_total = float(table[-1].sum()) if self._shapes else 0.0

    def reweigh(self) -> None:
        """Only the mix's proportions moved (no new type): new weights, same per-node tables.

        Cheaper than :meth:`rebuild` (no pass over every GPU of every node); the
        node rows kept by :meth:`update_row` are exact, so the result is the same.
        """
        st = self.state
        self._weigh()
        self.frag_now = self._frag(np.arange(len(st.names)), self.su, self.ftot, st.whole_free, st.max_share,
                                   st.cpu_free)
        self._kept = None
        self._dirty = False
        self._seen_since = 0

    def refresh(self) -> None:
        """Bring weights and tables up to date with the observed mix, as cheaply as possible."""
        if self._new_type:
            self.rebuild()
        elif self._dirty:
            self.reweigh()

    @staticmethod
    def _unusable(free: np.ndarray, valid: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """Su[row, s]: free share on GPUs of the row that shape s cannot use."""
        f = np.where(valid, free, 0)[:, :, None]
        return np.where(f < demand[:, None, :], f, 0).sum(axis=1).astype(np.float64)

    def _frag(
        self,
        rows: np.ndarray,
        su: np.ndarray,
        ftot: np.ndarray,
        whole: np.ndarray,
        maxfree: np.ndarray,
        cpu: np.ndarray,
    ) -> np.ndarray:
        """Expected fragmentation of node states (one per entry of ``rows``)."""
        if not self._shapes:
            return np.zeros(len(rows))
        fits = np.where(self.whole, whole[:, None] >= self.n_whole, maxfree[:, None] >= self.demand[rows])
        fits &= self.allowed[rows]
        pc = self.cpu_table[np.searchsorted(self.cpu_levels, cpu, side="right")]
        return ftot * self.p_total + (np.where(fits, pc, 0.0) * (su - ftot[:, None])).sum(axis=1)

    def update_row(self, i: int, request: Request | None = None) -> None:
        """Refresh node ``i`` after a commit or release.

        ``request``: the request just committed there at the place :meth:`choose`
        last found for it; the node's new row was computed then (the chosen
        candidate's "after" state) and is reused instead of recomputed.
        """
        if self._new_type:
            return  # rebuilt before the next choice anyway
        st = self.state
        kept = self._kept
        self._kept = None
        if request is not None and kept is not None and kept[0] == st._version - 1 and kept[1] == i \
                and kept[2] == request:
            self.su[i], self.ftot[i] = kept[3], kept[4]
            self._set_row(i, kept[5])
            return
        self._compute_row(i)

    def _compute_row(self, i: int) -> None:
        st = self.state
        self.su[i] = self._unusable(st.free[i : i + 1], st.valid[i : i + 1], self.demand[i : i + 1])[0]
        self.ftot[i] = float(np.where(st.valid[i], st.free[i], 0).sum())
        rows = np.array([i])
        self.frag_now[i] = self._frag(
            rows, self.su[rows], self.ftot[rows], st.whole_free[rows], st.max_share[rows], st.cpu_free[rows]
        )[0]

    def _set_row(self, i: int, after: np.ndarray | float) -> None:
        """Store the measure of node ``i``'s new state (computed while choosing)."""
        self.frag_now[i] = after

    def age_weights(self) -> None:
        """Hook for measures whose weights refresh lazily on the next choice (none here)."""

    def _keep(self, k: int, i: int, request: Request) -> None:
        """Remember candidate ``k``'s after-state (node ``i``) for the commit that usually follows."""
        su, ftot, after = self._after
        self._kept = (self.state._version, i, request, su[k].copy(), float(ftot[k]), after[k].copy())

    # ------------------------------------------------------------ choosing

    def choose(
        self, cand: np.ndarray, ok: np.ndarray | None, request: Request, pack_ties: bool
    ) -> tuple[int, list[int]]:
        """(node, GPU slots) that raise expected fragmentation least among ``cand``."""
        st = self.state
        if pack_ties and ok is None and not request.gpus:
            self.refresh()
            # CPU-only work never lowers either measure (less CPU fits fewer types), and
            # on a node with no free GPU share both stay 0 with no GPU left after: such a
            # node wins every tie-break that follows, so no scoring is needed.
            idle = cand[st.max_share[cand] == 0]
            if idle.size:
                self.age_weights()  # keep the weight schedule as if we had scored
                k = int(np.lexsort((st.tie_rank[idle], st.cpu_free[idle]))[0])
                self._kept = None
                return int(idle[k]), []
        rows, slot, delta = self.deltas(cand, ok, request)
        gpu_after = self._ftot_after
        keys: list[np.ndarray] = [st.tie_rank[rows]]
        if pack_ties:
            keys.append(st.cpu_free[rows] - request.cpu_milli)
            keys.append(gpu_after)
        keys.append(np.round(delta, 6))
        k = int(np.lexsort(tuple(keys))[0])
        i = int(rows[k])
        self._keep(k, i, request)
        if ok is None:
            return i, []
        if slot is None:
            usable = np.flatnonzero(ok[int(np.searchsorted(cand, i))])
            return i, st.whole_slots(i, usable, request.gpus)
        return i, [int(slot[k])]

    def deltas(
        self, cand: np.ndarray, ok: np.ndarray | None, request: Request
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """(candidate rows, GPU slot per row or None, increase of fragmentation per row)."""
        self.refresh()
        if request.gpus or ok is None:
            return cand, None, self._delta_node(cand, request)
        return self._delta_fraction(cand, ok, request)

    def _delta_node(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """Increase of fragmentation for whole-GPU or CPU-only work on each candidate node."""
        st = self.state
        n = request.gpus
        whole = st.whole_free[cand] - n
        ftot = self.ftot[cand] - n * self.node_cap[cand]
        su = self.su[cand]
        if n:
            part = np.where(st.valid[cand] & (st.free[cand] < st.cap[cand]), st.free[cand], 0).max(axis=1)
            maxfree = np.where(whole > 0, self.node_cap[cand], part)
            cap = self.node_cap[cand][:, None]
            su = su - n * np.where(cap < self.demand[cand], cap, 0)  # a GPU too small for a shape leaves its Su
        else:
            maxfree = st.max_share[cand]
        self._ftot_after = ftot
        after = self._frag(cand, su, ftot, whole, maxfree, st.cpu_free[cand] - request.cpu_milli)
        self._after = (su, ftot, after)
        return after - self.frag_now[cand]

    def _delta_fraction(
        self, cand: np.ndarray, ok: np.ndarray, request: Request
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Increase of fragmentation for a fraction on each usable (node, GPU) pair."""
        st = self.state
        kk, jj, rows, f_old, need, whole = fraction_pairs(st, cand, ok, request)
        f_new = f_old - need
        fv = np.where(st.valid[cand], st.free[cand], -1)
        top = fv.argmax(axis=1)
        top1 = fv[np.arange(len(cand)), top]
        fv[np.arange(len(cand)), top] = -1
        top2 = fv.max(axis=1)
        maxexcl = np.maximum(np.where(jj == top[kk], top2[kk], top1[kk]), 0)
        demand = self.demand[rows]
        su = (
            self.su[rows]
            - np.where(f_old[:, None] < demand, f_old[:, None], 0)
            + np.where(f_new[:, None] < demand, f_new[:, None], 0)
        )
        ftot = self.ftot[rows] - need
        maxfree = np.maximum(maxexcl, f_new)
        self._ftot_after = ftot
        after = self._frag(rows, su, ftot, whole, maxfree, st.cpu_free[rows] - request.cpu_milli)
        self._after = (su, ftot, after)
        return rows, jj, after - self.frag_now[rows]
