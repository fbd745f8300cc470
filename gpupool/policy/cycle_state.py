"""What one scheduling cycle reads and writes, in one object every phase is handed.

The cycle (:func:`gpupool.policy.engine.schedule`) runs in phases: intake,
build work, training passes (with reclaim and gangs), outcome. They share one
working state: the snapshot's indexes, free capacity, use per project, the
decisions taken so far, and a few per-cycle memos that several phases fill.
Keeping all of that in one explicit :class:`CycleState` (rather than in the
attributes of one object cut into mixins) lets each phase be a plain class
that says what it needs, and keeps calls going one way: phases import this
module, never the other way round.

Only the small operations that keep the state consistent live here (a start
updates capacity, use and the decisions at once; placement goes through a
failure memo); the rules are in the phases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpupool.policy.capacity import Capacity
from gpupool.policy.fairshare import ShareInput, fair_shares
from gpupool.policy.gang import Gang
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import (
    MILLI,
    Assignment,
    Kind,
    PolicyConfig,
    Project,
    Reject,
    Request,
    Wait,
    Workload,
)
from gpupool.policy.queue import FairQueue
from gpupool.policy.rule_reasons import never_fits


@dataclass
class Started:
    """A start decided this cycle (the output's ``Start`` is built from it at the end)."""

    workload: Workload
    request: Request  # the interned request
    assignment: Assignment
    note: str  # what is specific to this start (e.g. "on GPUs freed by pausing j1")


@dataclass(eq=False)
class CycleState:
    """The working state of one cycle, built by :func:`gpupool.policy.intake.open_cycle`.

    Containers are changed in place and never rebound (phases may keep a
    reference to them); scalars (``n_reservers``, ``train_capacity``) and
    ``shares``, ``queue`` are read through the state.
    """

    # ---------------------------------------------------------------- the snapshot, indexed
    cfg: PolicyConfig
    now: float
    projects: dict[str, Project]
    running: list[Workload]  # by id
    pending: list[Workload]  # by id
    req_of: dict[str, Request]  # pending workload id -> its interned request
    pending_replicas: dict[str, list[Workload]]  # gang id -> its pending replicas, in id order
    cap: Capacity  # free capacity per pool, and the per-node ledger
    model_memory: dict[str, dict[str, int]]  # pool -> GPU model -> largest GPU memory (MiB)
    train_nodes: set[str]
    train_capacity: int  # GPU share on train nodes not held by anything but training
    recent: dict[str, float]  # recent training use per project (0 for all when no history is kept)
    history: bool  # whether any project has recent use

    # ---------------------------------------------------------------- use, kept in step with the decisions
    usage: dict[str, int]  # training milli-GPU in use, per project
    build_used: dict[str, int]  # build milli-GPU in use, per project
    build_holders: dict[str, list[tuple[str, int]]]  # project -> (build workload id, milli-GPU) held
    train_running: dict[str, list[Workload]]  # project -> its running training jobs
    milli: dict[str, int]  # running or started workload id -> milli-GPU it holds

    # ---------------------------------------------------------------- the decisions so far
    rejects: list[Reject]
    started: list[Started] = field(default_factory=list)
    preempted: dict[str, str] = field(default_factory=dict)  # workload id -> reason, in decision order
    waits: list[Wait] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # projects whose running set changed this cycle

    # ---------------------------------------------------------------- set by the phases
    needs: dict[int, int] = field(default_factory=dict)  # id(interned request) -> est. milli-GPU on the train pool
    shares: dict[str, float] = field(default_factory=dict)  # fair shares of the train pool (training phase)
    pending_need: dict[str, int] | None = None  # per project, what its admissible jobs ask (training phase)
    queue: FairQueue | None = None  # the training pass's queue (reclaim re-ranks a victim's project)
    reserved: dict[str, str] = field(default_factory=dict)  # node -> id of the starving job holding it
    n_reservers: int = 0  # starving jobs holding a reservation (a gang's may hold several nodes)
    # running training jobs beyond each project's guarantee as the cycle starts (the only ones
    # another project's reclaim may pause), and all of them together
    flags_at_start: dict[str, set[str]] = field(default_factory=dict)
    over_at_start: set[str] = field(default_factory=set)
    # multi-node gangs (gang_setup): every gang with a replica in the snapshot, the schedulable ones
    # by first replica, and their needs (replicas x G)
    gangs: dict[str, Gang] = field(default_factory=dict)
    gang_led_by: dict[str, Gang] = field(default_factory=dict)
    gang_need: dict[str, int] = field(default_factory=dict)
    gang_projects: set[str] = field(default_factory=set)  # projects with a replica in the snapshot
    running_gangs: bool = False  # whether a replica runs (reclaim then treats gangs as single victims)

    # ---------------------------------------------------------------- per-cycle memos of the helpers below
    place_failed: FailureMemo[bool] = field(default_factory=FailureMemo)  # context: the pool
    empty_fit: dict[tuple[str, int], bool] = field(default_factory=dict)
    estimates: dict[tuple[str, int], int] = field(default_factory=dict)
    reasons: dict[tuple, str] = field(default_factory=dict)

    # ---------------------------------------------------------------- helpers

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
        """Whether some node of ``pool`` could hold ``req`` with nothing on it (once per shape)."""
        key = (pool, id(req))
        known = self.empty_fit.get(key)
        if known is None:
            known = self.empty_fit[key] = self.cap.fits_empty(pool, req)
        return known

    def ratio(self, project: str) -> float:
        """Pass 1's order: training use now / fair share (guarantees ignore history)."""
        share = self.shares.get(project, 0.0)
        return self.usage[project] / share if share > 0 else math.inf

    def standing(self, project: str) -> float:
        """Pass 2's order: (use now + recent use) / fair share; with no history, :meth:`ratio`."""
        share = self.shares.get(project, 0.0)
        return (self.usage[project] + self.recent[project]) / share if share > 0 else math.inf

    def start(self, w: Workload, req: Request, a: Assignment, note: str = "") -> None:
        """Record a start: capacity, the decision and the project's use change together."""
        self.cap.commit(a, req)
        self.started.append(Started(w, req, a, note))
        milli = self.milli[w.id] = a.total_milli
        if w.kind is Kind.BUILD:
            self.build_used[w.project] += milli
            self.build_holders[w.project].append((w.id, milli))
        else:
            self.usage[w.project] += milli
            self.touched.add(w.project)

    def reason(self, key: tuple, build: Callable[[], str]) -> str:
        """A reason string, built once per distinct ``key`` in the cycle (thousands of waits share a few)."""
        text = self.reasons.get(key)
        if text is None:
            text = self.reasons[key] = build()
        return text

    def cannot_hold(self, workload_id: str, pool: str, req: Request, never: str, not_now: str) -> None:
        """:meth:`refuse_or_wait` for work no node of ``pool`` holds even empty; when its placement rules
        (or node taints) are why, the reason names the rule instead of the size."""
        why = self.reason(("never", pool, id(req)), lambda: never_fits(self.cap.states[pool], pool, req))
        if why:
            self.refuse_or_wait(workload_id, why, f"{why} now")
        else:
            self.refuse_or_wait(workload_id, never, not_now)

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

    def train_shares(
        self, trains: Iterable[Workload], capacity: int, pending: dict[str, int] | None = None
    ) -> dict[str, float]:
        """Fair shares of ``capacity``; demand: training in use plus the estimated needs of ``trains``.

        ``pending``: those needs already summed per project (by the training
        phase's admission). Build claims ask too, before the training passes,
        to order their victims.
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
