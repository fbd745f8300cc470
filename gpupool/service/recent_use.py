"""Each running job's recent use, the figure the Lab status bar shows ("GPU ¼ · 37 % busy").

Why a minute: long enough to smooth one sample's noise (NVML's per-process
figure is itself a mean since its last read; a tick is 5 s), short enough
that starting or ending a cell shows within a minute. The window is the 10 s
buckets of :class:`gpupool.service.use_history.UseHistory` that began in the
last ``RECENT_S`` seconds (the one holding the window's start included, so
60 to 70 s), the buckets not written yet too.

The figures are ratios, so a job that started 20 s ago is not shown as less
busy than it is:

- ``busy``: used over measured, the part of its share its processes kept
  busy where they could be measured; None when nothing was measured (a GPU
  without per-process accounting, a pod without a node agent): *unmeasured
  is not idle*, and a view says "no use data", never 0 %.
- ``measured``: measured over allocated, the part of its holding that could be
  measured (1.0 on simulated GPUs and NVML with per-process accounting).
- ``peak_memory``: the most GPU memory its processes held in one sample.

A job with no sample in the window (it started a moment ago, or the service
does not sample) has no figures (None). One read of the store answers every
job for up to ``max_age_s`` (a list of 10,000 jobs is one query, not 10,000).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpupool.service.store import JobRecord
from gpupool.service.use_history import Totals, UseHistory

RECENT_S = 60.0


def figures(t: Totals, window_s: float) -> dict[str, Any] | None:
    """The wire ``recent_use`` of one job's sums over the window; None when it held nothing in it."""
    if t.alloc <= 0:
        return None
    return {
        "window_s": window_s,
        "busy": round(min(1.0, t.used / t.measured), 4) if t.measured > 0 else None,
        "measured": round(min(1.0, t.measured / t.alloc), 4),
        "peak_memory": t.peak_mem,
    }


class RecentUse:
    """The last minute's sums per job number, read from the history at most every ``max_age_s``."""

    def __init__(self, history: UseHistory, window_s: float = RECENT_S, max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.history = history
        self.window_s = float(window_s)
        self.max_age_s = float(max_age_s)
        self.clock = clock
        self._read_at: float | None = None
        self._sums: dict[int, Totals] = {}

    def sums(self) -> dict[int, Totals]:
        """Per job number, what it held, measured and used in the window (milli-GPU-seconds)."""
        now = self.clock()
        if self._read_at is None or not 0 <= now - self._read_at < self.max_age_s:
            self._sums = self.history.totals(now - self.window_s, now)
            self._read_at = now
        return self._sums

    def of(self, rec: JobRecord) -> dict[str, Any] | None:
        """The job's ``recent_use`` (None unless it runs and was sampled in the window)."""
        if rec.state != "running":
            return None
        t = self.sums().get(rec.num)
        return None if t is None else figures(t, self.window_s)
