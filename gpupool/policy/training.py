"""Training work in the cycle: the two passes over the queue, and why a job that does not start waits.

A mixin of the engine's cycle object (:class:`gpupool.policy.engine._Cycle`),
as reclaim and gangs are. The rules are those of the engine's docstring and
docs/policy.md: pass 1 takes jobs within their project's guarantee (and
starving jobs), which may reclaim; pass 2 takes the rest on idle capacity.
Each pending job is considered once or twice a cycle, so the loop keeps to
locals and answers most jobs from memos: a job like one that just waited
(same shape, project and priority, nothing changed since) waits for the same
reason, and reasons are built once per shape and project state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.fairshare import ShareInput, fair_shares
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import TRAIN_POOL, Assignment, Project, Reject, Request, Wait, Workload
from gpupool.policy.queue import FairQueue

if TYPE_CHECKING:
    from gpupool.policy.gangs import Gang


class TrainingMixin(CycleState):
    """Training passes, reasons for waiting, and starvation reservations (see the module docstring)."""

    if TYPE_CHECKING:  # beyond CycleState's (set by the engine, reclaim and gangs)
        needs: dict[int, int]
        gang_need: dict[str, int]
        verdicts: dict[tuple, tuple[int, int, int, str]]
        reasons: dict[tuple, str]
        pending_need: dict[str, int] | None
        history: bool
        reclaim_failed: FailureMemo[tuple[int, bool]]

        def refuse_or_wait(self, workload_id: str, never: str, not_now: str) -> None: ...
        def ratio(self, project: str) -> float: ...
        def standing(self, project: str) -> float: ...
        def place(self, pool: str, req: Request) -> Assignment | None: ...
        def reclaim(self, w: Workload, req: Request, p: Project, within: bool) -> str | None: ...
        def reclaim_units(self, claimants: list[Workload] | tuple[Workload, ...], req: Request, size: int,
                          p: Project, within: bool, gang: Gang | None) -> str | None: ...
        def gang_turn(self, w: Workload, first: bool, deferred: list[Workload], starving_from: float) -> None: ...

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
        advance, new_tuple = queue.advance, tuple.__new__
        verdicts, waits, cap, now = self.verdicts, self.waits, self.cap, self.now
        max_reservations, backoff = self.cfg.max_reservations, self.cfg.resume_backoff_s
        guarantee = {name: p.train_guarantee_milli for name, p in projects.items()}
        # (the loop runs once per pending job, most of them answered from the verdict memo: locals only)
        w = queue.pop()
        while w is not None:
            name = w.project
            if gang_need and w.id in gang_need:
                used = usage[name]
                self.gang_turn(w, first, deferred, starving_from)  # all replicas at once (gangs.py)
                w = advance(name, usage[name] == used)
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
                w = advance(name, True)
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
                waits.append(new_tuple(Wait, (w.id, seen[3])))  # (Wait(w.id, seen[3]), built in C)
            else:
                before = len(waits)
                self.schedule_train(w, req, projects[name], need, within)
                if len(waits) > before and self.n_reservers == n_reserved and settled:
                    verdicts[key] = (cap.generation, usage[name], n_reserved, waits[-1].reason)
            w = advance(name, usage[name] == used)  # (a job that waited changed nothing: its ratio stands)
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
