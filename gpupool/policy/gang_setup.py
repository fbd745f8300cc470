"""Multi-node gangs, set-up: which replicas form a gang, and the gangs that cannot take a turn this cycle.

The rules are in :mod:`gpupool.policy.gangs` (the gang's turn, seating and
reservations live there). Here, once per cycle: the replicas of each gang are
grouped and put in job order; a gang whose replicas disagree, that its
project's limit or the pool can never hold, is refused whole; a gang with
replicas missing waits whole; one running in part is paused so that it
restarts whole; every other gang gets one entry in the queue (its first
replica) and its need counted for every replica. Also the per-unit
preemptible flags (:func:`flag_units`), which the engine's output uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import attrgetter

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import MILLI, TRAIN_POOL, Kind, Reject, Request, Wait, Workload

_gang_of = attrgetter("gang")
_by_submission = attrgetter("submitted_at")
_by_priority = attrgetter("priority")
_assignment_of = attrgetter("assignment")
_by_id = attrgetter("id")


@dataclass
class Gang:
    """The replicas of one gang present in the snapshot, in replica order (job order)."""

    id: str
    project: str
    size: int
    request: Request  # one replica's request (interned when pending)
    members: list[Workload]
    running: list[Workload]
    pending: list[Workload]

    @property
    def leader(self) -> Workload:
        """The first replica: the gang takes its turn in the queue where this one would."""
        return self.members[0]

    @property
    def need(self) -> int:
        return self.size * self.request.gpus * MILLI

    _text: str | None = None

    @property
    def text(self) -> str:
        """:meth:`describe`, built once (a waiting gang's reasons name it several times a cycle).

        (A plain attribute filled on first use: ``functools.cached_property``
        takes a lock on every read in Python 3.11, a cost paid by each of a
        queue's gangs each cycle.)
        """
        text = self._text
        if text is None:
            text = self._text = self.describe()
        return text

    def describe(self) -> str:
        """E.g. "gang g7 of 2 × 8 GPUs" (models, CPU and memory per replica added when asked)."""
        return f"gang {self.id} of {_replicas_text(self.size, self.request)}"


@lru_cache(maxsize=1024)
def _replicas_text(size: int, r: Request) -> str:
    """"2 × 8 GPUs" and what each replica asks beyond GPUs (a queue's gangs share a few shapes: built once each)."""
    per = txt.describe(Request(gpus=1, gpu_models=r.gpu_models, cpu_milli=r.cpu_milli, memory_mib=r.memory_mib))
    return f"{size} × {txt.gpus(r.gpus * MILLI)}" + per[len("1 whole GPU"):]


_agreed = attrgetter("kind", "project", "gang_size", "priority")
_request = attrgetter("request")


def _problem(members: Sequence[Workload]) -> str | None:
    """Why the replicas do not form a gang the engine can run, or None."""
    first = members[0]
    # The common case in one C-level pass: the replicas agree on everything and share one request object.
    if (first.kind is Kind.TRAIN and first.gang_size >= len(members) and first.request.gpus >= 1
            and len(set(map(_agreed, members))) == 1 and len(set(map(id, map(_request, members)))) == 1):
        return None
    if any(w.kind is not Kind.TRAIN for w in members):
        return "only training jobs can be multi-node gangs"
    if first.gang_size < 1:
        return f"gang {first.gang} has no size (gang_size must be at least 1)"
    req = first.request
    if any(w.project != first.project or w.gang_size != first.gang_size or w.priority != first.priority
           or (w.request is not req and w.request != req) for w in members):
        return f"the replicas of gang {first.gang} disagree on project, size, request or priority"
    if len(members) > first.gang_size:
        return f"gang {first.gang} has {len(members)} replicas, more than its size {first.gang_size}"
    r = first.request
    if r.gpus < 1:
        return (f"a gang's replicas ask for whole GPUs (gang {first.gang} asks {txt.describe(r)}); "
                "fractions and GPU memory are for single-node jobs")
    return None


def flag_units(order: Sequence[tuple[Workload, int]], milli: dict[str, int], guarantee: int) -> set[str]:
    """The preemptible flag counted per unit: a gang is one unit (all replicas flagged or none).

    As :meth:`~gpupool.policy.engine._Cycle.over_guarantee`, with a gang's
    replicas summed at the place of its first replica in ``order``: a gang is
    preemptible when the units before it already fill the guarantee, so it
    can be paused whole without taking its project below the guarantee.
    """
    units: dict[str, list[str]] = {}
    for w, _ in order:
        if w.gang:
            units.setdefault(w.gang, []).append(w.id)
    total = 0
    over: set[str] = set()
    seen: set[str] = set()
    for w, _ in order:
        if w.gang:
            if w.gang in seen:
                continue
            seen.add(w.gang)
            ids = units[w.gang]
            m = sum(milli[i] for i in ids)
        else:
            ids = [w.id]
            m = milli[w.id]
        if total >= guarantee and total + m > guarantee:
            over.update(ids)
        total += m
    return over


class GangSetupMixin(CycleState):
    """The gangs of a cycle's snapshot, found and sorted out before the training passes (see the module docstring)."""

    gangs: dict[str, Gang]  # gang id -> its replicas (every gang with a replica in the snapshot)
    gang_need: dict[str, int]  # first replica's id -> the gang's need (replicas x G), schedulable gangs
    gang_projects: set[str]  # projects with a replica in the snapshot
    running_gangs: bool  # whether a replica runs (reclaim then treats gangs as single victims)

    def setup_gangs(self, builds: list[Workload], trains: list[Workload]) -> tuple[list[Workload], list[Workload]]:
        """Find the gangs; deal with those that cannot run whole; return (``builds``, ``trains``) with
        one entry (its first replica) per schedulable gang added to ``trains``.

        ``builds`` and ``trains`` (from :meth:`sort_pending`) hold no replica.
        The order of ``trains`` decides nothing: the fair queue orders its
        jobs fully, and a gang left here passes every check that could refuse
        a job there.

        Called once the capacity and use are counted. Pending replicas of a
        gang that cannot be scheduled this cycle get their decision here;
        running replicas of a gang with pending ones are paused.
        """
        self.gangs, self.gang_need, self.gang_projects = {}, {}, set()
        self.gang_led_by: dict[str, Gang] = {}  # first replica's id -> its gang (schedulable gangs)
        self.gang_failed: FailureMemo[bool] = FailureMemo()  # context: the gang's size
        self.gang_failed_sizes: list[int] = []
        self.gang_smallest_failed: dict[int, tuple[Request, int]] = {}  # id(request) -> (it, smallest failed size)
        self.gang_texts: dict[tuple, str] = {}
        self.gang_fit_total: dict[tuple, int] = {}  # see place_gang
        self.gang_verdicts: dict[tuple, tuple[tuple, str]] = {}  # see gang_turn
        self.gang_most: dict[int, int] = {}  # id(interned replica request) -> replicas the empty pool holds
        self.running_gangs = False
        # the pending replicas come grouped from sort_pending; the running ones are added here
        by_gang = self.pending_replicas
        running_replicas = list(filter(_gang_of, self.running))
        if not by_gang and not running_replicas:
            return builds, trains
        mixed: set[str] = set()  # gangs with replicas running and pending: put back in id order below
        for w in running_replicas:
            members = by_gang.get(w.gang)
            if members is None:
                by_gang[w.gang] = [w]
            else:
                members.append(w)
                mixed.add(w.gang)
        leaders: list[Workload] = []  # the first replica of each gang left to take its turn
        refused = {r.workload_id: r.reason for r in self.rejects}
        for gid in sorted(by_gang):
            # job order (priority, submission, id) as two stable C-level sorts of the id-ordered replicas
            members = by_gang[gid]
            if gid in mixed:
                members.sort(key=_by_id)
            members.sort(key=_by_submission)
            members.sort(key=_by_priority, reverse=True)
            if any(map(_assignment_of, members)):
                running = [w for w in members if w.assignment is not None]
                pending = [w for w in members if w.assignment is None]
            else:  # (the common case, checked in C: the whole gang is pending)
                running, pending = [], members
            first = members[0]
            req = self.req_of.get(pending[0].id, first.request) if pending else first.request
            gang = self.gangs[gid] = Gang(gid, first.project, first.gang_size, req, members, running, pending)
            self.gang_projects.add(first.project)
            self.running_gangs = self.running_gangs or bool(running)
            why = next((refused[w.id] for w in pending if w.id in refused), None) if refused else None
            if why is not None:
                # a replica already refused (unknown project, malformed request): the gang cannot run
                self._reject_rest(gang, refused,
                                  f"{why} (a replica of gang {gid}; the gang starts whole or not at all)")
                continue
            problem = _problem(members)
            if problem is not None:
                self._reject_rest(gang, refused, problem)
                continue
            if not pending:
                continue
            if running:
                self._restart_whole(gang)
                continue
            if len(pending) < gang.size:
                self._wait_all(gang, (
                    f"{gang.text}: only {len(pending)} of its {gang.size} replicas are known to the scheduler; "
                    "all replicas start together or none"))
                continue
            why = self._never_fits(gang)
            if why is not None:
                self._reject_rest(gang, refused, why)
                continue
            too_small = self._pool_too_small(gang)
            if too_small is not None:
                if self.cfg.elastic_pool:  # a cluster: nodes may join (or come back); never lose the gang
                    self._wait_all(gang, f"{too_small[1]}; it waits for nodes to join the pool")
                else:
                    self._reject_rest(gang, refused, too_small[0])
                continue
            self.gang_need[gang.leader.id] = gang.need
            self.gang_led_by[gang.leader.id] = gang
            leaders.append(gang.leader)
        return builds, trains + leaders

    def _reject_rest(self, gang: Gang, refused: dict[str, str], why: str) -> None:
        """Refuse every pending replica not refused already (``refused``: those, by id)."""
        for w in gang.pending:
            if w.id not in refused:
                self.rejects.append(Reject(w.id, why))

    def _wait_all(self, gang: Gang, why: str) -> None:
        # one per replica, built in C (see Wait)
        self.waits.extend(map(tuple.__new__, repeat(Wait), zip(map(_by_id, gang.pending), repeat(why))))

    def _restart_whole(self, gang: Gang) -> None:
        """Part of the gang runs, part is pending: pause the running part so the gang restarts whole."""
        missing = ", ".join(w.id for w in gang.pending)
        for v in gang.running:
            a = v.assignment
            assert a is not None
            self.cap.release(a, v.request)
            if v.project in self.usage:
                self.usage[v.project] -= self.milli[v.id]
                self.touched.add(v.project)
            self.preempted[v.id] = (
                f"paused so that {gang.text} restarts whole: replicas {missing} are not running, and a gang "
                "never runs partly"
            )
        self.cap.generation += 1  # room grew back
        self._wait_all(gang, (
            f"{gang.text}: its running replicas are paused this cycle so that all {gang.size} restart "
            "together; it starts again in a later cycle"))

    def _never_fits(self, gang: Gang) -> str | None:
        """Why the gang can never run whatever the pool (no such project, over its project's limit); or None."""
        if gang.project not in self.projects:
            return f"project {gang.project!r} does not exist"
        limit = self.projects[gang.project].train_limit_milli
        if limit is not None and gang.need > limit:
            return (f"{gang.text} asks for {txt.gpus(gang.need)} in all, more than project {gang.project}'s "
                    f"training limit of {txt.gpus(limit)}")
        return None

    def _pool_too_small(self, gang: Gang) -> tuple[str, str] | None:
        """Why the train pool as it is could not hold the gang even empty: (for good, for now); or None."""
        req = gang.request
        if not self.fits_empty(TRAIN_POOL, req):
            return (f"no node of the train pool can ever hold one replica of {gang.text}",
                    f"no node of the train pool can hold one replica of {gang.text} now")
        most = self.gang_most.get(id(req))
        if most is None:  # (per request shape: most gangs of a queue share a few)
            most = self.gang_most[id(req)] = int(self.cap.states[TRAIN_POOL].replicas_fit(req, empty=True).sum())
        if most < gang.size:
            return (f"the train pool could hold at most {most} replicas of {txt.describe(req)} even empty; "
                    f"{gang.text} needs {gang.size}",
                    f"the train pool can hold at most {most} replicas of {txt.describe(req)} now, even empty; "
                    f"{gang.text} needs {gang.size}")
        return None

    def gang_pending_need(self, pending: dict[str, int]) -> None:
        """Add the replicas beyond the first to each project's pending need (the first is counted already)."""
        for leader, need in self.gang_need.items():
            gang = self.gang_led_by[leader]
            pending[gang.project] += need - gang.request.gpus * MILLI
