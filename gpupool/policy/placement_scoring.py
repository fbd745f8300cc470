"""Choosing a place by a measure of what the coming work can still use: the machinery both measures share.

The ``default`` and ``fgd`` policies differ only in their measure of a node
state (:mod:`gpupool.policy.placement_capacity`,
:mod:`gpupool.policy.placement_frag`); what surrounds a measure is the same and
lives here, once: learning the request mix from what is asked for, deciding
when the measure's tables must be re-weighed or rebuilt, scoring every
candidate's after-state (through the per-cycle memo of after-states,
:mod:`gpupool.policy.placement_memo`, when a node state names them), the choice
and its tie-breaks, and keeping the chosen after-state for the commit that
usually follows. A measure subclasses :class:`MeasureScorer` and supplies its
tables and after-states (the abstract methods below).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request
from gpupool.policy.placement_candidates import fraction_pairs
from gpupool.policy.placement_memo import MemoTable, ScoreMemo
from gpupool.policy.placement_shapes import Shape, request_type
from gpupool.policy.placement_slots import whole_slots, whole_usable

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


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


class MeasureScorer(ABC):
    """The choice a per-node measure drives for one :class:`FreeState`: mix, table refresh, scoring, keeping."""

    REFRESH_MIN = 32  # re-weigh the learned mix after this many new requests ...
    REFRESH_FRACTION = 0.05  # ... or this share of what was seen, whichever is larger

    # set by the scorers and _keep (annotations only): the last candidates' after-states, and the
    # one kept for the commit that usually follows
    _after: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]
    _ftot_after: np.ndarray
    _kept: tuple[int, int, Request, np.ndarray, float, np.ndarray, tuple[np.ndarray, int] | None] | None
    # per node, kept in step with the state by update_row: the measure's per-shape share (Su), the
    # free share, and the measure now (the measures set them at a rebuild)
    su: np.ndarray
    ftot: np.ndarray
    frag_now: np.ndarray

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
        self.memo = ScoreMemo()
        # The memo keys a node by its state (FreeState._key_of: hardware class and sorted free
        # shares); that names the after-state of a GPU too only if a node's GPUs are all alike.
        self._memo_ok = state.gpus_alike
        self._live: tuple[int, np.ndarray] | None = None
        self._after_parts: tuple[np.ndarray, np.ndarray] | None = None  # (gain, level) of the last after-states
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

    # ------------------------------------------------------------ what a measure supplies

    @abstractmethod
    def rebuild(self) -> None:
        """Recompute weights, per-shape tables and every node's measure (the mix has a type the tables lack)."""

    @abstractmethod
    def reweigh(self) -> None:
        """Only the mix's proportions moved: new weights over the same per-node tables."""

    @abstractmethod
    def age_weights(self) -> None:
        """Bring lazily refreshed weights up to date (called before each choice, scored or not)."""

    @abstractmethod
    def _compute_row(self, i: int) -> None:
        """Recompute node ``i``'s row of the measure from the state."""

    @abstractmethod
    def _set_row(self, i: int, after: np.ndarray | float) -> None:
        """Store the measure of node ``i``'s new state (computed while choosing)."""

    @abstractmethod
    def _set_parts(self, i: int, parts: tuple[np.ndarray, int] | None) -> None:
        """Store the weight-free parts of node ``i``'s measure (computed there when None)."""

    @abstractmethod
    def _after_node(self, cand: np.ndarray, request: Request) -> tuple[np.ndarray, ...]:
        """The measure's inputs on each node of ``cand`` after whole-GPU or CPU-only work goes there."""

    @abstractmethod
    def _after_pairs(
        self, rows: np.ndarray, jj: np.ndarray, f_old: np.ndarray, need: np.ndarray, whole: np.ndarray,
        cpu_milli: int,
    ) -> tuple[np.ndarray, ...]:
        """As :meth:`_after_node`, once a fraction takes ``need`` of GPU ``jj`` (free ``f_old``) of each node."""

    @abstractmethod
    def _delta_node(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """Change of the measure (lower is better) for whole-GPU or CPU-only work on each candidate node."""

    @abstractmethod
    def _delta_fraction(
        self, cand: np.ndarray, ok: np.ndarray, request: Request
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, GPU slot, change of the measure) for a fraction on each usable (node, GPU) pair."""

    @abstractmethod
    def _memo_row(self, rows: np.ndarray, after: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """What the memo keeps of after-states just computed for ``rows``."""

    @abstractmethod
    def _memo_delta(self, table: MemoTable, idx: np.ndarray, rows: np.ndarray, prefix: str = "") -> np.ndarray:
        """Change of the measure per candidate from kept after-states (storage rows ``idx``)."""

    # ------------------------------------------------------------ keeping in step

    def refresh(self) -> None:
        """Bring weights and tables up to date with the observed mix, as cheaply as possible."""
        if self._new_type:
            self.rebuild()
        elif self._dirty:
            self.reweigh()

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
        """(node, GPU slots) among ``cand`` whose placement changes the measure least (lower is better)."""
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
            return i, whole_slots(st, i, whole_usable(st, i, request), request.gpus)
        return i, whole_slots(st, i, np.flatnonzero(ok[int(np.searchsorted(cand, i))]), request.gpus)

    def deltas(
        self, cand: np.ndarray, ok: np.ndarray | None, request: Request
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """(candidate rows, GPU slot per row or None, change of the measure per row).

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

    def _live_states(self) -> np.ndarray:
        """The state keys some node is in now (sorted), computed once per state version."""
        st = self.state
        if self._live is None or self._live[0] != st._version:
            self._live = (st._version, np.unique(st.state_key))
        return self._live[1]
