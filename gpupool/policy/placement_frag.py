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

from gpupool.policy.model import Request
from gpupool.policy.placement_memo import MemoTable, ScoreMemo

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState

Shape = tuple
"""("w", n, models) whole GPUs, ("f", milli, models) a fraction, ("m", mib, models) GPU memory."""


def request_shape(request: Request) -> Shape | None:
    """The GPU shape of a request; None for CPU-only work (it fragments no GPU)."""
    models = tuple(sorted(request.gpu_models)) if request.gpu_models else ()
    if request.gpus:
        return ("w", request.gpus, models)
    if request.gpu_milli:
        return ("f", request.gpu_milli, models)
    if request.gpu_memory_mib:
        return ("m", request.gpu_memory_mib, models)
    return None


def request_type(request: Request) -> tuple[Shape, int] | None:
    """The request type the mix counts: (GPU shape, CPU need); None for CPU-only work."""
    shape = request_shape(request)
    return None if shape is None else (shape, request.cpu_milli)


def _volume(shape: Shape) -> float:
    """Milli-GPU a request of this shape takes (memory shapes: counted as half a GPU)."""
    kind, amount, _ = shape
    return 1000.0 * amount if kind == "w" else float(amount) if kind == "f" else 500.0


def fgd_node_score(increase: np.ndarray) -> np.ndarray:
    """The ``fgd`` baseline's ranking of candidates: minus the FGD authors' integer node score.

    Their simulator scores a node ``int(100 * sigmoid(-increase / 1000))`` for
    an increase of expected fragmentation in milli-GPU, highest first, and the
    scheduler breaks equal scores by node order. So increases within about 40
    milli-GPU of each other tie (near 0; more apart further out) and large ones
    saturate. Ranking by the exact increase instead left our FGD 0.1 to 0.85
    points below the paper's figures on seven of the nine openb variants; this
    brings it to within -0.3 to +0.7 (docs/benchmarks.md). ``default`` does not
    use it: it ranks by its exact cost.
    """
    x = np.clip(increase / 1000.0, -50.0, 50.0)  # (exp stays finite; the score is 0 or 100 out there)
    return -np.floor(100.0 / (1.0 + np.exp(x)))


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


class FragModel:
    """Expected-fragmentation cache for one :class:`FreeState`, and the choice it drives."""

    REFRESH_MIN = 32  # re-weigh the learned mix after this many new requests ...
    REFRESH_FRACTION = 0.05  # ... or this share of what was seen, whichever is larger

    # set by the scorers and _keep (annotations only): the last candidates' after-states, and the
    # one kept for the commit that usually follows
    _after: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]
    _ftot_after: np.ndarray
    _kept: tuple[int, int, Request, np.ndarray, float, np.ndarray, tuple[np.ndarray, int] | None] | None

    def __init__(
        self, state: FreeState, fixed: Iterable[Request] | None = None, *,
        expect: Iterable[Request] = (), build: bool = True,
    ) -> None:
        """``fixed``: the request mix, given (else learned from what is asked for).

        ``expect``: request types that may be asked for; they get a count of 0
        (no weight, so no choice changes) and a place in the tables from the
        start, so their first request only re-weighs instead of rebuilding every
        table (and dropping the memo) mid-cycle. ``build``: build the tables now
        (False when the caller rebuilds once it has subtracted running work).
        """
        self.state = state
        self.counts: dict[tuple[Shape, int], float] = {}
        self.fixed = fixed is not None
        self._seen_since = 0
        self._total = 0.0
        self._dirty = True  # the mix moved: weights (and maybe tables) are out of date
        self._new_type = True  # a request type the tables lack was seen: full rebuild needed
        self._shapes: list[Shape] = []
        self._table_keys: set[tuple[Shape, int]] = set()  # the types the tables were built for
        self._mix_version = 0  # bumped whenever the mix's weights change
        self.memo = ScoreMemo()
        # The memo keys a node by its state (FreeState._key_of: hardware class and sorted free
        # shares); that names the after-state of a GPU too only if a node's GPUs are all alike.
        self._memo_ok = state.gpus_alike
        self._live: tuple[int, np.ndarray] | None = None
        self._after_parts: tuple[np.ndarray, np.ndarray] | None = None  # (gain, level) of the last after-states
        self._plan: tuple | None = None  # how _weigh adds up the types (made at a rebuild)
        if fixed is not None:
            for r in fixed:
                self._count(r)
        else:
            seen: set[int] = set()  # a queue often holds the same request object many times
            for r in expect:
                if id(r) in seen:
                    continue
                seen.add(id(r))
                key = request_type(r)
                if key is not None:
                    self.counts.setdefault(key, 0.0)
        if build:
            self.rebuild()

    # ------------------------------------------------------------ the request mix

    def _count(self, request: Request, times: int = 1) -> tuple[Shape, int] | None:
        """Count ``request``; returns its type the first time that type is asked for, else None."""
        key = request_type(request)
        if key is None or not self._count_type(key, times):
            return None
        return key

    def _count_type(self, key: tuple[Shape, int], times: int) -> bool:
        """Count ``times`` requests of type ``key``; True the first time the type is asked for."""
        before = self.counts.get(key, 0.0)
        self.counts[key] = before + float(times)
        self._total += float(times)
        return before == 0.0

    def _flag_new(self, key: tuple[Shape, int]) -> None:
        """A type asked for the first time: re-weigh, and rebuild the tables if they lack it."""
        self._dirty = True
        if key not in self._table_keys:
            self._new_type = True

    def observe(self, request: Request) -> None:
        """Learn from a request asked for (no-op when the mix was given)."""
        if self.fixed:
            return
        new = self._count(request)
        self._seen_since += 1
        if new is not None:
            self._flag_new(new)
        elif self._seen_since >= max(self.REFRESH_MIN, self.REFRESH_FRACTION * self._total):
            self._dirty = True

    def observe_many(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.observe(r)

    def observe_counts(self, counts: Iterable[tuple[Request, int]]) -> None:
        """Learn ``times`` requests like ``r`` for each ``(r, times)`` (no-op when the mix was given).

        Counts and flags end exactly as after observing the requests one by one
        in order of first appearance: whole numbers added to floats are exact, a
        type is new at its first appearance whatever the grouping, a new type
        flags a re-weighing anyway, and the refresh test (``seen - 0.05 *
        total``) only grows request by request, so without a new type testing it
        once with the final totals sets the flag the last request would have.
        """
        if self.fixed:
            return
        # Summed per type first (in order of first appearance): the running work of a busy pool is
        # thousands of request objects of a few dozen types. A new type sets the flags whatever the
        # rest; without one, the refresh test after the last request sees the final totals.
        by_type: dict[tuple[Shape, int], int] = {}
        untyped = 0  # CPU-only requests: seen, but of no type
        for r, times in counts:
            if times <= 0:
                continue
            key = request_type(r)
            if key is None:
                untyped += times
            else:
                by_type[key] = by_type.get(key, 0) + times
        tested = untyped > 0
        self._seen_since += untyped
        for key, times in by_type.items():
            self._seen_since += times
            if self._count_type(key, times):
                self._flag_new(key)
            else:
                tested = True
        if tested and self._seen_since >= max(self.REFRESH_MIN, self.REFRESH_FRACTION * self._total):
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
        self._plan = None  # the types may have changed: plan the weighing again
        self._weigh()
        self.whole = np.array([s[0] == "w" for s in shapes], dtype=bool)
        self.n_whole = np.array([s[1] if s[0] == "w" else 0 for s in shapes], dtype=np.int64)
        # a whole-GPU type can use only untouched GPUs: its demand is the node's GPU capacity
        demand, self.allowed, self.node_cap = self._shape_tables(shapes)
        self.demand = demand
        # per node and shape: a whole GPU's share where it is too small for the shape (else 0): what a
        # whole-GPU placement takes out of the shape's unusable share, per GPU
        node_cap = self.node_cap[:, None]
        self.small_cap = np.where(node_cap < demand, node_cap, 0)
        # what a node state must reach for one request of each shape to fit (models folded in):
        # whole free GPUs for whole-GPU shapes, the largest free share for the others
        self.threshold = np.where(self.allowed, np.where(self.whole, self.n_whole, demand), np.iinfo(np.int64).max)
        self.su = self._unusable(st.free, st.valid, demand) if n else np.zeros((0, s_count))
        self.ftot = np.where(st.valid, st.free, 0).sum(axis=1).astype(np.float64)
        self.node_gain, self.node_level = self._frag_parts(
            np.arange(n), self.su, self.ftot, st.whole_free, st.max_share, st.cpu_free
        )
        self.frag_now = self._frag_weighed(self.ftot, self.node_gain, self.node_level)
        self.memo.clear()
        self._table_keys = set(self.counts)
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
        gpu_mem = st.gpu_mem[:, 0] if n else np.zeros(0, dtype=np.int64)  # at least 1 (see placement_layout.Layout)
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
        """cpu_table[level, s]: weight of shape-s types whose CPU need is within ``cpu_levels[level-1]``.

        Each type's weight is added to its shape's column from its CPU level up, types in ``repr``
        order. The types change only with the tables (a rebuild), so where each one goes is planned
        once (:meth:`_weigh_plan`); a re-weighing then adds, for the k-th type of every shape at once,
        its weight or 0.0 below its level: the same sums in the same order.
        """
        plan = self._plan
        if plan is None or plan[0] != len(self.counts):
            plan = self._plan = self._weigh_plan()
        _, order, steps = plan
        total = sum(self.counts.values()) or 1.0
        weight = np.array([self.counts[k] for k in order], dtype=np.float64) / total
        table = np.zeros((len(self.cpu_levels) + 1, len(self._shapes)))
        levels = np.arange(len(self.cpu_levels) + 1)[:, None]
        for at, cols, level in steps:
            table[:, cols] += np.where(levels >= level, weight[at], 0.0)
        self.cpu_table = table
        self.p_total = float(table[-1].sum()) if self._shapes else 0.0
        self._mix_version += 1  # fragmentation kept in the memo was measured with the old weights

    def _weigh_plan(self) -> tuple[int, list[tuple[Shape, int]], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """(number of types, types in ``repr`` order, steps): step k holds the k-th type of each shape.

        Also sets ``cpu_levels`` (the distinct CPU needs, sorted).
        """
        order = sorted(self.counts, key=repr)
        self.cpu_levels = np.asarray(sorted({c for (_, c) in order}), dtype=np.int64)
        per_shape: dict[int, list[tuple[int, int]]] = {}
        for at, (shape, cpu) in enumerate(order):
            level = int(np.searchsorted(self.cpu_levels, cpu, side="left")) + 1
            per_shape.setdefault(self._sidx[shape], []).append((at, level))
        steps = []
        for k in range(max((len(v) for v in per_shape.values()), default=0)):
            kth = [(col, v[k]) for col, v in per_shape.items() if len(v) > k]
            steps.append((np.array([t[0] for _, t in kth], dtype=np.int64),
                          np.array([col for col, _ in kth], dtype=np.int64),
                          np.array([t[1] for _, t in kth], dtype=np.int64)))
        return len(self.counts), order, steps

    def reweigh(self) -> None:
        """Only the mix's proportions moved (no new type): new weights, same per-node tables.

        Cheaper than :meth:`rebuild` (no pass over every GPU of every node); the
        node rows kept by :meth:`update_row` are exact, so the result is the same.
        """
        self._weigh()
        # (the fit tests do not depend on the weights: each node's are kept, only the weighing is redone)
        self.frag_now = self._frag_weighed(self.ftot, self.node_gain, self.node_level)
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

    def _frag_parts(
        self, rows: np.ndarray, su: np.ndarray, ftot: np.ndarray, whole: np.ndarray, maxfree: np.ndarray,
        cpu: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The parts of the expected fragmentation of node states that do not depend on the mix's weights.

        (gain, level), one row per entry of ``rows``: ``gain`` is 0 for a shape of
        which one request still fits, else the shape's unusable share minus the
        free share; ``level`` indexes the node's free CPU in ``cpu_levels``. The
        measure is ``ftot * p_total + sum(gain * cpu_table[level])``
        (:meth:`_frag_weighed`). Kept in the memo and per node, they make
        re-weighing a node state one gather, one product and one sum instead of
        redoing the fit tests. ``gain`` is a whole number no larger than a node's
        free share, so float32 holds it exactly.
        """
        fits = np.where(self.whole, whole[:, None], maxfree[:, None]) >= self.threshold[rows]
        gain = np.where(fits, su - ftot[:, None], 0.0).astype(np.float32)
        # (cpu_levels change only with the table's types, and a rebuild drops the memo)
        return gain, self.cpu_levels.searchsorted(cpu, side="right")

    def _frag_weighed(self, ftot: np.ndarray, gain: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Expected fragmentation of node states from their weight-free parts, weighed with the current mix."""
        if not self._shapes:
            return np.zeros(len(ftot))
        return ftot * self.p_total + np.add.reduce(gain * self.cpu_table.take(level, axis=0), axis=1)

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
            self._set_parts(i, kept[6])
            return
        self._compute_row(i)

    def _compute_row(self, i: int) -> None:
        st = self.state
        self.su[i] = self._unusable(st.free[i : i + 1], st.valid[i : i + 1], self.demand[i : i + 1])[0]
        self.ftot[i] = float(np.where(st.valid[i], st.free[i], 0).sum())
        self._set_parts(i, None)
        self.frag_now[i] = self._frag_weighed(self.ftot[i : i + 1], self.node_gain[i : i + 1],
                                              self.node_level[i : i + 1])[0]

    def _set_row(self, i: int, after: np.ndarray | float) -> None:
        """Store the measure of node ``i``'s new state (computed while choosing)."""
        self.frag_now[i] = after

    def _set_parts(self, i: int, parts: tuple[np.ndarray, int] | None) -> None:
        """Store the weight-free parts of node ``i``'s measure (computed here when not kept)."""
        if parts is None:
            st = self.state
            rows = np.array([i])
            gain, level = self._frag_parts(rows, self.su[rows], self.ftot[rows], st.whole_free[rows],
                                           st.max_share[rows], st.cpu_free[rows])
            parts = (gain[0], int(level[0]))
        self.node_gain[i], self.node_level[i] = parts

    def age_weights(self) -> None:
        """Hook for measures whose weights refresh lazily on the next choice (none here)."""

    def _keep(self, k: int, i: int, request: Request) -> None:
        """Remember candidate ``k``'s after-state (node ``i``) for the commit that usually follows."""
        su, ftot, after, idx = self._after
        if idx is not None:  # memo columns, addressed through each candidate's storage row
            k = int(idx[k])
        parts = None if self._after_parts is None else (self._after_parts[0][k].copy(), int(self._after_parts[1][k]))
        self._kept = (self.state._version, i, request, su[k].copy(), float(ftot[k]), after[k].copy(), parts)

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
        if pack_ties:
            delta = delta.round(6)
        else:
            delta = fgd_node_score(delta)
        best = (delta == delta.min()).nonzero()[0]
        if best.size == 1:  # the usual case: no tie to break
            k = int(best[0])
        else:  # least fragmentation, then (default) least GPU and CPU left, then node order
            keys: list[np.ndarray] = [st.tie_rank[rows[best]]]
            if pack_ties:
                keys.append(st.cpu_free[rows[best]] - request.cpu_milli)
                keys.append(self._ftot_after[best])
            k = int(best[np.lexsort(tuple(keys))[0]])
        i = int(rows[k])
        self._keep(k, i, request)
        if slot is not None:
            return i, [int(slot[k])]
        if not request.gpus:
            return i, []
        if ok is None:  # plain whole GPUs: every wholly free GPU of the node will do
            return i, st.whole_slots(i, st.whole_usable(i, request), request.gpus)
        return i, st.whole_slots(i, np.flatnonzero(ok[int(np.searchsorted(cand, i))]), request.gpus)

    def deltas(
        self, cand: np.ndarray, ok: np.ndarray | None, request: Request
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """(candidate rows, GPU slot per row or None, increase of fragmentation per row).

        The after-state of every (request, node state) pair is computed once and
        kept (:mod:`gpupool.policy.placement_memo`); only node states not seen
        for this request since the tables last changed are computed here.
        """
        self.refresh()
        st = self.state
        node = bool(request.gpus) or ok is None
        self._memo_used = self._memo_ok and bool(self._shapes)  # (no GPU type in the mix: every measure is 0)
        if not self._memo_used:
            if node:
                return cand, None, self._delta_node(cand, request)
            assert ok is not None  # (node is True whenever ok is None)
            return self._delta_fraction(cand, ok, request)
        slot: np.ndarray | None
        if node:
            rows, slot = cand, None
            keys = st.state_key[cand]
            span = 1
        else:
            assert ok is not None
            _, pair_slot, rows, f_old, need, whole, above = fraction_pairs(st, cand, ok, request)
            slot = pair_slot
            span = st.free.shape[1]
            keys = st.state_key[rows] * span + above
        table = self.memo.table(request, span)
        n_states = len(st._state_ids)
        idx = table.lookup(keys, n_states)
        miss = (idx < 0).nonzero()[0]
        if miss.size:
            if node:
                cols = self._memo_rows_node(rows[miss], request)
            else:
                cols = self._memo_rows_pairs(rows[miss], pair_slot[miss], f_old[miss], need[miss], whole[miss],
                                             request.cpu_milli)
            idx[miss] = table.add(keys[miss], cols)
            if self.memo.added(len(miss), self._live_states):
                idx = table.lookup(keys, n_states)
        return rows, slot, self._memo_delta(table, idx, rows)

    def _memo_rows_node(self, rows: np.ndarray, request: Request) -> dict[str, np.ndarray]:
        """Memo columns for whole-GPU or CPU-only work placed on each of ``rows``."""
        return self._memo_row(rows, self._after_node(rows, request))

    def _memo_rows_pairs(
        self, rows: np.ndarray, jj: np.ndarray, f_old: np.ndarray, need: np.ndarray, whole: np.ndarray,
        cpu_milli: int,
    ) -> dict[str, np.ndarray]:
        """Memo columns for a fraction placed on each (node, GPU) pair."""
        return self._memo_row(rows, self._after_pairs(rows, jj, f_old, need, whole, cpu_milli))

    def _memo_row(self, rows: np.ndarray, after: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """What the memo keeps of after-states just computed for ``rows``.

        The measure's inputs, not the measure: it depends on the learned mix's
        weights, so it is computed (and recomputed after a re-weighing) by
        :meth:`_memo_delta`, for all new and stale rows of a query at once.
        Shares are whole numbers, so float32 keeps them exactly at half the memory.
        """
        su, ftot, whole, maxfree, cpu = after
        gain, level = self._frag_parts(rows, su, ftot, whole, maxfree, cpu)
        return {"su": su.astype(np.float32), "ftot": ftot, "gain": gain, "level": level}

    def _memo_delta(self, table: MemoTable, idx: np.ndarray, rows: np.ndarray, prefix: str = "") -> np.ndarray:
        """Increase of fragmentation per candidate from kept after-states (storage rows ``idx``).

        ``prefix``: where our columns are when we share another scorer's table.
        """
        cols = table.cols
        version = table.declare(prefix + "version", np.int64, -1)
        after = table.declare(prefix + "after", np.float64, 0.0)
        stale = idx[version[idx] != self._mix_version]
        if stale.size:
            after[stale] = self._frag_weighed(cols["ftot"][stale], cols[prefix + "gain"].take(stale, axis=0),
                                              cols[prefix + "level"][stale])
            version[stale] = self._mix_version
        ftot = cols["ftot"]  # the free share after: the same for every scorer, kept once
        self._ftot_after = ftot[idx]
        self._after = (cols[prefix + "su"], ftot, after, idx)
        self._after_parts = (cols[prefix + "gain"], cols[prefix + "level"])
        return after[idx] - self.frag_now[rows]

    def _live_states(self) -> np.ndarray:
        """The state keys some node is in now (sorted), computed once per state version."""
        st = self.state
        if self._live is None or self._live[0] != st._version:
            self._live = (st._version, np.unique(st.state_key))
        return self._live[1]

    def _after_node(self, cand: np.ndarray, request: Request) -> tuple[np.ndarray, ...]:
        """(Su, free share, whole free GPUs, largest free share, free CPU) of each node after the placement."""
        st = self.state
        n = request.gpus
        whole = st.whole_free[cand] - n
        ftot = self.ftot[cand] - n * self.node_cap[cand]
        su = self.su[cand]
        if n:
            part = st.part_share[cand]  # largest free share of a partly used GPU (0 if none)
            maxfree = np.where(whole > 0, self.node_cap[cand], part)
            su = su - n * self.small_cap[cand]  # a GPU too small for a shape leaves its Su
        else:
            maxfree = st.max_share[cand]
        return su, ftot, whole, maxfree, st.cpu_free[cand] - request.cpu_milli

    def _delta_node(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """Increase of fragmentation for whole-GPU or CPU-only work on each candidate node."""
        su, ftot, whole, maxfree, cpu = self._after_node(cand, request)
        self._ftot_after = ftot
        after = self._frag_weighed(ftot, *self._frag_parts(cand, su, ftot, whole, maxfree, cpu))
        self._after = (su, ftot, after, None)
        # (unlike the memo's, these after-states are estimates on a node whose GPUs differ, so the
        # committed node's weight-free parts are taken from its real state, as a re-weighing always did)
        self._after_parts = None
        return after - self.frag_now[cand]

    def _delta_fraction(
        self, cand: np.ndarray, ok: np.ndarray, request: Request
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Increase of fragmentation for a fraction on each usable (node, GPU) pair."""
        _, jj, rows, f_old, need, whole, _ = fraction_pairs(self.state, cand, ok, request)
        su, ftot, whole, maxfree, cpu = self._after_pairs(rows, jj, f_old, need, whole, request.cpu_milli)
        self._ftot_after = ftot
        after = self._frag_weighed(ftot, *self._frag_parts(rows, su, ftot, whole, maxfree, cpu))
        self._after = (su, ftot, after, None)
        self._after_parts = None  # (estimates: see _delta_node)
        return rows, jj, after - self.frag_now[rows]

    def _after_pairs(
        self, rows: np.ndarray, jj: np.ndarray, f_old: np.ndarray, need: np.ndarray, whole: np.ndarray,
        cpu_milli: int,
    ) -> tuple[np.ndarray, ...]:
        """As :meth:`_after_node`, once a fraction takes ``need`` of GPU ``jj`` (free ``f_old``) of each node."""
        st = self.state
        f_new = f_old - need
        fv = st.free_or_neg[rows]  # (a copy: changed below)
        r = np.arange(len(rows))
        top = fv.argmax(axis=1)
        top1 = fv[r, top]
        fv[r, top] = -1
        top2 = fv.max(axis=1)
        maxexcl = np.maximum(np.where(jj == top, top2, top1), 0)
        demand = self.demand[rows]
        su = (
            self.su[rows]
            - np.where(f_old[:, None] < demand, f_old[:, None], 0)
            + np.where(f_new[:, None] < demand, f_new[:, None], 0)
        )
        ftot = self.ftot[rows] - need
        return su, ftot, whole, np.maximum(maxexcl, f_new), st.cpu_free[rows] - cpu_milli
