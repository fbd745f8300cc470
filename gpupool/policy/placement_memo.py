"""Per-request memo of what the placement scorers computed for a node state.

Within one cycle the engine asks the scorers about the same request again and
again (thousands of one-GPU jobs), each time over the few hundred distinct
node states that can take it. Between two such questions only the nodes
committed to in between changed, so almost every (request, node state) pair
was already scored. What a scorer derives from a node's state after the
placement (the free share each request type could still use, the free share
left) does not depend on which node is in that state, only on the state, so it
is kept here under the state's key (:meth:`FreeState._key_of`) and only states
new to the request are computed. On a cluster of identical nodes filling up
this cuts the scoring work about twentyfold (docs/benchmarks-history.md).

State keys are small dense integers, so a table is a plain index array from
key to storage row: a lookup for the whole candidate list is one gather, an
insert one scatter. A fraction lands on one GPU of a node; its key is
``state * span + r`` where ``r`` (below ``span``, the widest node's GPU count)
tells the node's distinct free shares apart.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class MemoTable:
    """Columns of per-state values for one request, addressed by dense integer key."""

    def __init__(self, span: int) -> None:
        self.span = span
        self.slot_of = np.full(0, -1, dtype=np.int32)  # key -> storage row (-1: not kept)
        self.cols: dict[str, np.ndarray] = {}
        self.fills: dict[str, float] = {}  # columns filled in later: their value for new rows
        self.size = 0
        self.capacity = 0  # rows every column has room for

    def lookup(self, keys: np.ndarray, n_states: int) -> np.ndarray:
        """Storage row of each key (keys of states below ``n_states``), -1 where none is kept."""
        need = n_states * self.span
        if len(self.slot_of) < need:
            grown = np.full(max(need, 2 * len(self.slot_of)), -1, dtype=np.int32)
            grown[: len(self.slot_of)] = self.slot_of
            self.slot_of = grown
        return self.slot_of[keys].astype(np.int64)

    def declare(self, name: str, dtype: type, fill: float) -> np.ndarray:
        """A column the scorer fills in later (e.g. a weighed score); new rows start at ``fill``."""
        col = self.cols.get(name)
        if col is None:
            self.fills[name] = fill
            col = self.cols[name] = np.full(self.capacity, fill, dtype=dtype)
        return col

    def add(self, keys: np.ndarray, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Keep one row of ``cols`` per key (keys not kept yet; a repeated key keeps its last row).

        Every call passes the same columns (besides the declared ones). Returns
        the storage rows used, in the order of ``keys``.
        """
        start = self.size
        need = start + len(keys)
        if need > self.capacity:
            self._grow(need, cols)
        store = self.cols
        for name, values in cols.items():
            store[name][start:need] = values
        store["key"][start:need] = keys
        rows = np.arange(start, need, dtype=np.int64)
        self.slot_of[keys] = rows
        self.size = need
        return rows

    def _grow(self, need: int, like: dict[str, np.ndarray]) -> None:
        """Room for at least ``need`` rows in every column (declared ones filled with their fill)."""
        capacity = max(need, 2 * self.capacity, 64)
        shapes = {name: (values.shape[1:], values.dtype) for name, values in like.items()}
        shapes["key"] = ((), np.dtype(np.int64))
        for name, col in self.cols.items():
            shapes.setdefault(name, (col.shape[1:], col.dtype))
        for name, (tail, dtype) in shapes.items():
            grown = self._column(name, capacity, tail, dtype)
            old = self.cols.get(name)
            if old is not None:
                grown[: self.size] = old[: self.size]
            self.cols[name] = grown
        self.capacity = capacity

    def _column(self, name: str, capacity: int, tail: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new column of ``capacity`` rows: a declared one holds its fill in rows not in use, so new rows
        need no write; the others are left uninitialised (every add writes them)."""
        if name in self.fills:
            return np.full((capacity,) + tail, self.fills[name], dtype=dtype)
        return np.empty((capacity,) + tail, dtype=dtype)

    def prune(self, live: np.ndarray) -> None:
        """Forget the rows of states no node is in any more (compacting the columns).

        ``live[state]``: whether some node is in that state now.
        """
        keys = self.cols["key"][: self.size]
        alive = live[keys // self.span] & (self.slot_of[keys] == np.arange(self.size))
        rows = np.flatnonzero(alive)
        size = len(rows)
        # room to grow by half again (most tables keep being added to), so the next adds copy nothing
        capacity = size + max(size // 2, 64)
        for name, col in self.cols.items():
            kept = self._column(name, capacity, col.shape[1:], col.dtype)
            kept[:size] = col[rows]
            self.cols[name] = kept
        # only the kept keys' entries are set: clearing them, not the whole index (sized by every
        # state id the cycle made), keeps a sweep proportional to the memo
        self.slot_of[keys] = -1
        self.size, self.capacity = size, capacity
        self.slot_of[self.cols["key"][:size]] = np.arange(size, dtype=np.int32)


class ScoreMemo:
    """The memo tables of one scorer: one per request, all dropped when its tables change.

    Nodes leave states all the time as work lands on them, so rows go stale
    for good; once the tables hold twice the rows they held after the last
    sweep (and at least ``PRUNE_MIN``), every table forgets the states no node
    is in. That bounds the memo by the live states rather than by the cycle's
    length (docs/benchmarks-history.md gives the peak).
    """

    PRUNE_MIN = 8192

    def __init__(self) -> None:
        self.tables: dict[object, MemoTable] = {}
        self.rows = 0
        self.prune_at = self.PRUNE_MIN

    def clear(self) -> None:
        self.tables.clear()
        self.rows = 0
        self.prune_at = self.PRUNE_MIN

    def added(self, n: int, live_states: Callable[[], np.ndarray]) -> bool:
        """Count ``n`` new rows; sweep every table when due. Returns whether rows moved."""
        self.rows += n
        if self.rows < self.prune_at:
            return False
        states = live_states()
        # one yes/no per state id any table may hold (every key is below its table's index length)
        known = max((-(-len(t.slot_of) // t.span) for t in self.tables.values()), default=0)
        live = np.zeros(max(known, int(states[-1]) + 1 if states.size else 0), dtype=bool)
        live[states] = True
        for table in self.tables.values():
            table.prune(live)
        self.rows = sum(t.size for t in self.tables.values())
        self.prune_at = max(self.PRUNE_MIN, 2 * self.rows)
        return True

    def table(self, request: object, span: int) -> MemoTable:
        t = self.tables.get(request)
        if t is None:
            t = self.tables[request] = MemoTable(span)
        return t
