"""What the allocated-vs-used views cost the scheduler (issue 26, item 3): the panel's series, the jobs' recent use.

Run: ``python -m bench.use_views``. Prints one table.

The store is the one ``bench.utilisation`` builds: 1,000 jobs over 90 days in
20 projects (5 min rows, and the 10 s rows of the last day), with the clock
rows the history keeps per bucket. Timed in-process as CPU time
(``time.process_time``: the service's own work, steady on a busy machine),
median of 5 reads:

1. **Series**: :func:`gpupool.service.use_series.build_series` by project, as
   the Lab panel asks it for its ranges (last hour, day, 7 and 30 days, and 90
   days), by an admin (every project).
2. **Recent use**: :meth:`gpupool.service.recent_use.RecentUse.sums`, the one
   read behind every job's ``recent_use`` in a ``GET /jobs`` (the cache
   emptied each time), with 1,000 jobs sampled over the last minute.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.utilisation import history_store
from gpupool.service.actor import Actor
from gpupool.service.recent_use import RecentUse
from gpupool.service.store import Store
from gpupool.service.use_history import SAMPLED, UseHistory
from gpupool.service.use_series import build_series

RANGES = (("last hour", 3600), ("last day", 86400), ("last 7 days", 7 * 86400), ("last 30 days", 30 * 86400),
          ("last 90 days", 90 * 86400))


def _median(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _series(admin: Actor, history: UseHistory, store: Store, span: int) -> dict[str, Any]:
    return build_series(admin, history, store, {}, since=time.time() - span)


def _clock_rows(store: Store, days: int = 90) -> None:
    """The history's clock rows over the range: one per 5 min bucket, and per 10 s bucket of the last day."""
    end = time.time() // 300 * 300
    rows = [(300, int(b), SAMPLED, 300_000, 0, 0, 0) for b in range(int(end - days * 86400), int(end), 300)]
    rows += [(10, int(b), SAMPLED, 10_000, 0, 0, 0) for b in range(int(end - 86400), int(end), 10)]
    with store.transaction() as db:
        db.executemany("INSERT OR REPLACE INTO gpu_use VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _last_minute(store: Store) -> None:
    """1,000 jobs' 10 s rows over the last minute (as if all ran now)."""
    now = time.time() // 10 * 10
    rows = [(10, int(now - 10 * k), num, 2500, 2500, 1000, 1 << 30) for num in range(1, 1001) for k in range(1, 8)]
    with store.transaction() as db:
        db.executemany("INSERT OR REPLACE INTO gpu_use VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def main() -> int:
    admin = Actor("admin", admin=True)
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        history_store(state)
        store = Store(state / "state.db")
        _clock_rows(store)
        history = UseHistory(store)
        history.add(time.time(), {})  # the service has sampled: the series ends at its last sample
        for label, span in RANGES:
            seconds = _median(partial(_series, admin, history, store, span))
            reply = _series(admin, history, store, span)
            points = len(reply["series"][0]["t"]) if reply["series"] else 0
            rows.append((f"series by project, {label}", f"{seconds * 1000:.1f} ms",
                         f"{len(reply['series'])} series x {points} points, step {reply['step']} s"))
        _last_minute(store)
        recent = RecentUse(history, max_age_s=0)
        seconds = _median(recent.sums)
        rows.append(("recent use of every job (one read)", f"{seconds * 1000:.1f} ms",
                     f"{len(recent.sums())} jobs with rows in the last minute"))
        store.close()
    widths = [max(len(r[i]) for r in [("what", "CPU, median of 5", "detail"), *rows]) for i in range(3)]
    for r in [("what", "CPU, median of 5", "detail"), *rows]:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
