"""What a scheduling cycle reads of the live jobs, kept up to date per changed job instead of rebuilt.

With 10,000 live jobs a cycle used to sort every record by number, rebuild the
policy's workload list record by record and re-add every running job's GPU
shares, although between two cycles only the jobs that changed differ. This
view keeps, in job-number order, each live job's workloads as the cycle shows
them to the policy and each running job's GPU shares, and recomputes an entry
only for the jobs marked changed (:meth:`LiveView.touch`, called by the core on
every write to a job) since the last read. A full rebuild happens after
:meth:`LiveView.reset` (the core reloaded its mirror) or when a job shows up
out of number order.

Every read first applies the pending changes, so what it returns is what a
rebuild from the records would give at that moment: the double-booking guard
gets the same ``used`` map as summing every running job's assignment.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

from gpupool.policy.model import Workload
from gpupool.service.jobs import assigned_gpus
from gpupool.service.store import JobRecord

Shown = Callable[[JobRecord], tuple[Workload, ...]]
"""A live job's workloads in the cycle's snapshot (() for a job the policy must not see)."""


def gpu_shares(rec: JobRecord) -> tuple[tuple[str, int], ...]:
    """(GPU id, milli) a job holds: its assignment's shares while running, none otherwise."""
    if rec.state != "running":
        return ()
    return tuple((g["id"], int(g["milli"])) for g in assigned_gpus(rec))


class LiveView:
    """Per-job pieces of the cycle's input, in job-number order, refreshed for changed jobs only."""

    def __init__(self) -> None:
        self._shown: dict[str, tuple[Workload, ...]] = {}  # every live job, in number order
        self._shares: dict[str, tuple[tuple[str, int], ...]] = {}  # running jobs only
        self._used: dict[str, int] = {}
        self._flat: tuple[Workload, ...] | None = None
        self._last_num = -1
        self._dirty: set[str] = set()
        self._stale = True

    def reset(self) -> None:
        """Rebuild everything at the next read (the mirror of live jobs was replaced)."""
        self._stale = True
        self._dirty.clear()

    def touch(self, job_id: str) -> None:
        """A job was added, changed or left the live set: recompute its entries at the next read."""
        if not self._stale:
            self._dirty.add(job_id)

    def _rebuild(self, live: dict[str, JobRecord], shown: Shown) -> None:
        self._shown, self._shares, self._used, self._flat = {}, {}, {}, None
        self._last_num = -1
        for rec in sorted(live.values(), key=lambda r: r.num):
            self._add(rec, shown)
        self._dirty.clear()
        self._stale = False

    def _add(self, rec: JobRecord, shown: Shown) -> None:
        self._shown[rec.id] = shown(rec)
        self._last_num = rec.num
        self._set_shares(rec.id, gpu_shares(rec))

    def _set_shares(self, job_id: str, new: tuple[tuple[str, int], ...]) -> None:
        used = self._used
        for gid, m in self._shares.pop(job_id, ()):
            left = used[gid] - m
            if left:
                used[gid] = left
            else:
                del used[gid]
        if new:
            self._shares[job_id] = new
            for gid, m in new:
                used[gid] = used.get(gid, 0) + m

    def sync(self, live: dict[str, JobRecord], shown: Shown) -> None:
        """Apply the changes marked since the last read (everything after :meth:`reset`)."""
        if self._stale:
            self._rebuild(live, shown)
            return
        if not self._dirty:
            if len(self._shown) != len(live):  # a change went unmarked: never hand out a partial view
                self._rebuild(live, shown)
            return
        dirty, self._dirty = self._dirty, set()
        self._flat = None
        new: list[JobRecord] = []
        for job_id in dirty:
            rec = live.get(job_id)
            if rec is None:
                self._shown.pop(job_id, None)
                self._set_shares(job_id, ())
            elif job_id in self._shown:
                self._shown[job_id] = shown(rec)
                self._set_shares(job_id, gpu_shares(rec))
            else:
                new.append(rec)
        if new:
            new.sort(key=lambda r: r.num)
            if new[0].num <= self._last_num:  # not after every job we hold: keep number order by rebuilding
                self._rebuild(live, shown)
                return
            for rec in new:
                self._add(rec, shown)
        if len(self._shown) != len(live):  # a change went unmarked: never hand out a partial view
            self._rebuild(live, shown)

    def workloads(self, live: dict[str, JobRecord], shown: Shown) -> tuple[Workload, ...]:
        """Every live job's shown workloads, jobs in number order."""
        self.sync(live, shown)
        if self._flat is None:
            self._flat = tuple(chain.from_iterable(self._shown.values()))
        return self._flat

    def used(self, live: dict[str, JobRecord], shown: Shown) -> dict[str, int]:
        """Milli-GPU held per GPU by the running jobs (a copy the caller may add to)."""
        self.sync(live, shown)
        return dict(self._used)

    def ordered(self, live: dict[str, JobRecord], shown: Shown) -> list[JobRecord]:
        """The live jobs in number order."""
        self.sync(live, shown)
        return [live[job_id] for job_id in self._shown]
