"""Multi-node gangs: N replicas x G whole GPUs that start together or not at all.

A distributed training job (torchrun, Horovod) is useless in part: a replica
that runs while its peers wait holds GPUs and blocks at the first collective.
So the snapshot carries one :class:`~scheduler.policy.model.Workload` per
replica, linked by ``gang`` and ``gang_size``, each with its own single-node
assignment (capacity, the held count and the service's bookkeeping stay per
replica), and this module makes the engine treat the replicas as one job:

* **All or nothing, in one cycle.** The gang takes its turn in the fair
  order as its first replica would (priority, fair order, submission, id);
  every replica is placed in that turn or none is. Nothing is held for a
  gang that does not fit (no partial holds that starve others), except a
  starvation reservation (below).
* **Never partly running.** A snapshot where some replicas run and others
  are pending (a replica was lost) pauses the running ones so the gang
  restarts whole; pending replicas whose peers are missing from the snapshot
  wait. Running replicas whose peers are gone (the job is ending, replicas
  exit one by one) are left alone.
* **Quotas count every replica**: the gang's need is replicas x G, for the
  guarantee passes, limits and fair share.
* **Topology**: replicas go on as few nodes as possible, packed onto a node
  before spreading, within one node group (``Node.group``: a rack, a switch)
  when one group can hold them all (:func:`~scheduler.policy.gang_nodes.choose_nodes`).
* **Reclaim**: a gang is one victim; pausing it pauses every replica and
  counts all their GPUs against the victim project's guarantee. A gang
  claimant finds room for every replica (on several nodes if need be)
  before anything is paused (:mod:`scheduler.policy.gang_reclaim`).
* **Starvation**: a gang waiting longer than ``starvation_s`` reserves the
  nodes closest to holding all its replicas (one reservation, several
  nodes), so small jobs cannot keep taking the room it needs.

This is a mixin of the engine's cycle object, like
:class:`~scheduler.policy.reclaim.ReclaimMixin`. Everything here is skipped
when no workload of the snapshot is in a gang, so work without gangs is
decided exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from scheduler.policy import reasons as txt
from scheduler.policy.cycle_state import CycleState
from scheduler.policy.gang_nodes import choose_nodes, group_ids
from scheduler.policy.memo import FailureMemo
from scheduler.policy.model import MILLI, TRAIN_POOL, Kind, Project, Reject, Request, Wait, Workload
from scheduler.policy.nodecache import for_nodes

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

    As :meth:`~scheduler.policy.engine._Cycle.over_guarantee`, with a gang's
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


class GangMixin(CycleState):
    """The engine's handling of multi-node gangs (see the module docstring)."""

    if TYPE_CHECKING:  # beyond CycleState's
        def reclaim_units(self, claimants: Sequence[Workload], req: Request, size: int, p: Project,
                          within: bool, gang: Gang | None) -> str | None: ...

    gangs: dict[str, Gang]  # gang id -> its replicas (every gang with a replica in the snapshot)
    gang_need: dict[str, int]  # first replica's id -> the gang's need (replicas x G), schedulable gangs
    gang_projects: set[str]  # projects with a replica in the snapshot
    running_gangs: bool  # whether a replica runs (reclaim then treats gangs as single victims)

    # ------------------------------------------------------------ set-up

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

    # ------------------------------------------------------------ a gang's turn

    def gang_turn(self, w: Workload, first: bool, deferred: list[Workload], starving_from: float) -> None:
        """The gang whose first replica is ``w`` takes its turn in a training pass."""
        gang = self.gang_led_by[w.id]
        p = self.projects[gang.project]
        need = gang.need
        used = self.usage[p.name]
        g = p.train_guarantee_milli
        within = used < g or used + need <= g
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        if first and not within and since > starving_from:
            deferred.append(w)
            return
        # A gang like one that just waited (the same replicas, no fewer of them, same project, priority;
        # nothing started, paused or reserved since) waits for the same reason, as the engine's verdict memo
        # does for single jobs: placement and reclaim would fail the same way. A starving gang must still try
        # for a reservation, one in its resume backoff says so itself, and one past its limit says that.
        key = (id(gang.request), p.name, within, w.priority)
        n_reservers = self.n_reservers
        mark = (self.cap.generation, used, n_reservers, len(self.started))
        settled = within or w.paused_at is None or self.now - w.paused_at >= self.cfg.resume_backoff_s
        quiet = n_reservers >= self.cfg.max_reservations or since > starving_from
        limit = p.train_limit_milli
        seen = self.gang_verdicts.get(key)
        if (seen is not None and seen[0] == mark and seen[1] <= gang.size and settled and quiet
                and (limit is None or used + need <= limit)):
            self._wait_all(gang, gang.text + seen[2])
            return
        before = len(self.waits)
        self.schedule_gang(gang, p, within)
        if settled and len(self.waits) > before and self.n_reservers == n_reservers:
            reason = self.waits[-1].reason
            if reason.startswith(gang.text + ":") and (seen is None or seen[0] != mark or gang.size < seen[1]):
                self.gang_verdicts[key] = (mark, gang.size, reason[len(gang.text):])

    def schedule_gang(self, gang: Gang, p: Project, within: bool) -> None:
        cfg = self.cfg
        w = gang.leader
        used, need, limit = self.usage[p.name], gang.need, p.train_limit_milli
        if limit is not None and used + need > limit:
            self._wait_all(gang, (
                f"project {p.name} is at its training limit: it uses {txt.gpus(used)} of {txt.gpus(limit)} and "
                f"{gang.text} needs {txt.gpus(need)} (all replicas start together or none)"))
            return
        if not within and w.paused_at is not None and self.now - w.paused_at < cfg.resume_backoff_s:
            self._wait_all(gang, (
                f"{gang.text} was paused {txt.seconds(self.now - w.paused_at)} ago; it resumes on idle GPUs "
                f"only after {txt.seconds(cfg.resume_backoff_s)} (anti-flapping), or sooner within project "
                f"{p.name}'s guarantee"))
            return
        plan = self.place_gang(gang)
        if plan is not None:
            self.seat_gang(gang, plan, "")
            return
        why = self.reclaim_units(gang.pending, gang.request, gang.size, p, within, gang)
        if why is None:
            return
        what = self._gang_no_room(gang)  # (before a reservation blocks nodes)
        reserved = self.reserve_gang(gang)
        self._wait_all(gang, what + ("; " + reserved if reserved is not None else why))

    def place_gang(self, gang: Gang) -> list[tuple[str, int]] | None:
        """Nodes for every replica on free capacity now: [(node, replicas)], or None (nothing is taken).

        Failures are remembered for the rest of the generation (free room
        only shrinks meanwhile): a gang fails when one of no more replicas,
        each asking no more (:mod:`scheduler.policy.memo`), failed.
        """
        generation = self.cap.generation
        req = gang.request
        memo = self.gang_failed
        if generation != memo.generation:
            self.gang_failed_sizes = []
            self.gang_smallest_failed = {}
        smallest = self.gang_smallest_failed.get(id(req))  # the common case: the same replica shape
        if smallest is not None and smallest[0] is req and smallest[1] <= gang.size:
            return None
        for size in self.gang_failed_sizes:
            if size <= gang.size and memo.get(size, req, generation):
                return None
        # replicas of this shape that fit anywhere now, remembered while nothing starts, is paused or reserved:
        # most gangs of a full cluster fail on it, whatever their size, without a pass over the nodes
        room_key = (id(req), generation, len(self.started), len(self.preempted), len(self.reserved))
        fit_total = self.gang_fit_total.get(room_key)
        state = self.cap.states[TRAIN_POOL]
        picks = None
        if fit_total is None or fit_total >= gang.size:
            room = state.replicas_fit(req)
            if fit_total is None:
                fit_total = self.gang_fit_total[room_key] = int(room.sum())
            if fit_total >= gang.size:
                picks = choose_nodes(room, gang.size, self.gang_groups(), state.whole_free)
        if picks is None:
            memo.add(gang.size, req, generation, True)
            if smallest is None or smallest[0] is not req or gang.size < smallest[1]:
                self.gang_smallest_failed[id(req)] = (req, gang.size)
            if gang.size not in self.gang_failed_sizes:
                self.gang_failed_sizes.append(gang.size)
            return None
        return [(state.names[i], n) for i, n in picks]

    def gang_groups(self) -> np.ndarray:
        """The train pool's node groups as small ids, in its node order (kept with the node list)."""
        return for_nodes("gang groups", self.cap.states[TRAIN_POOL].nodes, group_ids)

    def seat_gang(self, gang: Gang, plan: list[tuple[str, int]], note: str) -> None:
        """Start every replica where ``plan`` says (the capacity is known to be there)."""
        ledger = self.cap.ledger
        req = gang.request
        where = ", ".join(node + (f" ×{n}" if n > 1 else "") for node, n in plan)
        text = (f"as one of the {gang.size} replicas of {gang.text}, all started together on {where}"
                + (" " + note if note else ""))
        replicas = iter(gang.pending)
        for node, n in plan:
            for _ in range(n):
                a = ledger.assign_on(node, req)
                assert a is not None, "the gang's plan counted room that is not there"
                self.start(next(replicas), req, a, text)  # (commits: the next replica sees the room taken)

    def _gang_no_room(self, gang: Gang) -> str:
        """What does not fit, for a waiting gang's reason (kept while nothing is started, paused or reserved)."""
        key = (id(gang.request), self.cap.generation, len(self.started), len(self.reserved))
        text = self.gang_texts.get(key)
        if text is None:
            text = self.gang_texts[key] = self._gang_no_room_text(gang)
        return f"{gang.text}: {text}"

    def _gang_no_room_text(self, gang: Gang) -> str:
        state = self.cap.states[TRAIN_POOL]
        room = state.replicas_fit(gang.request)
        nodes = int((room > 0).sum())
        fit = int(room.sum())
        one = txt.describe(gang.request).replace(" on one node", "")
        if fit:
            where = (f"only {nodes} node{'s' if nodes != 1 else ''} ha{'ve' if nodes != 1 else 's'} room for a "
                     f"replica ({one}), {fit} replica{'s' if fit != 1 else ''} would fit")
        else:
            where = f"no node has room for a replica ({one})"
        text = f"{where}; all replicas start together or none"
        if self.reserved:
            text += " (reserved for starving jobs: " + ", ".join(
                f"{node} for {job}" for node, job in sorted(self.reserved.items())) + ")"
        return text

    # ------------------------------------------------------------ starvation

    def reserve_gang(self, gang: Gang) -> str | None:
        """Head-of-line reservation for a starving gang: the nodes closest to holding every replica.

        Nodes that could hold a replica when empty are ranked by the replicas
        that fit now, then whole free GPUs, free CPU, free memory, node order;
        the first ones whose empty room adds up to the gang are reserved,
        within one node group when one can hold the gang. The reservation
        counts as one against ``max_reservations``. Nothing new lands on those
        nodes this cycle, so their room only grows until the gang fits.
        """
        cfg = self.cfg
        if self.n_reservers >= cfg.max_reservations:
            return None
        w = gang.leader
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        waited = self.now - since
        if waited < cfg.starvation_s:
            return None
        state = self.cap.states[TRAIN_POOL]
        req = gang.request
        empty = state.replicas_fit(req, empty=True)
        now = state.replicas_fit(req)
        ok = empty > 0
        for name in self.reserved:
            i = state.node_index.get(name)
            if i is not None:
                ok[i] = False
        cands = np.flatnonzero(ok)
        if int(empty[cands].sum()) < gang.size:
            return None
        groups = self.gang_groups()

        def ranked(idx: np.ndarray) -> list[int]:
            return sorted(idx.tolist(), key=lambda i: (-int(now[i]), -int(state.whole_free[i]),
                                                        -int(state.cpu_free[i]), -int(state.mem_free[i]), i))

        def take(order: list[int]) -> list[int]:
            out, got = [], 0
            for i in order:
                if got >= gang.size:
                    break
                out.append(i)
                got += int(empty[i])
            return out

        best: tuple[tuple, list[int]] | None = None
        for g in np.unique(groups[cands]).tolist():
            members = cands[groups[cands] == g]
            if int(empty[members].sum()) < gang.size:
                continue
            sel = take(ranked(members))
            key = (-sum(int(now[i]) for i in sel), len(sel), g)
            if best is None or key < best[0]:
                best = (key, sel)
        sel = best[1] if best is not None else take(ranked(cands))
        names = [state.names[i] for i in sel]
        have = ", ".join(f"{n} ({self.cap.ledger.free_gpus_text(n)})" for n in names)
        for n in names:
            self.cap.block(n)
            self.reserved[n] = w.id
        self.n_reservers += 1
        plural = len(names) > 1
        return (
            f"waiting {txt.seconds(waited)}, longer than {txt.seconds(cfg.starvation_s)}: "
            f"node{'s' if plural else ''} {have} {'are' if plural else 'is'} reserved for it and "
            f"take{'' if plural else 's'} no new work until all its replicas fit"
        )
