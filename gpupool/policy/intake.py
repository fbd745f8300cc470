"""Intake: a :class:`Snapshot` read into a fresh :class:`CycleState`, before any decision is taken.

The first phase of the cycle. It sorts the workloads by id (everything after
depends on that order, not the caller's), interns the pending requests and
rejects what cannot be read, counts what running work holds (capacity, use
per project), sorts out the multi-node gangs (:mod:`gpupool.policy.gang_setup`)
and flags, per project, the running jobs beyond its guarantee (the only ones
another project may pause). It hands the engine the build and training jobs
left to decide.
"""

from __future__ import annotations

from itertools import filterfalse
from operator import attrgetter

from gpupool.policy.capacity import Capacity
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang_setup import setup_gangs
from gpupool.policy.guarantee import over_guarantee
from gpupool.policy.interning import Interner
from gpupool.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Kind,
    Node,
    Project,
    Reject,
    Request,
    Snapshot,
    Workload,
)
from gpupool.policy.nodecache import for_nodes

_by_id = attrgetter("id")
_UNREAD = "(not read yet)"  # a request not yet checked by request_problem (None means: nothing wrong)
_assignment_of = attrgetter("assignment")
_read_alike = attrgetter("kind", "project")
_request_of = attrgetter("request")


def request_problem(req: Request) -> str | None:
    """Why a request is malformed, or None. Placement refuses such requests; the engine rejects them."""
    forms = (req.gpus > 0) + (req.gpu_milli > 0) + (req.gpu_memory_mib > 0)
    if forms > 1:
        return "a request asks for whole GPUs, a GPU fraction or GPU memory, not several"
    if min(req.gpus, req.gpu_milli, req.gpu_memory_mib, req.cpu_milli, req.memory_mib) < 0:
        return "amounts in a request cannot be negative"
    if req.gpu_milli >= MILLI:
        return f"a GPU fraction must be below one GPU (got {req.gpu_milli} milli); ask for whole GPUs"
    return None


def _node_facts(nodes: tuple[Node, ...]) -> tuple[dict[str, dict[str, int]], int]:
    """(largest GPU memory per model, per pool; GPU share on train nodes): what the nodes alone fix.

    The memory table turns memory requests into an estimated share.
    """
    model_memory: dict[str, dict[str, int]] = {BUILD_POOL: {}, TRAIN_POOL: {}}
    train_capacity = 0
    train_names = {n.name for n in nodes if TRAIN_POOL in n.pools}
    for node in nodes:
        if node.name in train_names:
            train_capacity += sum(g.capacity_milli for g in node.gpus)
        sizes: dict[str, int] = {}
        for g in node.gpus:
            if g.memory_mib > sizes.get(g.model, 0):
                sizes[g.model] = g.memory_mib
        for pool in node.pools:
            table = model_memory.get(pool)
            if table is not None:
                for model, size in sizes.items():
                    if size > table.get(model, 0):
                        table[model] = size
    return model_memory, train_capacity


class _Pending:
    """The pending workloads sorted out: interned requests, rejects, the jobs per kind, gang replicas."""

    def __init__(self, pending: list[Workload], projects: dict[str, Project]) -> None:
        self.rejects: list[Reject] = []
        # Requests are interned (one hash per distinct object), so equal shapes share the per-cycle
        # memos, keyed by id() of the interned request (helped by the last cycle's answers:
        # gpupool/policy/interning.py).
        self.interner = Interner()
        self.req_of: dict[str, Request] = {}
        self.replicas: dict[str, list[Workload]] = {}  # gang id -> its pending replicas, in id order
        self.builds, self.trains, self.asked = self._sort(pending, projects)

    def _sort(self, pending: list[Workload], projects: dict[str, Project]
              ) -> tuple[list[Workload], list[Workload], dict[str, list[Request]]]:
        """Intern the pending jobs' requests and reject what cannot be read.

        Returns (build jobs, training jobs, per pool the distinct requests of all its pending jobs). Replicas
        of multi-node gangs are left out of the first two and grouped per gang in ``replicas``
        (:func:`~gpupool.policy.gang_setup.setup_gangs` sees to them); a gang whose replicas agree (one
        request object, one project, one kind: the service's gangs) is read once, not once per replica.
        """
        builds: list[Workload] = []
        trains: list[Workload] = []
        intern, req_of = self.interner.intern, self.req_of
        problems: dict[int, str | None] = {}
        # Callers often share one Request object among many workloads: look those up by identity
        # before hashing the dataclass (the snapshot keeps every request alive, so ids are stable).
        # One table per kind, so that its values are also each pool's distinct requests.
        # id(request object) -> (its interned request, what is wrong with it or None)
        by_kind: dict[Kind, dict[int, tuple[Request, str | None]]] = {Kind.BUILD: {}, Kind.TRAIN: {}}
        groups = self.replicas

        def read(w: Workload) -> str | None:
            """Intern ``w``'s request; why it is refused, or None."""
            r = w.request
            by_obj = by_kind[w.kind]
            known = by_obj.get(id(r))
            if known is None:
                req = intern(r)
                problem = problems.get(id(req), _UNREAD)
                if problem is _UNREAD:
                    problem = problems[id(req)] = request_problem(req)
                known = by_obj[id(r)] = (req, problem)
            req, problem = known
            req_of[w.id] = req
            if w.project not in projects:
                return f"project {w.project!r} does not exist"
            return problem

        # (this loop runs once per pending workload: the common case inline, locals only)
        build, rejects, to_build, to_train = Kind.BUILD, self.rejects, builds.append, trains.append
        train_table = by_kind[Kind.TRAIN]
        for w in pending:
            gang = w.gang
            if gang:
                members = groups.get(gang)
                if members is None:
                    groups[gang] = [w]
                else:
                    members.append(w)
                continue
            kind = w.kind
            known = train_table.get(id(w.request)) if kind is not build else None
            if known is not None and w.project in projects:  # a training shape seen before
                req, problem = known
                req_of[w.id] = req
            else:
                problem = read(w)
            if problem is not None:
                rejects.append(Reject(w.id, problem))
            elif kind is build:
                to_build(w)
            else:
                to_train(w)
        for members in groups.values():
            if len(set(map(_read_alike, members))) == 1 and len(set(map(id, map(_request_of, members)))) == 1:
                why = read(members[0])
                req = req_of[members[0].id]
                for w in members:
                    req_of[w.id] = req
                    if why is not None:
                        rejects.append(Reject(w.id, why))
            else:
                for w in members:
                    if (why := read(w)) is not None:
                        rejects.append(Reject(w.id, why))
        self.interner.keep()
        asked = {pool: list({id(req): req for req, _ in by_kind[kind].values()}.values())
                 for pool, kind in ((BUILD_POOL, Kind.BUILD), (TRAIN_POOL, Kind.TRAIN))}
        return builds, trains, asked


def open_cycle(snap: Snapshot) -> tuple[CycleState, list[Workload], list[Workload]]:
    """The cycle state for ``snap``, and (build jobs, training jobs) left to decide, in no particular order.

    Gangs take part as their first replica in the training jobs; the decisions
    intake takes itself (unreadable requests, gangs that cannot run whole) are
    in the state already.
    """
    cfg = snap.config
    projects: dict[str, Project] = {p.name: p for p in snap.projects}
    workloads = sorted(snap.workloads, key=_by_id)
    # (C-level filters: an Assignment is always true, a missing one None)
    running = list(filter(_assignment_of, workloads))
    pending = list(filterfalse(_assignment_of, workloads))
    jobs = _Pending(pending, projects)
    asked = jobs.asked
    cap = Capacity(
        snap.nodes, running, (BUILD_POOL, TRAIN_POOL), cfg.placement,
        active=[pool for pool in (BUILD_POOL, TRAIN_POOL) if asked[pool]],
        # The distinct requests of each pool's pending jobs (interned: one object per shape), those
        # about to be rejected included: the scorers' tables hold their types (with no weight), and
        # the tables' make-up, not only the weights, fixes the last bits of the scores.
        expect=asked,
    )
    train_nodes = set(cap.pool_nodes[TRAIN_POOL])
    train_capacity = 0  # GPU share on train nodes not held by anything but training

    usage: dict[str, int] = dict.fromkeys(projects, 0)
    build_used: dict[str, int] = dict.fromkeys(projects, 0)
    build_holders: dict[str, list[tuple[str, int]]] = {p: [] for p in projects}
    train_running: dict[str, list[Workload]] = {p: [] for p in projects}
    milli_of: dict[str, int] = {}
    # (once per running job: locals, and the common case first: training of a known project)
    train = Kind.TRAIN
    for w in running:
        a = w.assignment
        assert a is not None
        gpus = a.gpus
        milli = milli_of[w.id] = gpus[0][1] if len(gpus) == 1 else a.total_milli
        name = w.project
        if w.kind is train and name in projects:
            usage[name] += milli
            train_running[name].append(w)
            continue
        if a.node in train_nodes:  # build work, or work of an unknown project, on a train node
            train_capacity -= milli
        if name in projects:  # (build work)
            build_used[name] += milli
            build_holders[name].append((w.id, milli))

    # largest GPU memory per model and pool (read-only: shared by cycles over the same nodes)
    model_memory, train_share = for_nodes("engine node facts", snap.nodes, _node_facts)
    recent = {name: max(0.0, p.recent_milli) for name, p in projects.items()}
    state = CycleState(
        cfg=cfg, now=snap.now, projects=projects, running=running, pending=pending,
        req_of=jobs.req_of, pending_replicas=jobs.replicas, cap=cap, model_memory=model_memory,
        train_nodes=train_nodes, train_capacity=train_capacity + train_share,
        recent=recent, history=any(recent.values()),
        usage=usage, build_used=build_used, build_holders=build_holders, train_running=train_running,
        milli=milli_of, rejects=jobs.rejects,
    )
    state.needs.update({id(req): state.estimate(TRAIN_POOL, req) for req in jobs.interner.canon.values()})
    # multi-node gangs: one queue entry per gang; those that cannot run whole are decided here
    # (nothing happens when no workload is in a gang)
    builds, trains = setup_gangs(state, jobs.builds, jobs.trains)
    flags = state.flags_at_start
    for name, p in projects.items():
        flags[name] = over_guarantee(state, name) if usage[name] > p.train_guarantee_milli else set()
    state.over_at_start.update(*flags.values())
    return state, builds, trains
