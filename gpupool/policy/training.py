"""Training work in the cycle: the two passes over the queue, and why a job that does not start waits.

The rules are those of the engine's docstring and docs/policy.md: pass 1
takes jobs within their project's guarantee (and starving jobs), which may
reclaim; pass 2 takes the rest on idle capacity. :class:`Training` is the
phase object; it calls the reclaims (:mod:`gpupool.policy.reclaim`,
:mod:`gpupool.policy.gang_reclaim`) and a gang's turn
(:mod:`gpupool.policy.gangs`), none of which calls back.

Each pending job is considered once or twice a cycle, so the loop keeps to
locals and answers most jobs from memos: a job like one that just waited
(same shape, project and priority, nothing changed since) waits for the same
reason, and reasons are built once per shape and project state.
"""

from __future__ import annotations

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang_reclaim import GangReclaim
from gpupool.policy.gang_setup import gang_pending_need
from gpupool.policy.gangs import GangTurns
from gpupool.policy.model import TRAIN_POOL, Project, Reject, Request, Wait, Workload
from gpupool.policy.queue import FairQueue
from gpupool.policy.reclaim import Reclaim


class Training:
    """Training passes, reasons for waiting, and starvation reservations (see the module docstring)."""

    def __init__(self, state: CycleState, reclaim: Reclaim, gang_reclaim: GangReclaim, gangs: GangTurns) -> None:
        self.state = state
        self.reclaim = reclaim  # a single job's claim
        self.gang_reclaim = gang_reclaim  # a single job's claim on running gangs (whole units)
        self.gangs = gangs  # a gang's turn
        # (id(request), project, within guarantee, priority) -> (generation, use, reservers, reason):
        # see train_pass
        self.verdicts: dict[tuple, tuple[int, int, int, str]] = {}

    def run(self, trains: list[Workload]) -> None:
        """Both passes over the training jobs (gangs as their first replica), after the build phase."""
        st = self.state
        trains = self.admissible_trains(trains)
        if st.gang_need and st.pending_need is not None:
            gang_pending_need(st, st.pending_need)  # a gang needs all its replicas' GPUs
        self.compute_shares(trains)
        self.train_pass(trains, first=True)

    # ------------------------------------------------------------ training work

    def admissible_trains(self, trains: list[Workload]) -> list[Workload]:
        """Reject training requests that can never run; keep the rest (checked once per shape)."""
        st = self.state
        kept = []
        need_of: dict[int, int | None] = {}  # id(request) -> estimated need, None if no empty node holds it
        req_of, projects = st.req_of, st.projects
        # what the kept jobs ask for per project, summed here rather than in a second pass for the shares
        st.pending_need = pending = dict.fromkeys(projects, 0)
        for w in trains:
            req = req_of[w.id]
            need = need_of.get(id(req), -1)
            if need == -1:
                need = need_of[id(req)] = (
                    st.estimate(TRAIN_POOL, req) if st.fits_empty(TRAIN_POOL, req) else None
                )
            if need is None:
                st.cannot_hold(w.id, TRAIN_POOL, req, f"no node of the train pool can ever hold {txt.describe(req)}",
                                  f"no node of the train pool can hold {txt.describe(req)} now")
                continue
            limit = projects[w.project].train_limit_milli
            if limit is not None and need > limit:
                st.rejects.append(Reject(
                    w.id,
                    f"asks for {txt.gpus(need)}, more than project {w.project}'s training limit of "
                    f"{txt.gpus(limit)}",
                ))
                continue
            kept.append(w)
            pending[w.project] += need
        return kept

    def compute_shares(self, trains: list[Workload]) -> None:
        """The fair shares of the train pool for this cycle's training: its GPUs less what build work holds."""
        st = self.state
        capacity = st.train_capacity
        for s in st.started:  # build work started this cycle on train nodes
            if s.assignment.node in st.train_nodes:
                capacity -= s.assignment.total_milli
        st.shares = st.train_shares(trains, capacity, st.pending_need)

    def train_pass(self, jobs: list[Workload], first: bool) -> None:
        """Pass 1 (``first``): jobs within their project's guarantee, and starving jobs. Pass 2: the rest."""
        st = self.state
        projects, usage, req_of = st.projects, st.usage, st.req_of
        needs = st.needs
        gang_need = st.gang_need  # first replica's id -> the gang's need (empty without gangs)
        starving_from = st.now - st.cfg.starvation_s
        deferred: list[Workload] = []
        w: Workload | None
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
        queue = FairQueue(jobs, st.standing if st.history and not first else st.ratio)
        st.queue = queue
        advance, new_tuple = queue.advance, tuple.__new__
        verdicts, waits, cap, now = self.verdicts, st.waits, st.cap, st.now
        max_reservations, backoff = st.cfg.max_reservations, st.cfg.resume_backoff_s
        guarantee = {name: p.train_guarantee_milli for name, p in projects.items()}
        # (the loop runs once per pending job, most of them answered from the verdict memo: locals only)
        w = queue.pop()
        while w is not None:
            name = w.project
            if gang_need and w.id in gang_need:
                used = usage[name]
                self.gangs.take_turn(w, first, deferred, starving_from)  # all replicas at once (gangs.py)
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
            n_reserved = st.n_reservers
            settled = within or paused is None or now - paused >= backoff
            if (
                seen is not None and seen[0] == cap.generation and seen[1] == used and seen[2] == n_reserved
                and (n_reserved >= max_reservations or since > starving_from) and settled
            ):
                waits.append(new_tuple(Wait, (w.id, seen[3])))  # (Wait(w.id, seen[3]), built in C)
            else:
                before = len(waits)
                self.schedule_train(w, req, projects[name], need, within)
                if len(waits) > before and st.n_reservers == n_reserved and settled:
                    verdicts[key] = (cap.generation, usage[name], n_reserved, waits[-1].reason)
            w = advance(name, usage[name] == used)  # (a job that waited changed nothing: its ratio stands)
        if first:
            # pass 2 starts push projects above their guarantee, which changes who may be paused
            self.reclaim.new_pass()
            self.train_pass(deferred, first=False)

    def schedule_train(self, w: Workload, req: Request, p: Project, need: int, within: bool) -> None:
        st = self.state
        cfg = st.cfg
        limit = p.train_limit_milli
        used = st.usage[p.name]
        if limit is not None and used + need > limit:
            st.waits.append(Wait(w.id, st.reason(
                ("limit", p.name, used, need),
                lambda: f"project {p.name} is at its training limit: it uses {txt.gpus(used)} of "
                        f"{txt.gpus(limit)} and this job needs {txt.gpus(need)}",
            )))
            return
        if not within and w.paused_at is not None and st.now - w.paused_at < cfg.resume_backoff_s:
            st.waits.append(Wait(
                w.id,
                f"paused {txt.seconds(st.now - w.paused_at)} ago; it resumes on idle GPUs only after "
                f"{txt.seconds(cfg.resume_backoff_s)} (anti-flapping), or sooner within project "
                f"{p.name}'s guarantee",
            ))
            return
        a = st.place(TRAIN_POOL, req)
        if a is not None:
            if limit is not None and used + a.total_milli > limit:
                st.waits.append(Wait(w.id, f"where it fits it would take {txt.gpus(a.total_milli)}, past "
                                           f"project {p.name}'s training limit of {txt.gpus(limit)}"))
                return
            st.start(w, req, a)
            return
        why = self.reclaim.claim(w, req, p, within)
        if why is None:
            return
        if st.running_gangs:
            # the plain reclaim leaves gangs out (a gang is paused whole or not at all): try with them as units
            why_units = self.gang_reclaim.claim_units((w,), req, 1, p, within, None)
            if why_units is None:
                return
        reserved = self.reserve(w, req)
        st.waits.append(Wait(w.id, reserved if reserved is not None else why))

    # ------------------------------------------------------------ starvation

    def reserve(self, w: Workload, req: Request) -> str | None:
        """Head-of-line reservation for a job starving longer than ``starvation_s``."""
        st = self.state
        cfg = st.cfg
        if st.n_reservers >= cfg.max_reservations or not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            return None
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        waited = st.now - since
        if waited < cfg.starvation_s:
            return None
        node = st.cap.states[TRAIN_POOL].closest(req, skip=st.reserved)
        if node is None:
            return None
        have = st.cap.ledger.free_gpus_text(node)
        st.cap.block(node)
        st.reserved[node] = w.id
        st.n_reservers += 1
        return (
            f"waiting {txt.seconds(waited)}, longer than {txt.seconds(cfg.starvation_s)}: node {node} "
            f"({have}) is reserved for it and takes no new work until it fits"
        )
