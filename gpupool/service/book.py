"""The one store the core's parts share: durable jobs and projects, their live mirror, and the event log.

Every part of the core (the jobs API, the cycle, the attempts, the periodic
work) reads and writes jobs through one :class:`JobBook`, so the rules that
keep the mirror true live in one place: every write goes to the store first
(durable), then to the mirror; a change and its event are written in one
transaction; final jobs leave the mirror. The live jobs (queued, running,
paused) are mirrored in memory so a cycle does not re-read and re-decode
every pending job from SQLite.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.policy.model import Workload
from gpupool.service.jobs import held_milli, workloads_of
from gpupool.service.live_view import LiveView
from gpupool.service.store import LIVE_STATES, JobRecord, ProjectRecord, Store
from gpupool.service.usage import DecayedUsage
from gpupool.wire.errors import InvalidRequest

_WORKLOAD_FIELDS = frozenset({"state", "assignment", "started_at", "attempts", "paused_at", "priority", "request",
                              "project", "kind", "submitted_at"})
"""Job fields the policy's Workload is built from; other changes (reason, pid...) keep the cached one."""


@dataclass
class Lifecycle:
    """Where the core is in its life, read by every part: work is done only between start and stop."""

    started: bool = False
    closing: bool = False


class JobBook:
    """The store, the live-job mirror kept from it, the projects and the event log (one per core)."""

    def __init__(self, store: Store, usage: DecayedUsage, life: Lifecycle) -> None:
        self.store = store
        self.usage = usage
        """Each project's decayed GPU use; counted up to now whenever what it holds changes."""
        self.life = life
        self.live: dict[str, JobRecord] = {}
        self.view = LiveView()
        self.workloads: dict[str, tuple[Workload, ...]] = {}
        self.held: dict[tuple[str, str], int] = {}
        """Milli-GPU held now by running jobs, per (project, kind)."""
        self.holding: set[str] = set()
        """Jobs the policy does not see until their held_until (a refused pod)."""
        self.last_event_seq: int = store.last_event_seq()
        self.new_events: asyncio.Event | None = None
        self._project_cache: dict[str, ProjectRecord] | None = None
        self.reload()

    # ================================================================ live-job mirror
    def reload(self) -> None:
        """Rebuild the mirror from the store (at start, and after a transaction that may have rolled back)."""
        self.live = {r.id: r for r in self.store.jobs(LIVE_STATES)}
        self.workloads = {}
        self.view.reset()
        self.usage.accrue(time.time(), self.held)  # what was held until now, then what the store says
        self.held = {}
        for rec in self.live.values():
            if rec.state == "running":
                key = (rec.project, rec.kind)
                self.held[key] = self.held.get(key, 0) + held_milli(rec)

    def _held_changes(self, rec: JobRecord, assignment: dict[str, Any] | None) -> None:
        """A live job's assignment is about to change: count the use so far, then what its project holds now."""
        new = sum(int(g["milli"]) for g in (assignment or {}).get("gpus", []))
        old = held_milli(rec)
        if new == old:
            return
        now = time.time()
        # A cycle that starts thousands of jobs changes the sums thousands of times within
        # milliseconds: count up to now at most every 0.1 s (each change is then off by < 0.1 s
        # of its share), so the cost stays O(projects) per 0.1 s, not per start.
        if now - self.usage.t >= 0.1:
            self.usage.accrue(now, self.held)
        key = (rec.project, rec.kind)
        self.held[key] = self.held.get(key, 0) + new - old

    def workloads_of(self, rec: JobRecord) -> tuple[Workload, ...]:
        """The policy view of a live job (one workload per replica for a gang), rebuilt only after it changed."""
        w = self.workloads.get(rec.id)
        if w is None:
            w = self.workloads[rec.id] = workloads_of(rec)
        return w

    def shown(self, rec: JobRecord) -> tuple[Workload, ...]:
        """A live job's workloads in the cycle's snapshot: none for a user-paused or a stopping job.

        User-paused jobs (sticky) are left out; so are jobs already being
        stopped: they are leaving, and showing them as running would make the
        policy preempt a second victim for the same waiting job during the grace.
        """
        if (rec.state == "paused" and rec.user_paused) or rec.stop_intent is not None:
            return ()
        if rec.held_until is not None and rec.state != "running" and time.time() < rec.held_until:
            self.holding.add(rec.id)  # shown again by the first cycle after its hold (release_holds)
            return ()
        return self.workloads_of(rec)

    def release_holds(self) -> None:
        """Jobs whose hold (after a refused pod) is over are shown to the policy again from this cycle on."""
        now = time.time()
        for job_id in list(self.holding):
            rec = self.live.get(job_id)
            if rec is None or rec.held_until is None or rec.held_until <= now:
                self.holding.discard(job_id)
                self.view.touch(job_id)

    def update(self, job_id: str, **changes: Any) -> None:
        """Write a job's change: the store first, then the mirror (a final job leaves it)."""
        self.store.update_job(job_id, **changes)
        self.view.touch(job_id)  # every write: the cycle's view recomputes this job's entries
        if not _WORKLOAD_FIELDS.isdisjoint(changes):
            self.workloads.pop(job_id, None)
        rec = self.live.get(job_id)
        if rec is None:
            return
        if "assignment" in changes:
            self._held_changes(rec, changes["assignment"])
        for k, v in changes.items():
            setattr(rec, k, v)
        if not rec.live:
            del self.live[job_id]

    def transition(self, job_id: str, **changes: Any) -> None:
        """Write a job's change and its event in one transaction.

        A service killed between the two would otherwise leave a state that no
        event ever announced (a job running, and no ``running`` event).
        """
        with self.store.transaction():
            self.update(job_id, **changes)
            self.emit_job(job_id)

    def insert_new_job(self, make: Callable[[str, int], JobRecord]) -> JobRecord:
        """Number, store and announce a new queued job (``make(job_id, num)`` builds its record), in one transaction.

        The event is written in the same transaction as the job: one disk sync per submit.
        """
        with self.store.transaction():
            num = self.store.next_job_number()
            rec = make(f"j-{num:06d}", num)
            self.store.insert_job(rec)
            self.live[rec.id] = rec
            self.view.touch(rec.id)
            self.emit_job(rec.id)
        return rec

    def job(self, job_id: str) -> JobRecord | None:
        rec = self.live.get(job_id)
        return rec if rec is not None else self.store.job(job_id)

    def live_jobs(self, states: tuple[str, ...] = LIVE_STATES, kind: str | None = None,
                  project: str | None = None) -> list[JobRecord]:
        """Live jobs in number order (kept in order by the view, not sorted per call)."""
        return [r for r in self.view.ordered(self.live, self.shown)
                if r.state in states and (kind is None or r.kind == kind) and (project is None or r.project == project)]

    # ================================================================ projects
    def projects(self) -> dict[str, ProjectRecord]:
        """Projects by name, in name order: read from the store once, dropped whenever one changes."""
        if self._project_cache is None:
            self._project_cache = {p.name: p for p in self.store.projects()}
        return self._project_cache

    def projects_changed(self) -> None:
        """A project was written: the next read goes to the store."""
        self._project_cache = None

    # ================================================================ events
    def emit(self, type_: str, **fields: Any) -> int:
        seq = self.store.add_event(time.time(), {"type": type_, **fields})
        self.last_event_seq = seq
        if self.new_events is not None:
            self.new_events.set()
            self.new_events = asyncio.Event()
        return seq

    def emit_job(self, job_id: str) -> None:
        rec = self.job(job_id)
        if rec is not None:
            self.emit("job", job_id=rec.id, state=rec.state, reason=rec.reason, user=rec.user, project=rec.project,
                      kind=rec.kind)

    def events_since(self, seq: int) -> list[dict[str, Any]]:
        """Events after ``seq`` (at most 1000), oldest first."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidRequest("since must be an integer event sequence number")
        return self.store.events_since(seq)

    async def wait_events(self, seq: int, timeout: float) -> list[dict[str, Any]]:
        """Long-poll: events after ``seq``, waiting up to ``timeout`` seconds for the first one."""
        events = self.events_since(seq)
        if events or timeout <= 0 or self.life.closing:
            return events
        if self.new_events is None:
            self.new_events = asyncio.Event()
        waiter = self.new_events
        try:
            await asyncio.wait_for(waiter.wait(), min(float(timeout), 300.0))
        except asyncio.TimeoutError:
            return []
        if self.life.closing:
            return []
        return self.events_since(seq)
