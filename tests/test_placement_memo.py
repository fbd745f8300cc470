"""The placement memo's tables: rows found by key, and sweeps that forget only dead states."""

from __future__ import annotations

import numpy as np

from gpupool.policy.placement_memo import MemoTable, ScoreMemo


def _table(keys: list[int], span: int = 2) -> MemoTable:
    t = MemoTable(span)
    t.lookup(np.array(keys, dtype=np.int64), n_states=10)
    t.add(np.array(keys, dtype=np.int64), {"v": np.array([float(k) for k in keys])})
    return t


def test_lookup_finds_added_rows_and_misses_others() -> None:
    t = _table([0, 3, 7])
    rows = t.lookup(np.array([7, 1, 0, 3]), n_states=10)
    assert rows[1] == -1
    assert t.cols["v"][rows[[0, 2, 3]]].tolist() == [7.0, 0.0, 3.0]


def test_prune_keeps_live_states_and_forgets_dead_ones() -> None:
    # span 2: key k belongs to state k // 2
    t = _table([0, 1, 4, 5, 9])
    live = np.zeros(10, dtype=bool)
    live[[0, 4]] = True  # states 0 (keys 0, 1) and 4 (key 9) live; state 2 (keys 4, 5) gone
    t.prune(live)
    assert t.size == 3
    rows = t.lookup(np.array([0, 1, 4, 5, 9]), n_states=10)
    assert rows[2] == rows[3] == -1  # forgotten
    assert t.cols["v"][rows[[0, 1, 4]]].tolist() == [0.0, 1.0, 9.0]
    # the index holds nothing but the kept rows
    assert sorted(np.flatnonzero(t.slot_of >= 0).tolist()) == [0, 1, 9]


def test_a_re_added_key_keeps_its_last_row_through_a_prune() -> None:
    t = _table([2, 3])
    t.add(np.array([2]), {"v": np.array([20.0])})  # key 2 re-added: the newer row wins
    live = np.ones(5, dtype=bool)
    t.prune(live)
    rows = t.lookup(np.array([2, 3]), n_states=5)
    assert t.size == 2
    assert t.cols["v"][rows].tolist() == [20.0, 3.0]


def test_score_memo_sweeps_every_table_once_due() -> None:
    memo = ScoreMemo()
    memo.PRUNE_MIN = 4
    memo.prune_at = 4
    a, b = memo.table("a", 1), memo.table("b", 1)
    for t, keys in ((a, [0, 1, 2]), (b, [1, 3])):
        t.lookup(np.array(keys), n_states=4)
        t.add(np.array(keys), {"v": np.zeros(len(keys))})
    assert not memo.added(3, lambda: np.array([1]))
    assert memo.added(2, lambda: np.array([1]))  # 5 rows >= 4: swept, only state 1 survives
    assert a.size == b.size == 1
    assert memo.rows == 2
    assert a.lookup(np.array([0, 1, 2]), n_states=4).tolist()[::2] == [-1, -1]
