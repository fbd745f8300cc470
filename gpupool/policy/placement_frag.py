"""Expected fragmentation (FGD): the ``fgd`` policy's measure and the FGD term of ``default``'s.

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

The choice this measure drives (learning the mix, refreshing the tables,
scoring through the memo, tie-breaks) is :mod:`gpupool.policy.placement_scoring`;
request shapes and their per-node tables are :mod:`gpupool.policy.placement_shapes`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request
from gpupool.policy.placement_candidates import fraction_pairs
from gpupool.policy.placement_memo import MemoTable
from gpupool.policy.placement_scoring import MeasureScorer
from gpupool.policy.placement_shapes import Shape, shape_tables

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


class FragModel(MeasureScorer):
    """Expected fragmentation per node for one :class:`FreeState`, kept per GPU shape and CPU level."""

    def __init__(
        self, state: FreeState, fixed: Iterable[Request] | None = None, *,
        expect: Iterable[Request] = (), build: bool = True,
    ) -> None:
        """As :class:`~gpupool.policy.placement_scoring.MeasureScorer` (``fixed``, ``expect``, ``build``)."""
        self._mix_version = 0  # bumped whenever the mix's weights change
        self._plan: tuple | None = None  # how _weigh adds up the types (made at a rebuild)
        super().__init__(state, fixed, expect=expect, build=build)

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
        demand, self.allowed, self.node_cap = shape_tables(st, shapes)
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
