"""Multi-node gangs, set-up: which replicas form a gang, and the gangs that cannot take a turn this cycle.

The rules are in :mod:`gpupool.policy.gangs` (a gang's turn, seating and
reservations live there). Here, once per cycle, as the cycle state is opened
(:mod:`gpupool.policy.intake`): the replicas of each gang are grouped and put
in job order; a gang whose replicas disagree, that its project's limit or the
pool can never hold, is refused whole; a gang with replicas missing waits
whole; one running in part is paused so that it restarts whole; every other
gang gets one entry in the queue (its first replica) and its need counted for
every replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang import Gang
from gpupool.policy.gang_actions import wait_all
from gpupool.policy.model import MILLI, TRAIN_POOL, Kind, Reject, Workload
from gpupool.policy.rule_reasons import never_fits

_gang_of = attrgetter("gang")
_by_submission = attrgetter("submitted_at")
_by_priority = attrgetter("priority")
_assignment_of = attrgetter("assignment")
_by_id = attrgetter("id")


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



def setup_gangs(state: CycleState, builds: list[Workload], trains: list[Workload]
                ) -> tuple[list[Workload], list[Workload]]:
    """Find the gangs; deal with those that cannot run whole; return (``builds``, ``trains``) with
    one entry (its first replica) per schedulable gang added to ``trains``.

    ``builds`` and ``trains`` (from intake) hold no replica. The order of
    ``trains`` decides nothing: the fair queue orders its jobs fully, and a
    gang left here passes every check that could refuse a job there.

    Called once the capacity and use are counted. Pending replicas of a
    gang that cannot be scheduled this cycle get their decision here;
    running replicas of a gang with pending ones are paused. Fills the
    state's gang fields (``gangs``, ``gang_led_by``, ``gang_need``,
    ``gang_projects``, ``running_gangs``).
    """
    # the pending replicas come grouped from intake; the running ones are added here
    by_gang = state.pending_replicas
    running_replicas = list(filter(_gang_of, state.running))
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
    refused = {r.workload_id: r.reason for r in state.rejects}
    most: dict[int, int] = {}  # id(interned replica request) -> replicas the empty pool holds
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
        req = state.req_of.get(pending[0].id, first.request) if pending else first.request
        gang = state.gangs[gid] = Gang(gid, first.project, first.gang_size, req, members, running, pending)
        state.gang_projects.add(first.project)
        state.running_gangs = state.running_gangs or bool(running)
        why = next((refused[w.id] for w in pending if w.id in refused), None) if refused else None
        if why is not None:
            # a replica already refused (unknown project, malformed request): the gang cannot run
            _reject_rest(state, gang, refused,
                         f"{why} (a replica of gang {gid}; the gang starts whole or not at all)")
            continue
        problem = _problem(members)
        if problem is not None:
            _reject_rest(state, gang, refused, problem)
            continue
        if not pending:
            continue
        if running:
            _restart_whole(state, gang)
            continue
        if len(pending) < gang.size:
            wait_all(state, gang, (
                f"{gang.text}: only {len(pending)} of its {gang.size} replicas are known to the scheduler; "
                "all replicas start together or none"))
            continue
        why = _never_fits(state, gang)
        if why is not None:
            _reject_rest(state, gang, refused, why)
            continue
        too_small = _pool_too_small(state, gang, most)
        if too_small is not None:
            if state.cfg.elastic_pool:  # a cluster: nodes may join (or come back); never lose the gang
                wait_all(state, gang, f"{too_small[1]}; it waits for nodes to join the pool")
            else:
                _reject_rest(state, gang, refused, too_small[0])
            continue
        state.gang_need[gang.leader.id] = gang.need
        state.gang_led_by[gang.leader.id] = gang
        leaders.append(gang.leader)
    return builds, trains + leaders


def _reject_rest(state: CycleState, gang: Gang, refused: dict[str, str], why: str) -> None:
    """Refuse every pending replica not refused already (``refused``: those, by id)."""
    for w in gang.pending:
        if w.id not in refused:
            state.rejects.append(Reject(w.id, why))


def _restart_whole(state: CycleState, gang: Gang) -> None:
    """Part of the gang runs, part is pending: pause the running part so the gang restarts whole."""
    missing = ", ".join(w.id for w in gang.pending)
    for v in gang.running:
        a = v.assignment
        assert a is not None
        state.cap.release(a, v.request)
        if v.project in state.usage:
            state.usage[v.project] -= state.milli[v.id]
            state.touched.add(v.project)
        state.preempted[v.id] = (
            f"paused so that {gang.text} restarts whole: replicas {missing} are not running, and a gang "
            "never runs partly"
        )
    state.cap.generation += 1  # room grew back
    wait_all(state, gang, (
        f"{gang.text}: its running replicas are paused this cycle so that all {gang.size} restart "
        "together; it starts again in a later cycle"))


def _never_fits(state: CycleState, gang: Gang) -> str | None:
    """Why the gang can never run whatever the pool (no such project, over its project's limit); or None."""
    if gang.project not in state.projects:
        return f"project {gang.project!r} does not exist"
    limit = state.projects[gang.project].train_limit_milli
    if limit is not None and gang.need > limit:
        return (f"{gang.text} asks for {txt.gpus(gang.need)} in all, more than project {gang.project}'s "
                f"training limit of {txt.gpus(limit)}")
    return None


def _pool_too_small(state: CycleState, gang: Gang, most_of: dict[int, int]) -> tuple[str, str] | None:
    """Why the train pool as it is could not hold the gang even empty: (for good, for now); or None.

    ``most_of``: replicas of each request shape the empty pool holds, filled
    here (most gangs of a queue share a few shapes).
    """
    req = gang.request
    if not state.fits_empty(TRAIN_POOL, req):
        why = state.reason(("never", TRAIN_POOL, id(req)),
                           lambda: never_fits(state.cap.states[TRAIN_POOL], TRAIN_POOL, req))
        if why:
            return why, f"{why} now"
        return (f"no node of the train pool can ever hold one replica of {gang.text}",
                f"no node of the train pool can hold one replica of {gang.text} now")
    most = most_of.get(id(req))
    if most is None:
        most = most_of[id(req)] = int(state.cap.states[TRAIN_POOL].replicas_fit(req, empty=True).sum())
    if most < gang.size:
        if req.rules is not None and req.rules.text:
            where = f"the nodes of the train pool that match {req.rules.text}"
            return (f"{where} could hold at most {most} replicas of {txt.describe(req)} even empty; "
                    f"{gang.text} needs {gang.size}",
                    f"{where} can hold at most {most} replicas of {txt.describe(req)} now, even empty; "
                    f"{gang.text} needs {gang.size}")
        return (f"the train pool could hold at most {most} replicas of {txt.describe(req)} even empty; "
                f"{gang.text} needs {gang.size}",
                f"the train pool can hold at most {most} replicas of {txt.describe(req)} now, even empty; "
                f"{gang.text} needs {gang.size}")
    return None


def gang_pending_need(state: CycleState, pending: dict[str, int]) -> None:
    """Add the replicas beyond the first to each project's pending need (the first is counted already)."""
    for leader, need in state.gang_need.items():
        gang = state.gang_led_by[leader]
        pending[gang.project] += need - gang.request.gpus * MILLI
