"""The scheduling cycle: one :class:`Snapshot` in, one :class:`Decisions` out.

The rules are written down for users in docs/policy.md; in short:

* **Build** work (interactive kernels) runs on the build pool, only within its
  project's fixed build quota, and is never paused. Over the quota it is
  rejected; within it but with no room (the admin gave out more quota than the
  pool holds) it waits.
* **Training** work runs on the train pool in two passes. Pass 1 takes the
  jobs that keep their project within its guarantee; such a job that does not
  fit may *reclaim*: pause jobs of projects above their guarantee. Pass 2 takes
  the rest, which may only use idle capacity and start as preemptible. In each
  pass jobs go by priority, then by the project furthest below its fair share
  (:mod:`scheduler.policy.fairshare`), then by submission time.
* A job may pause lower-priority jobs of its own project.
* A job that has waited longer than ``starvation_s`` and still does not fit
  reserves the node closest to fitting it; nothing else starts there.
* A paused job is not resumed within ``resume_backoff_s`` of its pause unless
  it runs within its project's guarantee (where nothing can pause it again).

Everything is deterministic: inputs are sorted by id before use, ties are
broken by names and ids, and no clock or random source is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.policy import reasons as txt
from scheduler.policy.capacity import Capacity
from scheduler.policy.fairshare import ShareInput, fair_shares
from scheduler.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Kind,
    Preempt,
    Project,
    Reject,
    Request,
    Snapshot,
    Start,
    Wait,
    Workload,
)
from scheduler.policy.queue import FairQueue, job_order


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide what starts where, what is paused and why, for one cycle."""
    return _Cycle(snapshot).run()


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


@dataclass
class _Started:
    workload: Workload
    assignment: Assignment
    note: str  # what is specific to this start (e.g. "on GPUs freed by pausing j1")


class _Cycle:
    """The mutable working state of one scheduling cycle."""

    def __init__(self, snap: Snapshot) -> None:
        self.cfg = snap.config
        self.now = snap.now
        self.projects: dict[str, Project] = {p.name: p for p in snap.projects}
        workloads = sorted(snap.workloads, key=lambda w: w.id)
        self.running = [w for w in workloads if w.running]
        self.pending = [w for w in workloads if not w.running]
        self.cap = Capacity(snap.nodes, self.running, (BUILD_POOL, TRAIN_POOL), self.cfg.placement)
        self.train_nodes = set(self.cap.pool_nodes[TRAIN_POOL])
        self.nodes = snap.nodes

        self.usage: dict[str, int] = dict.fromkeys(self.projects, 0)  # training milli-GPU in use
        self.build_used: dict[str, int] = dict.fromkeys(self.projects, 0)
        self.build_holders: dict[str, list[tuple[str, int]]] = {p: [] for p in self.projects}
        self.train_running: dict[str, list[Workload]] = {p: [] for p in self.projects}
        for w in self.running:
            if w.project not in self.projects:
                continue
            milli = w.assignment.total_milli if w.assignment else 0
            if w.kind is Kind.BUILD:
                self.build_used[w.project] += milli
                self.build_holders[w.project].append((w.id, milli))
            else:
                self.usage[w.project] += milli
                self.train_running[w.project].append(w)

        # largest GPU memory per model and pool, to turn memory requests into an estimated share
        self.model_memory: dict[str, dict[str, int]] = {BUILD_POOL: {}, TRAIN_POOL: {}}
        for node in snap.nodes:
            for pool in (BUILD_POOL, TRAIN_POOL):
                if pool in node.pools:
                    table = self.model_memory[pool]
                    for g in node.gpus:
                        table[g.model] = max(table.get(g.model, 0), g.memory_mib)

        self.started: list[_Started] = []
        self.preempted: dict[str, str] = {}  # workload id -> reason, in decision order
        self.rejects: list[Reject] = []
        self.waits: list[Wait] = []
        self.place_failed: dict[tuple[str, Request], int] = {}  # shape -> capacity generation it failed at
        self.reclaim_failed: dict[tuple, tuple[int, str]] = {}
        self.reserved: dict[str, str] = {}  # node -> id of the starving job holding it
        self.shares: dict[str, float] = {}
        self.queue: FairQueue | None = None
        # running training jobs beyond their project's guarantee now: the only ones reclaim may pause
        self.over_at_start = self.over_guarantee()

    # ------------------------------------------------------------ helpers

    def estimate(self, pool: str, req: Request) -> int:
        """Milli-GPU a request will hold (for memory requests: on the largest allowed GPU)."""
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
        failed still fails, until a release (reclaim) bumps the generation.
        """
        key = (pool, req)
        if self.place_failed.get(key) == self.cap.generation:
            return None
        found = self.cap.find(pool, req)
        if found is None:
            self.place_failed[key] = self.cap.generation
        return found

    def ratio(self, project: str) -> float:
        share = self.shares.get(project, 0.0)
        return self.usage[project] / share if share > 0 else math.inf

    def wait(self, w: Workload, reason: str) -> None:
        self.waits.append(Wait(w.id, reason))

    def start(self, w: Workload, a: Assignment, note: str = "") -> None:
        self.cap.commit(a, w.request)
        self.started.append(_Started(w, a, note))
        if w.kind is Kind.BUILD:
            self.build_used[w.project] += a.total_milli
            self.build_holders[w.project].append((w.id, a.total_milli))
        else:
            self.usage[w.project] += a.total_milli

    # ------------------------------------------------------------ the cycle

    def run(self) -> Decisions:
        builds: list[Workload] = []
        trains: list[Workload] = []
        for w in self.pending:
            if w.project not in self.projects:
                self.rejects.append(Reject(w.id, f"project {w.project!r} does not exist"))
            elif (problem := request_problem(w.request)) is not None:
                self.rejects.append(Reject(w.id, problem))
            elif w.kind is Kind.BUILD:
                builds.append(w)
            else:
                trains.append(w)
        builds.sort(key=job_order)
        for w in builds:
            self.schedule_build(w)
        trains = [w for w in trains if self.admissible_train(w)]
        self.compute_shares(trains)
        self.train_pass(trains, first=True)
        return self.decisions()

    # ------------------------------------------------------------ build work

    def schedule_build(self, w: Workload) -> None:
        p = self.projects[w.project]
        req = w.request
        if not self.cap.fits_empty(BUILD_POOL, req):
            self.rejects.append(Reject(w.id, f"no node of the build pool can ever hold {txt.describe(req)}"))
            return
        used = self.build_used[p.name]
        need = self.estimate(BUILD_POOL, req)
        if used + need > p.build_quota_milli:
            self.rejects.append(Reject(w.id, self.over_build_quota(p, need)))
            return
        a = self.place(BUILD_POOL, req)
        if a is None:
            self.wait(
                w,
                f"project {p.name} has {txt.gpus(p.build_quota_milli - used)} of its "
                f"{txt.gpus(p.build_quota_milli)} build quota left, but the build pool has no room for "
                f"{txt.describe(req)} now (more build quota is handed out than the pool holds); "
                "it starts when build work elsewhere ends",
            )
            return
        if used + a.total_milli > p.build_quota_milli:
            self.wait(
                w,
                f"the only GPU with room takes {txt.gpus(a.total_milli)} for this request, more than the "
                f"{txt.gpus(p.build_quota_milli - used)} left of project {p.name}'s build quota",
            )
            return
        self.start(w, a)

    def over_build_quota(self, p: Project, need: int) -> str:
        used = self.build_used[p.name]
        return (
            f"project {p.name} has a build quota of {txt.gpus(p.build_quota_milli)}; "
            f"{txt.gpus(used)} is held by {txt.holders(self.build_holders[p.name])}; "
            f"this request needs {txt.gpus(need)} more"
        )

    # ------------------------------------------------------------ training work

    def admissible_train(self, w: Workload) -> bool:
        """Reject training requests that can never run; keep the rest."""
        p = self.projects[w.project]
        if not self.cap.fits_empty(TRAIN_POOL, w.request):
            self.rejects.append(
                Reject(w.id, f"no node of the train pool can ever hold {txt.describe(w.request)}")
            )
            return False
        need = self.estimate(TRAIN_POOL, w.request)
        if p.train_limit_milli is not None and need > p.train_limit_milli:
            self.rejects.append(
                Reject(
                    w.id,
                    f"asks for {txt.gpus(need)}, more than project {p.name}'s training limit of "
                    f"{txt.gpus(p.train_limit_milli)}",
                )
            )
            return False
        return True

    def compute_shares(self, trains: list[Workload]) -> None:
        demand = dict(self.usage)
        for w in trains:
            demand[w.project] += self.estimate(TRAIN_POOL, w.request)
        capacity = 0
        for node in self.nodes:
            if node.name in self.train_nodes:
                capacity += sum(g.capacity_milli for g in node.gpus)
        # GPU share on train nodes held by anything but training (build work, unknown projects)
        for w in self.running:
            if w.assignment and w.assignment.node in self.train_nodes:
                if w.kind is Kind.BUILD or w.project not in self.projects:
                    capacity -= w.assignment.total_milli
        for s in self.started:
            if s.assignment.node in self.train_nodes:
                capacity -= s.assignment.total_milli
        inputs = {
            name: ShareInput(p.train_guarantee_milli, p.train_limit_milli, p.weight, demand[name])
            for name, p in self.projects.items()
        }
        self.shares = fair_shares(max(capacity, 0), inputs)

    def train_pass(self, jobs: list[Workload], first: bool) -> None:
        """Pass 1 (``first``): jobs within their project's guarantee. Pass 2: the rest."""
        queue = FairQueue(jobs, self.ratio)
        self.queue = queue
        deferred: list[Workload] = []
        while (w := queue.pop()) is not None:
            p = self.projects[w.project]
            need = self.estimate(TRAIN_POOL, w.request)
            within = self.usage[p.name] + need <= p.train_guarantee_milli
            if first and not within:
                deferred.append(w)
            else:
                self.schedule_train(w, p, need, within)
            queue.touch(p.name)
        if first:
            self.train_pass(deferred, first=False)

    def schedule_train(self, w: Workload, p: Project, need: int, within: bool) -> None:
        cfg = self.cfg
        limit = p.train_limit_milli
        if limit is not None and self.usage[p.name] + need > limit:
            self.wait(
                w,
                f"project {p.name} is at its training limit: it uses {txt.gpus(self.usage[p.name])} of "
                f"{txt.gpus(limit)} and this job needs {txt.gpus(need)}",
            )
            return
        if not within and w.paused_at is not None and self.now - w.paused_at < cfg.resume_backoff_s:
            self.wait(
                w,
                f"paused {txt.seconds(self.now - w.paused_at)} ago; it resumes on idle GPUs only after "
                f"{txt.seconds(cfg.resume_backoff_s)} (anti-flapping), or sooner within project "
                f"{p.name}'s guarantee",
            )
            return
        a = self.place(TRAIN_POOL, w.request)
        if a is not None:
            if limit is not None and self.usage[p.name] + a.total_milli > limit:
                self.wait(w, f"where it fits it would take {txt.gpus(a.total_milli)}, past project "
                             f"{p.name}'s training limit of {txt.gpus(limit)}")
                return
            self.start(w, a)
            return
        why = self.reclaim(w, p, within)
        if why is None:
            return
        reserved = self.reserve(w)
        if reserved is not None:
            self.wait(w, reserved)
            return
        self.wait(w, why)

    # ------------------------------------------------------------ reclaim

    def victim_key(self, v: Workload) -> tuple[float, int, float, str]:
        """Order of victims: most above fair share first, then lowest priority, then least run time."""
        over = self.usage[v.project] - self.shares.get(v.project, 0.0)
        started = v.started_at if v.started_at is not None else -math.inf
        return (-over, v.priority, -started, v.id)

    def reclaim(self, w: Workload, p: Project, within: bool) -> str | None:
        """Try to make room for ``w`` by pausing other jobs; start it and return None, or say why not."""
        req = w.request
        key = (p.name, req, w.priority, within)
        memo = self.reclaim_failed.get(key)
        if memo is not None and memo[0] == self.cap.generation:
            return memo[1]
        why = self._reclaim(w, p, within)
        if why is not None:
            self.reclaim_failed[key] = (self.cap.generation, why)
        return why

    def _reclaim(self, w: Workload, p: Project, within: bool) -> str | None:
        cfg = self.cfg
        req = w.request
        ledger = self.cap.ledger
        min_start = self.now - cfg.min_runtime_s
        protected = 0
        by_node: dict[str, list[Workload]] = {}
        for name, jobs in self.train_running.items():
            if name == p.name:
                eligible = [v for v in jobs if v.priority < w.priority]
            elif within and self.usage[name] > self.projects[name].train_guarantee_milli:
                eligible = [v for v in jobs if v.id in self.over_at_start]
            else:
                continue
            for v in eligible:
                if v.id in self.preempted or v.assignment is None or v.assignment.node not in self.train_nodes:
                    continue
                if v.started_at is not None and v.started_at > min_start:
                    protected += 1
                    continue
                by_node.setdefault(v.assignment.node, []).append(v)
        if not by_node:
            return self.no_room(w, p, within, protected, tried=False)

        for victims in by_node.values():
            victims.sort(key=self.victim_key)
        order = sorted(by_node, key=lambda n: (self.victim_key(by_node[n][0]), ledger.order[n]))
        best: tuple[int, list[tuple], int, list[Workload]] | None = None
        for node in order:
            if best is not None and best[0] == 1 and best[1][0] <= self.victim_key(by_node[node][0]):
                break
            if not ledger.could_ever_fit(node, req):
                continue
            chosen = self.victims_on_node(w, p, node, by_node[node])
            if chosen is None:
                continue
            cand = (len(chosen), [self.victim_key(v) for v in chosen], ledger.order[node], chosen)
            if best is None or cand[:3] < best[:3]:
                best = cand
        if best is None:
            return self.no_room(w, p, within, protected, tried=True)
        return self.apply_reclaim(w, p, best[3])

    def victims_on_node(self, w: Workload, p: Project, node: str, victims: list[Workload]) -> list[Workload] | None:
        """Fewest victims on ``node`` (in victim order) whose pause lets ``w`` fit there, or None."""
        ledger = self.cap.ledger
        req = w.request
        left: dict[str, int] = {}
        chosen: list[Workload] = []
        fits = False
        for v in victims:
            m = v.assignment.total_milli if v.assignment else 0
            if v.project != p.name:
                after = left.get(v.project, self.usage[v.project]) - m
                if after < self.projects[v.project].train_guarantee_milli:
                    continue  # never push a project below its guarantee
                left[v.project] = after
            chosen.append(v)
            ledger.give(v.assignment, v.request)
            if ledger.fits(node, req):
                fits = True
                break
        if fits:
            # drop victims that turn out unnecessary, least preferred first
            for v in reversed(chosen[:-1]):
                ledger.take(v.assignment, v.request)
                if ledger.fits(node, req):
                    chosen.remove(v)
                else:
                    ledger.give(v.assignment, v.request)
        for v in chosen:
            ledger.take(v.assignment, v.request)
        return chosen if fits else None

    def apply_reclaim(self, w: Workload, p: Project, victims: list[Workload]) -> str | None:
        before = {v.project: self.usage[v.project] for v in victims}
        for v in victims:
            self.cap.release(v.assignment, v.request)
            self.usage[v.project] -= v.assignment.total_milli
        a = self.cap.find(TRAIN_POOL, w.request)
        limit = p.train_limit_milli
        if a is None or (limit is not None and self.usage[p.name] + a.total_milli > limit):
            for v in victims:  # placement disagrees with the ledger: undo, nobody is paused
                self.cap.commit(v.assignment, v.request)
                self.usage[v.project] += v.assignment.total_milli
            return self.no_room(w, p, True, 0, tried=True)
        for v in victims:
            if v.project == p.name:
                reason = (
                    f"paused for higher-priority job {w.id} (priority {w.priority} > {v.priority}) "
                    f"of the same project {p.name}"
                )
            else:
                q = self.projects[v.project]
                reason = (
                    f"paused to give GPUs back to project {p.name} (below its "
                    f"{txt.gpus(p.train_guarantee_milli)} guarantee) for job {w.id}: project {q.name} "
                    f"used {txt.gpus(before[q.name])}, over its {txt.gpus(q.train_guarantee_milli)} "
                    f"guarantee (fair share {txt.gpus(self.shares.get(q.name, 0.0))})"
                )
            self.preempted[v.id] = reason
            if self.queue is not None:
                self.queue.touch(v.project)
        self.start(w, a, note="on GPUs freed by pausing " + ", ".join(v.id for v in victims))
        return None

    def no_room(self, w: Workload, p: Project, within: bool, protected: int, tried: bool) -> str:
        base = f"no room for {txt.describe(w.request)} on the train pool"
        if self.reserved:
            base += " (reserved for starving jobs: " + ", ".join(
                f"{node} for {job}" for node, job in sorted(self.reserved.items())
            ) + ")"
        if not within:
            return (
                f"{base}; project {p.name} uses {txt.gpus(self.usage[p.name])} of its "
                f"{txt.gpus(p.train_guarantee_milli)} guarantee, so this job waits for idle GPUs"
            )
        if protected:
            return (
                f"{base}; jobs that could be paused for it started less than "
                f"{txt.seconds(self.cfg.min_runtime_s)} ago (minimum run time)"
            )
        if tried:
            return f"{base}; pausing jobs above their guarantee would not free a node that fits it"
        return f"{base}; no other project runs above its guarantee"

    # ------------------------------------------------------------ starvation

    def reserve(self, w: Workload) -> str | None:
        """Head-of-line reservation for a job starving longer than ``starvation_s``."""
        cfg = self.cfg
        req = w.request
        if len(self.reserved) >= cfg.max_reservations or not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            return None
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        waited = self.now - since
        if waited < cfg.starvation_s:
            return None
        ledger = self.cap.ledger
        nodes = [n for n in self.cap.pool_nodes[TRAIN_POOL] if n not in self.reserved and ledger.could_ever_fit(n, req)]
        if not nodes:
            return None
        node = max(nodes, key=lambda n: (ledger.closeness(n, req), -ledger.order[n]))
        have = ledger.free_gpus_text(node)
        self.cap.block(node)
        self.reserved[node] = w.id
        return (
            f"waiting {txt.seconds(waited)}, longer than {txt.seconds(cfg.starvation_s)}: node {node} "
            f"({have}) is reserved for it and takes no new work until it fits"
        )

    # ------------------------------------------------------------ output

    def decisions(self) -> Decisions:
        flagged = self.over_guarantee()
        starts = []
        for s in self.started:
            w = s.workload
            if w.kind is Kind.BUILD:
                p = self.projects[w.project]
                reason = (
                    f"granted on {s.assignment.node} within project {p.name}'s build quota "
                    f"({txt.gpus(self.build_used[p.name])} of {txt.gpus(p.build_quota_milli)} held)"
                )
                starts.append(Start(w.id, s.assignment, False, reason))
                continue
            p = self.projects[w.project]
            pre = w.id in flagged
            if pre:
                reason = (
                    f"starts on {s.assignment.node} as preemptible: project {p.name} runs "
                    f"{txt.gpus(self.usage[p.name])} of training, over its {txt.gpus(p.train_guarantee_milli)} "
                    f"guarantee, on idle GPUs (fair share {txt.gpus(self.shares.get(p.name, 0.0))})"
                )
            else:
                reason = (
                    f"starts on {s.assignment.node} within project {p.name}'s guarantee of "
                    f"{txt.gpus(p.train_guarantee_milli)} (the project runs {txt.gpus(self.usage[p.name])} "
                    "of training after this cycle)"
                )
            if s.note:
                reason += " " + s.note
            starts.append(Start(w.id, s.assignment, pre, reason))
        running_flagged = sorted(
            w.id for jobs in self.train_running.values() for w in jobs if w.id in flagged and w.id not in self.preempted
        )
        return Decisions(
            starts=tuple(starts),
            preempts=tuple(Preempt(i, r) for i, r in self.preempted.items()),
            rejects=tuple(self.rejects),
            waits=tuple(self.waits),
            preemptible=tuple(running_flagged),
        )

    def over_guarantee(self) -> set[str]:
        """Training jobs beyond their project's guarantee after this cycle.

        Within a project, jobs are counted against the guarantee by priority
        (highest first), then by start time (oldest first); the ones that push
        the sum past the guarantee are preemptible. Reclaim picks its victims
        from the other end of the same order, so the flag tells the truth.
        """
        jobs: dict[str, list[tuple[int, float, int, str, int]]] = {}
        for name, running in self.train_running.items():
            for w in running:
                if w.id not in self.preempted and w.assignment is not None:
                    started = w.started_at if w.started_at is not None else -math.inf
                    jobs.setdefault(name, []).append((-w.priority, started, 0, w.id, w.assignment.total_milli))
        for i, s in enumerate(self.started):
            w = s.workload
            if w.kind is Kind.TRAIN:
                jobs.setdefault(w.project, []).append((-w.priority, self.now, i + 1, w.id, s.assignment.total_milli))
        flagged: set[str] = set()
        for name, items in jobs.items():
            items.sort()
            total = 0
            guarantee = self.projects[name].train_guarantee_milli
            for *_, wid, milli in items:
                total += milli
                if total > guarantee:
                    flagged.add(wid)
        return flagged
