"""The scheduling cycle: one :class:`Snapshot` in, one :class:`Decisions` out.

The rules are written down for users in docs/policy.md; in short:

* **Build** work (interactive kernels) runs on the build pool, only within its
  project's fixed build quota, and is never paused. Over the quota it is
  rejected; within it but with no room it may pause training on nodes shared
  with the train pool (:mod:`scheduler.policy.build_reclaim`), and waits only
  when that cannot make room (the admin gave out more quota than the pool holds).
* **Training** work runs on the train pool in two passes. Pass 1 takes the
  jobs of projects below their guarantee (the job may take its project past
  it: a project claims its guarantee with its next job, whatever its size,
  and that job is not preemptible); such a job that does not fit may *reclaim*: pause jobs of projects above their guarantee
  (:mod:`scheduler.policy.reclaim`). Pass 2 takes the rest, which may only use
  idle capacity and start as preemptible. In each pass jobs go by priority,
  then by the project furthest below its fair share
  (:mod:`scheduler.policy.fairshare`), then by submission time. In pass 2 and
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import filterfalse
from operator import attrgetter

from scheduler.policy import reasons as txt
from scheduler.policy.build_reclaim import BuildReclaimMixin
from scheduler.policy.capacity import Capacity
from scheduler.policy.fairshare import ShareInput, fair_shares
from scheduler.policy.gang_reclaim import GangReclaimMixin
from scheduler.policy.gangs import GangMixin, flag_units
from scheduler.policy.interning import Interner
from scheduler.policy.memo import FailureMemo
from scheduler.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Kind,
    Node,
    Preempt,
    Project,
    Reject,
    Request,
    Snapshot,
    Start,
    Wait,
    Workload,
)
from scheduler.policy.nodecache import for_nodes
from scheduler.policy.queue import FairQueue, job_order
from scheduler.policy.reclaim import ReclaimMixin, sort_by_start


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide what starts where, what is paused and why, for one cycle.

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


def _new_then_priority(item: tuple[Workload, int]) -> tuple[int, int]:
    """Sort key, used reversed: higher priority first; within it running jobs (0) before new starts (1)."""
    return (item[0].priority, -item[1])


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


@dataclass
class _Started:
    workload: Workload
    request: Request  # the interned request
    assignment: Assignment
    note: str  # what is specific to this start (e.g. "on GPUs freed by pausing j1")


class _Cycle(ReclaimMixin, BuildReclaimMixin, GangMixin, GangReclaimMixin):
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
        self.interner = Interner()  # (helped by the last cycle's answers: scheduler/policy/interning.py)
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

        self.started: list[_Started] = []
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
        # multi-node gangs (scheduler/policy/gangs.py): one queue entry per gang; those that cannot run
        # whole are decided here (nothing happens when no workload is in a gang)
        self.builds, self.trains = self.setup_gangs(workloads, self.builds, self.trains)
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
        (:mod:`scheduler.policy.memo`), until the generation says room grew back.
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
        self.started.append(_Started(w, req, a, note))
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

        Returns (build jobs, training jobs, per pool the distinct requests of all its pending jobs); replicas
        of multi-node gangs are left out of the first two (:meth:`setup_gangs` sees to them).
        """
        builds: list[Workload] = []
        trains: list[Workload] = []
        intern, req_of, problems = self.interner.intern, self.req_of, {}
        # Callers often share one Request object among many workloads: look those up by identity
        # before hashing the dataclass (the snapshot keeps every request alive, so ids are stable).
        # One table per kind, so that its values are also each pool's distinct requests.
        # id(request object) -> (its interned request, what is wrong with it or None)
        by_kind: dict[Kind, dict[int, tuple[Request, str | None]]] = {Kind.BUILD: {}, Kind.TRAIN: {}}
        # (this loop runs once per pending workload, replicas of gangs included: locals only)
        projects, build, rejects, to_build, to_train = self.projects, Kind.BUILD, self.rejects, builds.append, trains.append
        for w in self.pending:
            r = w.request
            kind = w.kind
            by_obj = by_kind[kind]
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
                rejects.append(Reject(w.id, f"project {w.project!r} does not exist"))
            elif problem is not None:
                rejects.append(Reject(w.id, problem))
            elif w.gang:
                pass  # a replica of a multi-node gang: setup_gangs decides it, or queues its gang as one entry
            elif kind is build:
                to_build(w)
            else:
                to_train(w)
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
            # training on nodes shared with the build pool gives way (scheduler/policy/build_reclaim.py)
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

    # ------------------------------------------------------------ training work

    def admissible_trains(self, trains: list[Workload]) -> list[Workload]:
        """Reject training requests that can never run; keep the rest (checked once per shape)."""
        kept = []
        need_of: dict[int, int | None] = {}  # id(request) -> estimated need, None if no empty node holds it
        req_of, projects = self.req_of, self.projects
        # what the kept jobs ask for per project, summed here rather than in a second pass for the shares
        self.pending_need = pending = dict.fromkeys(projects, 0)
        for w in trains:
            req = req_of[w.id]
            need = need_of.get(id(req), -1)
            if need == -1:
                need = need_of[id(req)] = (
                    self.estimate(TRAIN_POOL, req) if self.fits_empty(TRAIN_POOL, req) else None
                )
            if need is None:
                self.refuse_or_wait(w.id, f"no node of the train pool can ever hold {txt.describe(req)}",
                                    f"no node of the train pool can hold {txt.describe(req)} now")
                continue
            limit = projects[w.project].train_limit_milli
            if limit is not None and need > limit:
                self.rejects.append(Reject(
                    w.id,
                    f"asks for {txt.gpus(need)}, more than project {w.project}'s training limit of "
                    f"{txt.gpus(limit)}",
                ))
                continue
            kept.append(w)
            pending[w.project] += need
        return kept

    def compute_shares(self, trains: list[Workload]) -> None:
        capacity = self.train_capacity
        for s in self.started:  # build work started this cycle on train nodes
            if s.assignment.node in self.train_nodes:
                capacity -= s.assignment.total_milli
        self.shares = self.train_shares(trains, capacity, self.pending_need)

    def train_shares(
        self, trains: Iterable[Workload], capacity: int, pending: dict[str, int] | None = None
    ) -> dict[str, float]:
        """Fair shares of ``capacity``; demand: training in use plus the estimated needs of ``trains``.

        ``pending``: those needs already summed per project (by :meth:`admissible_trains`).
        """
        demand = dict(self.usage)
        if pending is not None:
            for name, need in pending.items():
                demand[name] += need
        else:
            req_of, needs = self.req_of, self.needs
            for w in trains:
                demand[w.project] += needs[id(req_of[w.id])]
        inputs = {
            name: ShareInput(p.train_guarantee_milli, p.train_limit_milli, p.weight, demand[name])
            for name, p in self.projects.items()
        }
        return fair_shares(max(capacity, 0), inputs)

    def train_pass(self, jobs: list[Workload], first: bool) -> None:
        """Pass 1 (``first``): jobs within their project's guarantee, and starving jobs. Pass 2: the rest."""
        projects, usage, req_of = self.projects, self.usage, self.req_of
        needs = self.needs
        gang_need = self.gang_need  # first replica's id -> the gang's need (empty without gangs)
        starving_from = self.now - self.cfg.starvation_s
        deferred: list[Workload] = []
        if first:
            # Jobs of projects already at or beyond their guarantee go straight to pass 2: in pass 1
            # a project's use grows (reclaim never takes a project below its guarantee), so they
            # would be deferred at their turn anyway. (A project whose own priority swap lowered its use
            # gets such jobs in pass 2, where "within guarantee" is checked again and may reclaim.)
            # Starving jobs stay (see below).
            room = {name: p.train_guarantee_milli - usage[name] for name, p in projects.items()}
            now_jobs = []
            for w in jobs:
                left = room[w.project]
                need = gang_need.get(w.id, 0) or needs[id(req_of[w.id])] if gang_need else needs[id(req_of[w.id])]
                if left > 0 or need <= left or (
                    (w.paused_at if w.paused_at is not None else w.submitted_at) <= starving_from
                ):
                    now_jobs.append(w)
                else:
                    deferred.append(w)
            jobs = now_jobs
        # Guarantees do not depend on history: pass 1 orders by use now; idle capacity beyond the
        # guarantees (pass 2) goes first to the projects with the least use, now and recently, for their share.
        queue = FairQueue(jobs, self.standing if self.history and not first else self.ratio)
        self.queue = queue
        pop, touch = queue.pop, queue.touch
        verdicts, waits, cap, now = self.verdicts, self.waits, self.cap, self.now
        max_reservations, backoff = self.cfg.max_reservations, self.cfg.resume_backoff_s
        guarantee = {name: p.train_guarantee_milli for name, p in projects.items()}
        # (the loop runs once per pending job, most of them answered from the verdict memo: locals only)
        while (w := pop()) is not None:
            name = w.project
            if gang_need and w.id in gang_need:
                used = usage[name]
                self.gang_turn(w, first, deferred, starving_from)  # all replicas at once (gangs.py)
                touch(name, usage[name] == used)
                continue
            req = req_of[w.id]
            need = needs[id(req)]
            used = usage[name]
            g = guarantee[name]
            # A project below its guarantee claims it with its next job, even one that takes it past
            # the guarantee (a gang bigger than what is left); see over_guarantee for why that job is
            # then protected.
            within = used < g or used + need <= g
            paused = w.paused_at
            since = paused if paused is not None else w.submitted_at
            if first and not within and since > starving_from:
                deferred.append(w)
                touch(name, True)
                continue
            # (a starving job is served at its place in the order even beyond its guarantee, so that
            # within-guarantee jobs behind it cannot keep taking the room it waits for)
            # A job like one that just waited (same shape, project, priority, nothing changed since)
            # waits for the same reason; only a starving job must still try for a reservation.
            key = (id(req), name, within, w.priority)
            seen = verdicts.get(key)
            n_reserved = self.n_reservers
            settled = within or paused is None or now - paused >= backoff
            if (
                seen is not None and seen[0] == cap.generation and seen[1] == used and seen[2] == n_reserved
                and (n_reserved >= max_reservations or since > starving_from) and settled
            ):
                waits.append(Wait(w.id, seen[3]))
            else:
                before = len(waits)
                self.schedule_train(w, req, projects[name], need, within)
                if len(waits) > before and self.n_reservers == n_reserved and settled:
                    verdicts[key] = (cap.generation, usage[name], n_reserved, waits[-1].reason)
            touch(name, usage[name] == used)  # (a job that waited changed nothing: its ratio stands)
        if first:
            # pass 2 starts push projects above their guarantee, which changes who may be paused
            self.reclaim_failed = FailureMemo()
            self.train_pass(deferred, first=False)

    def schedule_train(self, w: Workload, req: Request, p: Project, need: int, within: bool) -> None:
        cfg = self.cfg
        limit = p.train_limit_milli
        used = self.usage[p.name]
        if limit is not None and used + need > limit:
            self.waits.append(Wait(w.id, self.reason(
                ("limit", p.name, used, need),
                lambda: f"project {p.name} is at its training limit: it uses {txt.gpus(used)} of "
                        f"{txt.gpus(limit)} and this job needs {txt.gpus(need)}",
            )))
            return
        if not within and w.paused_at is not None and self.now - w.paused_at < cfg.resume_backoff_s:
            self.waits.append(Wait(
                w.id,
                f"paused {txt.seconds(self.now - w.paused_at)} ago; it resumes on idle GPUs only after "
                f"{txt.seconds(cfg.resume_backoff_s)} (anti-flapping), or sooner within project "
                f"{p.name}'s guarantee",
            ))
            return
        a = self.place(TRAIN_POOL, req)
        if a is not None:
            if limit is not None and used + a.total_milli > limit:
                self.waits.append(Wait(w.id, f"where it fits it would take {txt.gpus(a.total_milli)}, past "
                                             f"project {p.name}'s training limit of {txt.gpus(limit)}"))
                return
            self.start(w, req, a)
            return
        why = self.reclaim(w, req, p, within)
        if why is None:
            return
        if self.running_gangs:
            # the plain reclaim leaves gangs out (a gang is paused whole or not at all): try with them as units
            why_units = self.reclaim_units((w,), req, 1, p, within, None)
            if why_units is None:
                return
        reserved = self.reserve(w, req)
        self.waits.append(Wait(w.id, reserved if reserved is not None else why))

    def reason(self, key: tuple, build: Callable[[], str]) -> str:
        """A reason string, built once per distinct ``key`` in the cycle."""
        text = self.reasons.get(key)
        if text is None:
            text = self.reasons[key] = build()
        return text

    def no_room(self, req: Request, p: Project, within: bool, protected: int, tried: bool) -> str:
        """Why a training job that does not fit waits.

        Its two halves are memoised apart: what does not fit (per shape, while
        the reservations stay the same) and why nothing gives way (per project
        state). Thousands of waiting jobs mix a few hundred shapes with a few
        dozen project states.
        """
        n_reserved = len(self.reserved)
        what = self.reason(("room", id(req), n_reserved), lambda: self._no_room_for(req))
        why = self.reason(("why", p.name, self.usage[p.name], within, protected, tried),
                          lambda: self._why_no_room(p, within, protected, tried))
        return what + why

    def _no_room_for(self, req: Request) -> str:
        base = f"no room for {txt.describe(req)} on the train pool"
        if self.reserved:
            base += " (reserved for starving jobs: " + ", ".join(
                f"{node} for {job}" for node, job in sorted(self.reserved.items())
            ) + ")"
        return base

    def _why_no_room(self, p: Project, within: bool, protected: int, tried: bool) -> str:
        used, guarantee = txt.gpus(self.usage[p.name]), txt.gpus(p.train_guarantee_milli)
        if not within:
            text = (
                f"; project {p.name} runs {used} of training against a guarantee of {guarantee}, "
                "so this job waits for idle GPUs"
            )
            if self.history:
                text += (
                    f"; idle GPUs go first to projects that used less of their fair share lately: "
                    f"project {p.name} held {txt.gpus(self.recent[p.name])} on average recently "
                    f"(fair share now {txt.gpus(self.shares.get(p.name, 0.0))})"
                )
            return text
        if protected:
            return (
                f"; jobs that could be paused for it started less than "
                f"{txt.seconds(self.cfg.min_runtime_s)} ago (minimum run time)"
            )
        if tried:
            return "; pausing jobs above their guarantee would not free a node that fits it"
        return "; no other project runs above its guarantee"

    # ------------------------------------------------------------ starvation

    def reserve(self, w: Workload, req: Request) -> str | None:
        """Head-of-line reservation for a job starving longer than ``starvation_s``."""
        cfg = self.cfg
        if self.n_reservers >= cfg.max_reservations or not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            return None
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        waited = self.now - since
        if waited < cfg.starvation_s:
            return None
        node = self.cap.states[TRAIN_POOL].closest(req, skip=self.reserved)
        if node is None:
            return None
        have = self.cap.ledger.free_gpus_text(node)
        self.cap.block(node)
        self.reserved[node] = w.id
        self.n_reservers += 1
        return (
            f"waiting {txt.seconds(waited)}, longer than {txt.seconds(cfg.starvation_s)}: node {node} "
            f"({have}) is reserved for it and takes no new work until it fits"
        )

    # ------------------------------------------------------------ output

    def decisions(self) -> Decisions:
        flags = dict(self.flags_at_start)
        started_by: dict[str, list[tuple[int, _Started]]] = {}
        for i, s in enumerate(self.started):
            if s.workload.kind is Kind.TRAIN:
                started_by.setdefault(s.workload.project, []).append((i, s))
        for name in self.touched:
            flags[name] = self.over_guarantee(name, started_by.get(name, []))
        flagged: set[str] = set().union(*flags.values()) if flags else set()
        starts = []
        for s in self.started:
            w = s.workload
            p = self.projects[w.project]
            if w.kind is Kind.BUILD:
                reason = (
                    f"granted on {s.assignment.node} within project {p.name}'s build quota "
                    f"({txt.gpus(self.build_used[p.name])} of {txt.gpus(p.build_quota_milli)} held)"
                ) + (" " + s.note if s.note else "")
                starts.append(Start(w.id, s.assignment, False, reason))
                continue
            pre = w.id in flagged
            # (what follows the node depends only on the project and the flag: built once for each)
            reason = f"starts on {s.assignment.node}" + self.reason(("start", p.name, pre),
                                                                   lambda p=p, pre=pre: self._start_reason(p, pre))
            if s.note:
                reason += " " + s.note
            starts.append(Start(w.id, s.assignment, pre, reason))
        # flagged holds running training jobs and this cycle's starts (over_guarantee): the running ones
        # still running are the rest, found without a pass over every running job
        started_ids = {s.workload.id for s in self.started}
        preempted = self.preempted
        running_flagged = sorted(i for i in flagged if i not in preempted and i not in started_ids)
        return Decisions(
            starts=tuple(starts),
            preempts=tuple(Preempt(i, r) for i, r in self.preempted.items()),
            rejects=tuple(self.rejects),
            waits=tuple(self.waits),
            preemptible=tuple(running_flagged),
        )

    def _start_reason(self, p: Project, pre: bool) -> str:
        """Why a training job of project ``p`` starts, after "starts on <node>" (usage as after this cycle)."""
        used, guarantee = txt.gpus(self.usage[p.name]), txt.gpus(p.train_guarantee_milli)
        if pre:
            return (
                f" as preemptible: project {p.name} runs {used} of training, "
                f"over its guarantee of {guarantee}, on idle GPUs "
                f"(fair share {txt.gpus(self.shares.get(p.name, 0.0))}"
                + (f", {txt.gpus(self.recent[p.name])} on average recently" if self.recent[p.name] else "")
                + ")"
            )
        if self.usage[p.name] > p.train_guarantee_milli:
            return (
                f" on project {p.name}'s guarantee of {guarantee}: the project "
                f"was below it, and a job started below the guarantee is not preemptible even where it "
                f"goes past it (the project runs {used} of training after this cycle)"
            )
        return (
            f" within project {p.name}'s guarantee of {guarantee} "
            f"(the project runs {used} of training after this cycle)"
        )

    def over_guarantee(self, name: str, new_starts: Sequence[tuple[int, _Started]] = ()) -> set[str]:
        """Project ``name``'s training jobs beyond its guarantee (running, not paused, plus started).

        Jobs are counted against the guarantee by priority (highest first),
        then by start time (oldest first; this cycle's starts last, in start
        order); a job is preemptible when the jobs before it already fill the
        guarantee. The job that *crosses* the guarantee (it starts below it and
        ends above) is not: pausing it would take the project below its
        guarantee, which reclaim never does. So a project below its guarantee
        may start a gang bigger than what is left of it and keep it, and
        every flagged job can be paused alone without breaking the floor.
        Reclaim picks victims from the other end of the same order, so the
        flag tells the truth about what may be paused.
        """
        preempted, milli = self.preempted, self.milli
        running = [w for w in self.train_running[name] if w.id not in preempted]
        # (priority desc, start asc, id) as stable C-level sorts, last key first: this runs for
        # every project above its guarantee on thousands of jobs each cycle
        running.sort(key=_by_id)
        sort_by_start(running)
        # this cycle's starts come after every running job of their priority, in start order
        order = [(w, 0) for w in running] + [(s.workload, 1) for _, s in new_starts]
        order.sort(key=_new_then_priority, reverse=True)
        guarantee = self.projects[name].train_guarantee_milli
        if name in self.gang_projects:
            return flag_units(order, milli, guarantee)  # a gang is flagged whole or not at all
        total = 0
        over = set()
        for w, _ in order:
            m = milli[w.id]
            if total >= guarantee and total + m > guarantee:
                over.add(w.id)
            total += m
        return over
