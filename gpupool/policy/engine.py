"""The scheduling cycle: one :class:`Snapshot` in, one :class:`Decisions` out.

The rules are written down for users in docs/policy.md; in short:

* **Build** work (interactive kernels) runs on the build pool, only within its
  project's fixed build quota, and is never paused. Over the quota it is
  rejected; within it but with no room it may pause training on nodes shared
  with the train pool (:mod:`gpupool.policy.build_reclaim`), and waits only
  when that cannot make room (the admin gave out more quota than the pool holds).
* **Training** work runs on the train pool in two passes. Pass 1 takes the
  jobs of projects below their guarantee (the job may take its project past
  it: a project claims its guarantee with its next job, whatever its size,
  and that job is not preemptible); such a job that does not fit may *reclaim*: pause jobs of projects above their guarantee
  (:mod:`gpupool.policy.reclaim`). Pass 2 takes the rest, which may only use
  idle capacity and start as preemptible. In each pass jobs go by priority,
  then by the project furthest below its fair share
  (:mod:`gpupool.policy.fairshare`), then by submission time. In pass 2 and
  in the choice of reclaim victims a project's recent use (``Project.recent_milli``,
  history decayed by a half-life) counts on top of its use now, so idle GPUs go
  first to the projects that had least of them lately; guarantees ignore history.
* A job may pause lower-priority jobs of its own project.
* A job that has waited longer than ``starvation_s`` is served in pass 1 at its
  place in the order; if it still does not fit it reserves the node closest to
  fitting it, and nothing else starts there this cycle.
* A paused job is not resumed on idle capacity within ``resume_backoff_s`` of
  its pause; within its project's guarantee (where nothing can pause it again)
  it may resume at once.

Everything is deterministic: inputs are sorted by id before use, ties are
broken by names and ids, and no clock or random source is read.

Speed: a cycle touches each pending job once or twice. Equal request shapes
share per-cycle memos (a shape that did not fit still does not fit while
capacity only shrinks; the same for reclaim), reasons are built once per
shape and project state, and only projects whose jobs changed are re-counted
against their guarantee at the end.
"""

from __future__ import annotations

import gc
import math
from itertools import filterfalse
from operator import attrgetter

from gpupool.policy import reasons as txt
from gpupool.policy.build_reclaim import BuildReclaimMixin
from gpupool.policy.cache import PolicyCache, using
from gpupool.policy.capacity import Capacity
from gpupool.policy.gang_reclaim import GangReclaimMixin
from gpupool.policy.gangs import GangMixin
from gpupool.policy.interning import Interner
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Kind,
    Node,
    Project,
    Reject,
    Request,
    Snapshot,
    Wait,
    Workload,
)
from gpupool.policy.nodecache import for_nodes
from gpupool.policy.outcome import OutcomeMixin, Started
from gpupool.policy.queue import FairQueue, job_order
from gpupool.policy.reclaim import ReclaimMixin
from gpupool.policy.training import TrainingMixin


def schedule(snapshot: Snapshot, cache: PolicyCache | None = None) -> Decisions:
    """Decide what starts where, what is paused and why, for one cycle.

    ``cache``: what the caller's last cycle left to start from (gpupool/policy/cache.py);
    None starts from nothing. The decisions are the same either way.

    The cyclic garbage collector is held off for the cycle: a cycle allocates
    tens of thousands of short-lived containers (freed by reference counting),
    and the collections they trigger walk the objects the caller holds (a
    10k-pending snapshot is some 200k objects): at that scale about a tenth of
    a steady cycle, and a cycle that hits a full collection took twice as
    long. It is switched back on (if it was on) on the way out, whatever
    happens.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        with using(cache if cache is not None else PolicyCache()):
            cycle = _Cycle(snapshot)
            try:
                return cycle.run()
            finally:
                cycle.queue = None  # the queue holds a bound method of the cycle: break the loop
    finally:
        if enabled:
            gc.enable()


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


class _Cycle(TrainingMixin, OutcomeMixin, ReclaimMixin, BuildReclaimMixin, GangMixin, GangReclaimMixin):
    """The mutable working state of one scheduling cycle."""

    def __init__(self, snap: Snapshot) -> None:
        self.cfg = snap.config
        self.now = snap.now
        self.nodes = snap.nodes
        self.projects: dict[str, Project] = {p.name: p for p in snap.projects}
        workloads = sorted(snap.workloads, key=_by_id)
        # (C-level filters: an Assignment is always true, a missing one None)
        self.running = list(filter(_assignment_of, workloads))
        self.pending = list(filterfalse(_assignment_of, workloads))
        self.rejects: list[Reject] = []
        # Requests are interned (one hash per distinct object); the per-cycle memos are keyed by id()
        # of the interned request, so equal shapes share memos and no lookup rehashes a dataclass.
        self.interner = Interner()  # (helped by the last cycle's answers: gpupool/policy/interning.py)
        self.canon: dict[Request, Request] = self.interner.canon
        self.req_of: dict[str, Request] = {}
        self.builds, self.trains, asked = self.sort_pending()
        self.cap = Capacity(
            snap.nodes, self.running, (BUILD_POOL, TRAIN_POOL), self.cfg.placement,
            active=[pool for pool in (BUILD_POOL, TRAIN_POOL) if asked[pool]],
            # The distinct requests of each pool's pending jobs (interned: one object per shape), those
            # about to be rejected included: the scorers' tables hold their types (with no weight), and
            # the tables' make-up, not only the weights, fixes the last bits of the scores.
            expect=asked,
        )
        self.train_nodes = set(self.cap.pool_nodes[TRAIN_POOL])
        self.train_capacity = 0  # GPU share on train nodes not held by anything but training

        self.usage: dict[str, int] = dict.fromkeys(self.projects, 0)  # training milli-GPU in use
        self.build_used: dict[str, int] = dict.fromkeys(self.projects, 0)
        self.build_holders: dict[str, list[tuple[str, int]]] = {p: [] for p in self.projects}
        self.train_running: dict[str, list[Workload]] = {p: [] for p in self.projects}
        self.milli: dict[str, int] = {}  # running or started workload id -> milli-GPU it holds
        # (once per running job: locals, and the common case first: training of a known project)
        milli_of, projects, usage, train_running = self.milli, self.projects, self.usage, self.train_running
        train = Kind.TRAIN
        for w in self.running:
            a = w.assignment
            assert a is not None
            gpus = a.gpus
            milli = milli_of[w.id] = gpus[0][1] if len(gpus) == 1 else a.total_milli
            name = w.project
            if w.kind is train and name in projects:
                usage[name] += milli
                train_running[name].append(w)
                continue
            if a.node in self.train_nodes:  # build work, or work of an unknown project, on a train node
                self.train_capacity -= milli
            if name in projects:  # (build work)
                self.build_used[name] += milli
                self.build_holders[name].append((w.id, milli))

        # largest GPU memory per model and pool (read-only: shared by cycles over the same nodes)
        facts = for_nodes("engine node facts", snap.nodes, _node_facts)
        self.model_memory: dict[str, dict[str, int]] = facts[0]
        self.train_capacity += facts[1]

        self.started: list[Started] = []
        self.preempted: dict[str, str] = {}  # workload id -> reason, in decision order
        self.waits: list[Wait] = []
        self.touched: set[str] = set()  # projects whose running set changed this cycle
        self.place_failed: FailureMemo[bool] = FailureMemo()  # context: the pool
        self.empty_fit: dict[tuple[str, int], bool] = {}
        self.estimates: dict[tuple[str, int], int] = {}
        # id of each interned request -> milli-GPU it is estimated to hold on the train pool
        self.needs = {id(req): self.estimate(TRAIN_POOL, req) for req in self.canon.values()}
        self.reasons: dict[tuple, str] = {}
        self.verdicts: dict[tuple, tuple[int, int, int, str]] = {}
        self.reserved: dict[str, str] = {}  # node -> id of the starving job holding it
        self.n_reservers = 0  # starving jobs holding a reservation (a gang's may hold several nodes)
        self.shares: dict[str, float] = {}
        # recent training use per project (milli-GPU on average lately); all 0 when no history is kept
        self.recent: dict[str, float] = {name: max(0.0, p.recent_milli) for name, p in self.projects.items()}
        self.history = any(self.recent.values())
        self.pending_need: dict[str, int] | None = None  # per project, set by admissible_trains
        self.queue: FairQueue | None = None
        # multi-node gangs (gpupool/policy/gangs.py): one queue entry per gang; those that cannot run
        # whole are decided here (nothing happens when no workload is in a gang)
        self.builds, self.trains = self.setup_gangs(self.builds, self.trains)
        # per project: running training jobs beyond the guarantee now (the only ones another
        # project's reclaim may pause)
        self.flags_at_start = {
            name: self.over_guarantee(name) if self.usage[name] > p.train_guarantee_milli else set()
            for name, p in self.projects.items()
        }
        self.over_at_start: set[str] = set().union(*self.flags_at_start.values())
        ReclaimMixin.__init__(self)

    # ------------------------------------------------------------ helpers

    def estimate(self, pool: str, req: Request) -> int:
        """Milli-GPU a request will hold (for memory requests: on the largest allowed GPU)."""
        key = (pool, id(req))
        known = self.estimates.get(key)
        if known is None:
            known = self.estimates[key] = self._estimate(pool, req)
        return known

    def _estimate(self, pool: str, req: Request) -> int:
        if req.gpus:
            return req.gpus * MILLI
        if req.gpu_milli:
            return req.gpu_milli
        if req.gpu_memory_mib:
            table = self.model_memory[pool]
            sizes = [m for model, m in table.items() if not req.gpu_models or model in req.gpu_models]
            biggest = max(sizes, default=0)
            return -(-req.gpu_memory_mib * MILLI // biggest) if biggest else MILLI
        return 0

    def place(self, pool: str, req: Request) -> Assignment | None:
        """Placement with a per-cycle memo of shapes that did not fit.

        Free capacity only shrinks while the cycle places work, so a shape that
        failed still fails, and so does any shape asking at least as much
        (:mod:`gpupool.policy.memo`), until the generation says room grew back.
        """
        generation = self.cap.generation
        if self.place_failed.get(pool, req, generation):
            return None
        found = self.cap.find(pool, req)
        if found is None:
            self.place_failed.add(pool, req, generation, True)
        return found

    def fits_empty(self, pool: str, req: Request) -> bool:
        key = (pool, id(req))
        known = self.empty_fit.get(key)
        if known is None:
            known = self.empty_fit[key] = self.cap.fits_empty(pool, req)
        return known

    def ratio(self, project: str) -> float:
        share = self.shares.get(project, 0.0)
        return self.usage[project] / share if share > 0 else math.inf

    def standing(self, project: str) -> float:
        """Pass 2's order: (use now + recent use) / fair share; with no history, :meth:`ratio`."""
        share = self.shares.get(project, 0.0)
        return (self.usage[project] + self.recent[project]) / share if share > 0 else math.inf

    def start(self, w: Workload, req: Request, a: Assignment, note: str = "") -> None:
        self.cap.commit(a, req)
        self.started.append(Started(w, req, a, note))
        milli = self.milli[w.id] = a.total_milli
        if w.kind is Kind.BUILD:
            self.build_used[w.project] += milli
            self.build_holders[w.project].append((w.id, milli))
        else:
            self.usage[w.project] += milli
            self.touched.add(w.project)

    # ------------------------------------------------------------ the cycle

    def sort_pending(self) -> tuple[list[Workload], list[Workload], dict[str, list[Request]]]:
        """Intern the pending jobs' requests and reject what cannot be read.

        Returns (build jobs, training jobs, per pool the distinct requests of all its pending jobs). Replicas
        of multi-node gangs are left out of the first two and grouped per gang in ``pending_replicas``
        (:meth:`setup_gangs` sees to them); a gang whose replicas agree (one request object, one project,
        one kind: the service's gangs) is read once, not once per replica.
        """
        builds: list[Workload] = []
        trains: list[Workload] = []
        intern, req_of, problems = self.interner.intern, self.req_of, {}
        # Callers often share one Request object among many workloads: look those up by identity
        # before hashing the dataclass (the snapshot keeps every request alive, so ids are stable).
        # One table per kind, so that its values are also each pool's distinct requests.
        # id(request object) -> (its interned request, what is wrong with it or None)
        by_kind: dict[Kind, dict[int, tuple[Request, str | None]]] = {Kind.BUILD: {}, Kind.TRAIN: {}}
        groups: dict[str, list[Workload]] = {}  # gang id -> its pending replicas, in id order
        self.pending_replicas = groups

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
        projects, build, rejects, to_build, to_train = self.projects, Kind.BUILD, self.rejects, builds.append, trains.append
        train_table = by_kind[Kind.TRAIN]
        for w in self.pending:
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

    def run(self) -> Decisions:
        builds = sorted(self.builds, key=job_order)
        for w in builds:
            self.schedule_build(w, self.req_of[w.id])
        self.cap.drop(BUILD_POOL)  # build work is placed; train commits need not update its state
        trains = self.admissible_trains(self.trains)
        if self.gang_need and self.pending_need is not None:
            self.gang_pending_need(self.pending_need)  # a gang needs all its replicas' GPUs
        self.compute_shares(trains)
        self.train_pass(trains, first=True)
        return self.decisions()

    def refuse_or_wait(self, workload_id: str, never: str, not_now: str) -> None:
        """Refuse work the pool can never hold; on an elastic pool (a cluster) let it wait for a node that can.

        A fixed machine will not grow, so waiting would be forever; a cluster's
        nodes join and leave (autoscaling, a node drained for repair), and
        refusing there would lose a paused job or a gang whose node left.
        """
        if self.cfg.elastic_pool:
            self.waits.append(Wait(workload_id, f"{not_now}; it waits for such a node to join the pool"))
        else:
            self.rejects.append(Reject(workload_id, never))

    # ------------------------------------------------------------ build work

    def schedule_build(self, w: Workload, req: Request) -> None:
        p = self.projects[w.project]
        if not self.fits_empty(BUILD_POOL, req):
            self.refuse_or_wait(w.id, f"no node of the build pool can ever hold {txt.describe(req)}",
                                f"no node of the build pool can hold {txt.describe(req)} now")
            return
        used = self.build_used[p.name]
        need = self.estimate(BUILD_POOL, req)
        if used + need > p.build_quota_milli:
            self.rejects.append(Reject(w.id, self.over_build_quota(p, need)))
            return
        a = self.place(BUILD_POOL, req)
        if a is None:
            # training on nodes shared with the build pool gives way (gpupool/policy/build_reclaim.py)
            why = self.claim_build_room(w, req, p)
            if why is not None:
                self.waits.append(Wait(w.id, why))
            return
        if used + a.total_milli > p.build_quota_milli:
            self.waits.append(Wait(
                w.id,
                f"the only GPU with room takes {txt.gpus(a.total_milli)} for this request, more than the "
                f"{txt.gpus(p.build_quota_milli - used)} left of project {p.name}'s build quota",
            ))
            return
        self.start(w, req, a)

    def over_build_quota(self, p: Project, need: int) -> str:
        used = self.build_used[p.name]
        return (
            f"project {p.name} has a build quota of {txt.gpus(p.build_quota_milli)}; "
            f"{txt.gpus(used)} is held by {txt.holders(self.build_holders[p.name])}; "
            f"this request needs {txt.gpus(need)} more"
        )
