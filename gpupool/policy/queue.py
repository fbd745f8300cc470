"""The order in which pending training jobs are considered.

Order: higher priority first; among equal priorities, the project furthest
below its fair share (smallest usage / share) first; then earlier submission;
then workload id. A project's usage changes while the cycle places its jobs
(and when reclaim pauses its jobs), so its rank is recomputed: each project
keeps its own queue, and a heap holds one entry per project, keyed by the
project's head job and its current usage ratio. Stale entries are skipped by
a version number. Cost: O(log projects) per job.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from operator import attrgetter

from gpupool.policy.model import Workload


def job_order(w: Workload) -> tuple[int, float, str]:
    """Within one project: higher priority, then earlier submission, then id."""
    return (-w.priority, w.submitted_at, w.id)


_by_id = attrgetter("id")
_by_submission = attrgetter("submitted_at")
_by_priority = attrgetter("priority")


class FairQueue:
    """Pending jobs of many projects, popped in fair order."""

    def __init__(self, jobs: Iterable[Workload], ratio: Callable[[str], float]) -> None:
        per_project: dict[str, list[Workload]] = {}
        for w in jobs:
            per_project.setdefault(w.project, []).append(w)
        for queue in per_project.values():
            # job_order as three stable C-level sorts (last key first): several times faster than
            # one sort calling job_order for each of ten thousand jobs
            queue.sort(key=_by_id)
            queue.sort(key=_by_submission)
            queue.sort(key=_by_priority, reverse=True)  # reverse keeps equal keys in order
        self._jobs = per_project
        self._pos = dict.fromkeys(per_project, 0)
        self._version = dict.fromkeys(per_project, 0)
        self._ratio = ratio
        self._heap: list[tuple[int, float, float, str, str, int]] = []
        # The last touched project's entry is held back: most of the time it is still the smallest
        # (its usage did not change), and heappushpop then hands it back without touching the heap.
        self._carry: tuple[int, float, float, str, str, int] | None = None
        self._popped_ratio = 0.0  # the ratio in the last popped job's entry
        for name in sorted(per_project):
            self._push(name)

    def _entry(self, name: str) -> tuple[int, float, float, str, str, int] | None:
        pos = self._pos[name]
        queue = self._jobs[name]
        if pos >= len(queue):
            return None
        head = queue[pos]
        return (-head.priority, self._ratio(name), head.submitted_at, head.id, name, self._version[name])

    def _push(self, name: str) -> None:
        entry = self._entry(name)
        if entry is not None:
            heapq.heappush(self._heap, entry)

    def pop(self) -> Workload | None:
        """The next job, or None when all are taken. Call :meth:`touch` on its project afterwards."""
        heap = self._heap
        version = self._version
        while True:
            carry = self._carry
            if carry is not None:
                self._carry = None
                entry = heapq.heappushpop(heap, carry) if heap else carry
            elif heap:
                entry = heapq.heappop(heap)
            else:
                return None
            name = entry[4]
            if entry[5] != version[name]:
                continue
            version[name] += 1
            pos = self._pos[name]
            self._pos[name] = pos + 1
            self._popped_ratio = entry[1]
            return self._jobs[name][pos]

    def advance(self, name: str, same: bool) -> Workload | None:
        """:meth:`touch` for the project whose job was just popped, then :meth:`pop`, in one call.

        The training pass calls this once per pending job, most of them
        answered from a memo: one call instead of two, and the project's next
        head goes straight into the heap's push-pop.
        """
        heap, version = self._heap, self._version
        v = version[name] = version[name] + 1
        carry = self._carry
        self._carry = None
        pos = self._pos[name]
        queue = self._jobs[name]
        if pos < len(queue):
            head = queue[pos]
            ratio = self._popped_ratio if same else self._ratio(name)
            entry = (-head.priority, ratio, head.submitted_at, head.id, name, v)
            if carry is not None:
                heapq.heappush(heap, carry)
            if heap:
                entry = heapq.heappushpop(heap, entry)
        elif carry is not None:
            entry = heapq.heappushpop(heap, carry) if heap else carry
        elif heap:
            entry = heapq.heappop(heap)
        else:
            return None
        while entry[5] != version[entry[4]]:  # (a stale entry: its project was re-ranked since)
            if not heap:
                return None
            entry = heapq.heappop(heap)
        name = entry[4]
        version[name] += 1
        pos = self._pos[name]
        self._pos[name] = pos + 1
        self._popped_ratio = entry[1]
        return self._jobs[name][pos]

    def touch(self, name: str, same: bool = False) -> None:
        """The project's usage changed (or its head was taken): re-rank it.

        ``same``: the caller knows the project's ratio is what it was when its
        job was last popped (its usage did not change: the job waited), so it
        is not computed again (this runs once per pending job).
        """
        version = self._version
        v = version.get(name)
        if v is None:
            return
        v = version[name] = v + 1
        if self._carry is not None:
            heapq.heappush(self._heap, self._carry)
        # _entry inlined: this runs once per pending job
        pos = self._pos[name]
        queue = self._jobs[name]
        if pos >= len(queue):
            self._carry = None
            return
        head = queue[pos]
        ratio = self._popped_ratio if same else self._ratio(name)
        self._carry = (-head.priority, ratio, head.submitted_at, head.id, name, v)
