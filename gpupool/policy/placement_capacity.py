"""The ``default`` policy's measure: GPU share the coming work can still use.

FGD (:mod:`gpupool.policy.placement_frag`) asks, for each request type,
whether *one* more request of that type fits a node. On the openb trace most
drops are not for lack of GPU share but for lack of CPU next to it (a GPU node
whose cores went to CPU-heavy work strands its free GPUs), and one-request
lookahead does not see that: a node with 8 free GPUs and 12 free cores "fits"
an 11-core single-GPU job, yet 7 of those GPUs are already lost.

So for each request type ``m`` (GPU shape, CPU need) we count how much GPU
share of a node ``m`` could actually consume if only ``m`` came from now on:

* GPU side: a fraction ``d`` can use ``floor(f / d) * d`` of a GPU with free
  share ``f`` (the rest below ``d`` is lost to it); whole-GPU types use
  ``floor(W / n) * n`` of the ``W`` untouched GPUs;
* CPU side: the node's free CPU runs only ``floor(cpu / cpu_m)`` such requests;
* ``usable_m = min(GPU side, CPU side x the type's GPU size)``, 0 for a wrong model.

A placement's cost is the usable share it destroys, summed over types with
weights ``p_m * sqrt(free share of the pool / usable_m over the pool)``: ``p_m``
is how often ``m`` is asked for (learned from running and requested work) and
the square-root factor makes share that few nodes can offer a type (whole
8-GPU nodes with many cores, a scarce model) dearer than share every node has.
The FGD fragmentation increase is added to that cost (on the trace the sum
beats either alone, see docs/benchmarks.md), weighted by
``LAMBDA * (1 + GANG_GAIN * g ** GANG_EXP)`` where ``g`` is the share of the
learned mix's GPU volume asked for in multi-GPU gangs: FGD's one-request
lookahead is what keeps whole 8-GPU nodes free, and that matters in proportion
to how much of the work needs them (``g`` is ~0.07 on the openb default mix, so
the weight stays near 1 there, and ~0.3 on the gang-heavy mix). While the mix
is learned, ``g`` starts from a prior of gang work worth 1 % of the pool's GPUs
(``PRIOR_GANG_SHARE``): on an empty pool the first placements lean on FGD's
whole-node lookahead, and the prior fades as work is counted. The engine counts
the mix afresh each cycle (running work and that cycle's requests), so there the
prior acts on pools nearly empty at a cycle's start and returns when one drains.
Equal costs go
to the node left with the least free CPU and GPU, then by node order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from gpupool.policy.model import Request
from gpupool.policy.placement_candidates import fraction_pairs
from gpupool.policy.placement_frag import FragModel
from gpupool.policy.placement_memo import MemoTable
from gpupool.policy.placement_shapes import shape_tables, shape_volume

if TYPE_CHECKING:
    from gpupool.policy.placement import FreeState


class CapacityModel(FragModel):
    """Expected usable share per node, cached per GPU shape; drives ``default``."""

    LAMBDA = 1.0  # weight of the FGD term (one-request fragmentation) added to ours ...
    GANG_GAIN = 300.0  # ... times 1 + this x (share of GPU volume asked for in multi-GPU gangs) ** GANG_EXP
    GANG_EXP = 3.0
    PRIOR_GANG_SHARE = 0.01  # before any work is seen, assume gang work of this share of the pool's GPUs
    SCARCITY_EXP = 0.5  # exponent of the pool-level scarcity factor in a type's weight
    WEIGHT_REFRESH = 8  # scarcity weights move slowly: recompute them every this many commits

    def __init__(
        self, state: FreeState, fixed: Iterable[Request] | None = None, *,
        expect: Iterable[Request] = (), build: bool = True,
    ) -> None:
        fixed = list(fixed) if fixed is not None else None
        self._w_version = 0  # bumped whenever the scarcity weights change
        self._pool_share = 0.0  # milli-GPU of the pool's GPUs (set at a rebuild): sizes the gang prior
        self.fgd: FragModel | None = None  # built after our tables
        super().__init__(state, fixed=fixed, expect=expect, build=build)
        if self.LAMBDA:
            # (its tables are built by our rebuilds, on our counts)
            self.fgd = FragModel(state, fixed=fixed, build=False)
            if fixed is None:
                self.fgd.counts = self.counts  # one learned mix, counted once
            if build:
                self.fgd.rebuild()

    def observe(self, request: Request) -> None:
        super().observe(request)
        if self.fgd is not None and not self.fixed:
            # the FGD term shares our counts, so it is stale exactly when we are
            self.fgd._dirty |= self._dirty
            self.fgd._new_type |= self._new_type

    def observe_counts(self, counts: Iterable[tuple[Request, int]]) -> None:
        super().observe_counts(counts)
        if self.fgd is not None and not self.fixed:
            self.fgd._dirty |= self._dirty
            self.fgd._new_type |= self._new_type

    def refresh(self) -> None:
        super().refresh()
        if self.fgd is not None:
            self.fgd.refresh()

    def deltas(
        self, cand: np.ndarray, ok: np.ndarray | None, request: Request
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        rows, slot, delta = super().deltas(cand, ok, request)
        if self.fgd is not None and not self._memo_used:  # (with the memo, _memo_delta adds the FGD term)
            ftot = self._ftot_after
            _, _, extra = self.fgd.deltas(cand, ok, request)
            delta = delta + self.lam * extra
            self._ftot_after = ftot
        return rows, slot, delta

    def rebuild(self) -> None:
        if self.fgd is not None:
            self.fgd.rebuild()  # the FGD term measures the same state and mix: rebuilt with us
        st = self.state
        n = len(st.names)
        keys = sorted(self.counts, key=repr)
        shapes = sorted({k[0] for k in keys}, key=repr)
        self._shapes = shapes
        sidx = {s: k for k, s in enumerate(shapes)}
        self._keys = keys
        self._pool_share = float(np.where(st.valid, st.cap, 0).sum()) if n else 0.0
        self._weigh()
        self.t_shape = np.array([sidx[k[0]] for k in keys], dtype=np.int64)
        self.t_cpu = np.array([k[1] for k in keys], dtype=np.int64)
        self.t_vol = np.array([shape_volume(k[0]) for k in keys], dtype=np.float64)
        self.t_inv_cpu = np.where(self.t_cpu > 0, 1.0 / np.maximum(self.t_cpu, 1), 0.0)
        self.t_no_cpu = np.where(self.t_cpu > 0, 0.0, np.inf)  # CPU-free types: no CPU limit
        self.whole = np.array([s[0] == "w" for s in shapes], dtype=bool)
        self.n_whole = np.array([max(s[1], 1) if s[0] == "w" else 1 for s in shapes], dtype=np.int64)
        # whole-GPU types: a demand never used by the fraction formula
        never = np.iinfo(np.int32).max  # a demand no GPU meets: the shape can use nothing there
        demand, self.allowed, cap = shape_tables(st, shapes, whole_demand=never)
        # a shape whose models the node lacks gets that demand too, so its packable share is 0
        self.demand = np.where(self.allowed, np.maximum(demand, 1), never)
        self.node_cap = cap
        # whole-GPU shapes: usable share per group of n whole free GPUs on the node (0 where not allowed)
        self.whole_mult = np.where(self.whole, self.n_whole * cap[:, None] * self.allowed, 0)
        self.su = self._packable(st.free, st.valid, self.demand) if n else np.zeros((0, len(shapes)))
        self.ftot = np.where(st.valid, st.free, 0).sum(axis=1).astype(np.float64)
        self.full_pack = self._packable(cap[:, None], np.ones((n, 1), dtype=bool), self.demand) if n else self.su
        self.usable_now = self._usable(np.arange(n), self.su, st.whole_free, st.cpu_free)
        self.total = self.usable_now.sum(axis=0) if n else np.zeros(len(keys))
        self.frag_now = np.zeros(n)  # deltas are taken against usable_now directly
        self.memo.clear()
        self._w_version += 1  # kept scores were weighed with older weights
        self._table_keys = set(self.counts)
        self._w_age = 0  # weights are recomputed on first use
        self._kept = None
        self._dirty = self._new_type = False
        self._seen_since = 0

    def _weigh(self) -> None:
        """p: how often each request type is asked for (types in ``_keys`` order)."""
        weights = np.array([self.counts[k] for k in self._keys], dtype=np.float64)
        self.p = weights / weights.sum() if weights.sum() > 0 else weights  # (only expected types: all 0)
        volume = np.array([self.counts[k] * shape_volume(k[0]) for k in self._keys], dtype=np.float64)
        gang = np.array([k[0][0] == "w" and k[0][1] > 1 for k in self._keys], dtype=bool)
        # The gang share starts from a prior: as if gang work of PRIOR_GANG_SHARE of the pool had been
        # seen. An empty pool's first placements decide which kinds of node get opened, and with
        # little of the mix seen the per-type terms rest on a handful of requests; keeping whole
        # nodes whole (FGD's lookahead, weighed up) is the choice that is safe whatever comes. The
        # prior fades as work is counted (in the engine, whose mix is each cycle's running and asked-for
        # work, it matters on nearly empty pools only). A mix given up front (``fixed``) is known, so it
        # gets no prior.
        prior = 0.0 if self.fixed else self.PRIOR_GANG_SHARE * self._pool_share
        total = float(volume.sum()) + prior
        share = (float(volume[gang].sum()) + prior) / total if total > 0 else 0.0
        self.lam = self.LAMBDA * (1.0 + self.GANG_GAIN * share**self.GANG_EXP)

    def reweigh(self) -> None:
        """Same types, new proportions: usable share per node does not depend on them."""
        self._weigh()
        self._w_age = 0
        self._kept = None
        self._dirty = False
        self._seen_since = 0

    @staticmethod
    def _packable(free: np.ndarray, valid: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """Per row and shape: share fractions of that shape could fill, GPU by GPU."""
        f = np.where(valid, free, 0)[:, :, None]
        d = demand[:, None, :]
        return ((f // d) * d).sum(axis=1).astype(np.float64)

    def _usable(self, rows: np.ndarray, su: np.ndarray, whole: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        """usable[row, type]: GPU share each request type could still consume on the node."""
        if not self._shapes:
            return np.zeros((len(rows), 0))
        # (models are folded into the tables: su is 0 and whole_mult is 0 where a shape is not allowed)
        per_shape = np.where(self.whole, (whole[:, None] // self.n_whole) * self.whole_mult[rows], su)
        gpu_side = per_shape.take(self.t_shape, axis=1)
        # floor(cpu / cpu_m) requests fit by CPU; the epsilon keeps exact multiples exact.
        # In place: on hundreds of candidates x ~50-90 types, fresh temporaries cost more than the math.
        cpu_side = np.multiply(cpu[:, None], self.t_inv_cpu)
        cpu_side += 1e-9
        np.floor(cpu_side, out=cpu_side)
        cpu_side *= self.t_vol
        cpu_side += self.t_no_cpu
        return np.minimum(gpu_side, cpu_side, out=gpu_side)

    def age_weights(self) -> None:
        """Recompute the scarcity weights when due (every WEIGHT_REFRESH commits, on the next choice)."""
        if self._w_age <= 0 and self._shapes:
            self._w = self._weights()
            self._w_version += 1
            self._w_age = self.WEIGHT_REFRESH
            self._value_now = self.usable_now @ self._w

    def _weights(self) -> np.ndarray:
        """p_m * (pool free share / share usable by m) ** SCARCITY_EXP."""
        # (over-full GPUs, e.g. work left on a GPU whose capacity was lowered, make free share negative)
        scarcity = max(float(self.ftot.sum()), 0.0) / np.maximum(self.total, self.t_vol)
        return self.p * scarcity**self.SCARCITY_EXP

    def update_row(self, i: int, request: Request | None = None) -> None:
        if self.fgd is not None:
            self.fgd.update_row(i, request)
        super().update_row(i, request)

    def _keep(self, k: int, i: int, request: Request) -> None:
        super()._keep(k, i, request)
        if self.fgd is not None:
            self.fgd._keep(k, i, request)

    def _compute_row(self, i: int) -> None:
        st = self.state
        self.su[i] = self._packable(st.free[i : i + 1], st.valid[i : i + 1], self.demand[i : i + 1])[0]
        self.ftot[i] = float(np.where(st.valid[i], st.free[i], 0).sum())
        rows = np.array([i])
        self._set_row(i, self._usable(rows, self.su[rows], st.whole_free[rows], st.cpu_free[rows])[0])

    def _set_parts(self, i: int, parts: tuple[np.ndarray, int] | None) -> None:
        """Our measure keeps no weight-free parts per node (its FGD term keeps its own)."""

    def _set_row(self, i: int, after: np.ndarray | float) -> None:
        new = np.asarray(after)
        self.total += new - self.usable_now[i]
        self._w_age -= 1
        self.usable_now[i] = new
        if self._w_age > 0:
            self._value_now[i] = new @ self._w

    def _after_node(self, cand: np.ndarray, request: Request) -> tuple[np.ndarray, ...]:
        """(usable-by-shape share, free share, usable share per type) of each node after the placement."""
        st = self.state
        n = request.gpus
        whole = st.whole_free[cand] - n
        ftot = self.ftot[cand] - n * self.node_cap[cand]
        su = self.su[cand] - n * self.full_pack[cand] if n else self.su[cand]
        return su, ftot, self._usable(cand, su, whole, st.cpu_free[cand] - request.cpu_milli)

    def _delta_node(self, cand: np.ndarray, request: Request) -> np.ndarray:
        su, ftot, usable = self._after_node(cand, request)
        self._ftot_after = ftot
        self._after = (su, ftot, usable, None)
        return self._loss(cand, usable)

    def _delta_fraction(
        self, cand: np.ndarray, ok: np.ndarray, request: Request
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        _, jj, rows, f_old, need, whole, _ = fraction_pairs(self.state, cand, ok, request)
        su, ftot, usable = self._after_pairs(rows, jj, f_old, need, whole, request.cpu_milli)
        self._ftot_after = ftot
        self._after = (su, ftot, usable, None)
        return rows, jj, self._loss(rows, usable)

    def _after_pairs(
        self, rows: np.ndarray, jj: np.ndarray, f_old: np.ndarray, need: np.ndarray, whole: np.ndarray,
        cpu_milli: int,
    ) -> tuple[np.ndarray, ...]:
        st = self.state
        f_new = f_old - need
        d = self.demand[rows]
        su = self.su[rows] - (f_old[:, None] // d) * d + (f_new[:, None] // d) * d
        ftot = self.ftot[rows] - need
        return su, ftot, self._usable(rows, su, whole, st.cpu_free[rows] - cpu_milli)

    def _loss(self, rows: np.ndarray, usable: np.ndarray) -> np.ndarray:
        """Usable share lost per row against the current state (lower is better)."""
        if not self._shapes:
            return np.zeros(len(rows))
        self.age_weights()
        return self._value_now[rows] - usable @ self._w

    def _memo_rows_node(self, rows: np.ndarray, request: Request) -> dict[str, np.ndarray]:
        cols = super()._memo_rows_node(rows, request)
        if self.fgd is not None:  # the FGD term shares our table (same keys), under its own names
            cols.update(_prefixed(self.fgd._memo_rows_node(rows, request)))
        return cols

    def _memo_rows_pairs(
        self, rows: np.ndarray, jj: np.ndarray, f_old: np.ndarray, need: np.ndarray, whole: np.ndarray,
        cpu_milli: int,
    ) -> dict[str, np.ndarray]:
        cols = super()._memo_rows_pairs(rows, jj, f_old, need, whole, cpu_milli)
        if self.fgd is not None:
            cols.update(_prefixed(self.fgd._memo_rows_pairs(rows, jj, f_old, need, whole, cpu_milli)))
        return cols

    def _memo_row(self, rows: np.ndarray, after: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        """The usable share per type after the placement.

        Kept in float64: re-weighing kept rows is the hottest step of a busy
        cycle, and a float32 copy would be converted on every re-weighing.
        """
        su, ftot, usable = after
        return {"su": su.astype(np.float32), "ftot": ftot, "after": usable}

    def _memo_delta(self, table: MemoTable, idx: np.ndarray, rows: np.ndarray, prefix: str = "") -> np.ndarray:
        """Loss of usable share per candidate from kept after-states: only their weighing is redone.

        A kept state's usable share per type does not change, but the scarcity
        weights do (every WEIGHT_REFRESH commits), so each kept row also keeps
        its weighed sum and the weight version it was weighed with. The FGD
        term's columns sit in the same table.
        """
        cols = table.cols
        self.age_weights()
        version = table.declare("w_version", np.int64, -1)
        score = table.declare("score", np.float64, 0.0)
        stale = idx[version[idx] != self._w_version]
        if stale.size:
            score[stale] = cols["after"].take(stale, axis=0) @ self._w
            version[stale] = self._w_version
        delta = self._value_now[rows] - score[idx]
        if self.fgd is not None:
            delta = delta + self.lam * self.fgd._memo_delta(table, idx, rows, prefix=_FGD)
        ftot = cols["ftot"]
        self._ftot_after = ftot[idx]
        self._after = (cols["su"], ftot, cols["after"], idx)
        return delta


_FGD = "fgd_"


def _prefixed(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The FGD term's memo columns under its own names (its free share after is ours: kept once)."""
    return {_FGD + name: values for name, values in cols.items() if name != "ftot"}
