"""Allocated vs used over time, kept small: per job, 10 s buckets for a day, 5 min buckets for 90 days.

Each sample (:func:`gpupool.service.gpu_use.job_use`) adds, per running job,
what it held, what of that was measured and what was used, times the
seconds since the previous sample, to the job's open 10 s bucket in memory.
A closed bucket is written to the store's ``gpu_use`` table (``res`` 10);
once a 5 minute period is complete its 10 s rows are summed into one row per
job (``res`` 300) by SQL, so the roll-up survives a restart (the store keeps
how far it got). Old rows go by age: 10 s rows after ``fine_keep_s``, 5 min
rows after ``coarse_keep_s``.

Each bucket also gets one row for job number ``SAMPLED`` (0, no job's): the
seconds sampled in it, so a mean over a bucket divides by the time that was
sampled, not by its length.

Why per job and not per project: the jobs table already holds each job's
project, user and kind, so a row is seven integers, and every view (per
project, user, job; build and train apart) is a GROUP BY over one range.
Amounts are milli-GPU-seconds (integers; 1000 = one GPU for one second).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.service.gpu_use import JobUse
from gpupool.service.store import Store

FINE_S = 10
COARSE_S = 300
FINE_KEEP_S = 86400.0
COARSE_KEEP_S = 90 * 86400.0
MAX_GAP_S = 60.0
"""A longer gap between two samples (the service was stopped, the loop stalled) counts nothing: unknown.
The core passes ``max(MAX_GAP_S, 3 * tick_s)``, so a long tick still counts."""

_ROLLED = "gpu_use_rolled"
SAMPLED = 0
"""The job number of each bucket's clock row: ``alloc`` is the milliseconds sampled in it (job numbers start at
1). A bucket takes each interval between two samples by its middle, so with a 5 s tick a 10 s bucket may hold
5 or 15 s; a mean over time divides by this, not by the bucket's length (gpupool.service.use_series)."""


@dataclass
class Totals:
    """Sums over a range of one job: milli-GPU-seconds, and the peak bytes of GPU memory."""

    alloc: float = 0.0
    measured: float = 0.0
    used: float = 0.0
    peak_mem: int = 0

    def add(self, alloc: float, measured: float, used: float, peak_mem: int) -> None:
        self.alloc += alloc
        self.measured += measured
        self.used += used
        self.peak_mem = max(self.peak_mem, int(peak_mem))


class UseHistory:
    """The open buckets in memory and the ``gpu_use`` table behind them."""

    def __init__(self, store: Store, fine_s: int = FINE_S, coarse_s: int = COARSE_S,
                 fine_keep_s: float = FINE_KEEP_S, coarse_keep_s: float = COARSE_KEEP_S,
                 max_gap_s: float = MAX_GAP_S) -> None:
        if coarse_s % fine_s:
            raise ValueError("the coarse resolution must be a multiple of the fine one")
        self.store = store
        self.fine_s, self.coarse_s = int(fine_s), int(coarse_s)
        self.fine_keep_s, self.coarse_keep_s = float(fine_keep_s), float(coarse_keep_s)
        self._open: dict[tuple[int, int], Totals] = {}  # (bucket start, job num) -> sums
        self._last_t: float | None = None
        self.max_gap_s = float(max_gap_s)

    def add(self, now: float, uses: Mapping[int, JobUse]) -> float:
        """One sample at ``now``: each job's use (by job number) held since the previous sample.

        Returns the seconds counted (0 for the first sample, or one after a gap).
        """
        last, self._last_t = self._last_t, now
        if last is None or not 0 < now - last <= self.max_gap_s:
            return 0.0  # the first sample (or one after a gap) starts the count
        dt = now - last
        bucket = int((last + now) / 2 // self.fine_s) * self.fine_s  # the bucket the interval [last, now) is in
        for num, u in uses.items():
            tot = self._open.setdefault((bucket, num), Totals())
            tot.add(u.alloc * dt, u.measured * dt, u.used * dt, u.memory)
        self._open.setdefault((bucket, SAMPLED), Totals()).add(dt * 1000.0, 0.0, 0.0, 0)
        return dt

    def flush(self, now: float, everything: bool = False) -> None:
        """Write the closed 10 s buckets (``everything``: the open ones too, at a stop), roll complete 5 min
        periods up, drop what is past keeping."""
        closed = [k for k in self._open if everything or k[0] + self.fine_s <= now]
        if closed:
            rows = [(self.fine_s, t, num, round(v.alloc), round(v.measured), round(v.used), v.peak_mem)
                    for (t, num) in closed for v in (self._open.pop((t, num)),)]
            with self.store.transaction() as db:
                db.executemany(_UPSERT, rows)
        self._roll_up(int(now // self.fine_s) * self.fine_s)

    def _roll_up(self, fine_done: int) -> None:
        """Sum every complete 5 min period's 10 s rows into 5 min rows (then trim: once per period)."""
        done = fine_done // self.coarse_s * self.coarse_s
        rolled = int(self.store.get_meta(_ROLLED) or 0)
        if done <= rolled:
            return
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO gpu_use(res, t, job, alloc, measured, used, peak_mem) "
                "SELECT ?, (t / ?) * ?, job, SUM(alloc), SUM(measured), SUM(used), MAX(peak_mem) FROM gpu_use "
                "WHERE res = ? AND t >= ? AND t < ? GROUP BY t / ?, job " + _ON_CONFLICT,
                (self.coarse_s, self.coarse_s, self.coarse_s, self.fine_s, rolled, done, self.coarse_s))
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                       "value=excluded.value", (_ROLLED, str(done)))
            db.execute("DELETE FROM gpu_use WHERE res = ? AND t < ?", (self.fine_s, int(done - self.fine_keep_s)))
            db.execute("DELETE FROM gpu_use WHERE res = ? AND t < ?",
                       (self.coarse_s, int(done - self.coarse_keep_s)))

    @property
    def last_sample_t(self) -> float | None:
        """When the last sample was counted (None before the first): how far the figures reach."""
        return self._last_t

    def ranges(self, since: float, now: float) -> list[tuple[int, int, int]]:
        """Which rows answer for ``[since, now)``: ``(res, from, to)`` per resolution, none empty.

        Within the last ``fine_keep_s`` the 10 s rows; further back the 5 min
        rows up to the last roll-up (never past the current 5 min period), the
        10 s rows from there on. A range start is rounded down to its bucket.
        """
        fine_from = now - self.fine_keep_s + self.fine_s
        coarse_end = int(now // self.coarse_s) * self.coarse_s
        rolled = int(self.store.get_meta(_ROLLED) or 0)
        split = max(min(coarse_end, rolled), int(since // self.coarse_s) * self.coarse_s)
        if since >= fine_from:
            parts = [(self.fine_s, int(since // self.fine_s) * self.fine_s, math.ceil(now))]
        else:
            parts = [(self.coarse_s, int(since // self.coarse_s) * self.coarse_s, split),
                     (self.fine_s, split, math.ceil(now))]
        return [(res, lo, hi) for res, lo, hi in parts if hi > lo]

    def unwritten(self) -> list[tuple[int, int, Totals]]:
        """The 10 s buckets not in the store yet (the open one, closed ones until the next flush):
        ``(start, job num, sums)``; a reader that wants the last seconds adds these to its rows."""
        return [(t, num, v) for (t, num), v in self._open.items()]

    def totals(self, since: float, until: float | None = None) -> dict[int, Totals]:
        """Per job number, the sums over ``[since, until)`` (default: up to now, open buckets included).

        Within the last ``fine_keep_s`` the 10 s rows answer; further back the
        5 min rows do, up to the start of the current 5 min period, and the 10 s
        rows from there on. A range start is rounded down to its bucket.
        """
        now = time.time() if until is None else until
        out: dict[int, Totals] = {}
        for res, lo, hi in self.ranges(since, now):
            for r in self.store.query(
                    "SELECT job, SUM(alloc), SUM(measured), SUM(used), MAX(peak_mem) FROM gpu_use "
                    "WHERE res = ? AND t >= ? AND t < ? GROUP BY job", (res, lo, hi)):
                out.setdefault(int(r[0]), Totals()).add(float(r[1]), float(r[2]), float(r[3]), int(r[4]))
        for (t, num), v in self._open.items():
            if since - self.fine_s < t < now:
                out.setdefault(num, Totals()).add(v.alloc, v.measured, v.used, v.peak_mem)
        return out


_ON_CONFLICT = ("ON CONFLICT(res, t, job) DO UPDATE SET alloc = alloc + excluded.alloc, "
                "measured = measured + excluded.measured, used = used + excluded.used, "
                "peak_mem = MAX(peak_mem, excluded.peak_mem)")
_UPSERT = ("INSERT INTO gpu_use(res, t, job, alloc, measured, used, peak_mem) VALUES (?, ?, ?, ?, ?, ?, ?) "
           + _ON_CONFLICT)
