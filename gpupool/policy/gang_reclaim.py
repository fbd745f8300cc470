"""Reclaim with multi-node gangs: a running gang is paused whole, and a gang claimant is seated whole.

The plain reclaim (:mod:`gpupool.policy.reclaim`) seats one claimant on
one node and pauses single jobs; it leaves gang replicas out of its victim
lists, since pausing one replica would leave its gang running partly. This
module handles what involves gangs:

* a **gang claimant** (a pass-1 job of a project below its guarantee, or
  one with lower-priority work of its own to pause) needs room for every
  replica, possibly on several nodes;
* a **single claimant** that the plain reclaim could not seat while gangs
  run may pause a gang, whole.

Victims are *units*: a single job, or every running replica of a gang (its
GPUs on all its nodes count against its project's guarantee floor). Units
keep the plain reclaim's order (the project most above its fair share
first, then lowest priority, least run time, id), and the same limits: never
below another project's guarantee, never a unit with a replica younger than
``min_runtime_s``, only units flagged beyond the guarantee for other
projects' claims.

The search, cheapest first: an upper bound (per node, whole free GPUs plus
every GPU a candidate holds there, as replicas) skips claims no pause could
serve; then nodes are taken in order of the replicas they could hold, and on
each, units are paused on the ledger (tentatively) in victim order until the
node holds what it can; then units that turn out unneeded are dropped again.
Nothing is paused unless every replica is seated; the claimants start in the
same cycle on the room left.

A phase object of the cycle (:class:`GangReclaim`), called by the training
pass (single claimants) and by a gang's turn (:mod:`gpupool.policy.gangs`);
it builds its units on the plain reclaim's victim lists and drops paused
jobs from them.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import cast

import numpy as np

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang import Gang
from gpupool.policy.gang_actions import gang_groups, seat_gang
from gpupool.policy.gang_nodes import choose_nodes, ledger_room
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import MILLI, TRAIN_POOL, Project, Request, Workload
from gpupool.policy.reclaim import Reclaim
from gpupool.policy.wait_reasons import why_no_room

Unit = list[Workload]  # one single job, or every running replica of one gang

_assignment_of = attrgetter("assignment")
_node_of = attrgetter("node")
_gpus_of = attrgetter("gpus")


def _unit_key(members: Sequence[Workload]) -> tuple[int, float, str]:
    """The plain reclaim's pause order for a unit: lowest priority, least run time (latest start first), id.

    (A unit without a start time counts as the longest run, as in :func:`~gpupool.policy.guarantee.sort_by_start`.)
    """
    starts = [v.started_at for v in members if v.started_at is not None]
    latest = max(starts) if len(starts) == len(members) else float("-inf")
    return (members[0].priority, -latest, min(v.id for v in members))


class GangReclaim:
    """Victim choice with gangs as units (see the module docstring)."""

    def __init__(self, state: CycleState, reclaim: Reclaim) -> None:
        self.state = state
        self.reclaim = reclaim  # the plain reclaim: its victim lists are the single units here
        # all made on first use (most cycles have no gang claim)
        self._units: dict[str, tuple[list[Unit], list[Unit], int]] | None = None
        self._gang_owners: set[str] = set()  # projects with a running gang that may be paused (no replica too young)
        self._gang_over_owners: set[str] = set()  # those with such a gang beyond their guarantee
        self._unit_gpus: dict[tuple[str, bool], np.ndarray] | None = None
        self._held_sums: dict[tuple, np.ndarray] | None = None
        self._bounds: dict[tuple, int] | None = None  # see _reclaim_units
        self._gang_reclaim_failed: FailureMemo[tuple[int, bool]] | None = None
        # (kind of claimant, id(request)) -> (request, generation, smallest size that failed, outcome)
        self._gang_fail_sizes: dict[tuple, tuple[Request, int, int, tuple[int, bool]]] = {}

    def gang_units(self) -> dict[str, tuple[list[Unit], list[Unit], int]]:
        """Per project, its pause candidates as units, in pause order: (beyond the guarantee, all, protected).

        Built once per cycle, on the first claim that needs it, from every
        running training job on the train pool. A unit with a replica younger
        than the minimum run time is protected; a gang is beyond the
        guarantee only when every replica is flagged (flags are per unit:
        :func:`~gpupool.policy.guarantee.flag_units`). Units only lose members
        to pauses during the cycle, which the search skips.
        """
        st = self.state
        if self._units is not None:
            return self._units
        min_start = st.now - st.cfg.min_runtime_s
        on_train = set(st.cap.pool_nodes[TRAIN_POOL])
        # single jobs: the plain reclaim's lists, already in pause order (they leave gangs out)
        lists = self.reclaim.victim_lists()
        gangs: dict[str, list[Unit]] = {}
        protected: dict[str, int] = {}
        for gang in st.gangs.values():
            members = [v for v in gang.running if v.assignment is not None and v.assignment.node in on_train]
            if not members or any(v.id in st.preempted for v in members):
                continue
            if any(v.started_at is not None and v.started_at > min_start for v in members):
                protected[gang.project] = protected.get(gang.project, 0) + 1
            else:
                gangs.setdefault(gang.project, []).append(members)
        out = {}
        for name in st.train_running:
            over1, cand1, young = lists.get(name, ([], [], 0))
            over = [[v] for v in over1]
            cand = [[v] for v in cand1]
            for m in sorted(gangs.get(name, ()), key=_unit_key):
                insort(cand, m, key=_unit_key)
                if all(v.id in st.over_at_start for v in m):
                    insort(over, m, key=_unit_key)
            out[name] = (over, cand, young + protected.get(name, 0))
        self._gang_owners = set(gangs)
        self._gang_over_owners = {name for name, (over, _, _) in out.items() if any(len(m) > 1 or m[0].gang
                                                                                  for m in over)}
        self._units = out
        return out

    def _gpus_per_node(self, name: str, everything: bool) -> np.ndarray:
        """GPUs project ``name``'s candidate units hold per train node: all of them (``everything``: what
        its own higher-priority claimant may pause), or those beyond the guarantee (what others may pause).

        Counted once per cycle and list, on first use (other projects' claimants
        ask only for the short list beyond the guarantee); units only leave the
        candidates (and the GPUs of paused ones count as free), so these stay
        upper bounds.
        """
        if self._unit_gpus is None:
            self._unit_gpus = {}
        key = (name, everything)
        known = self._unit_gpus.get(key)
        if known is None:
            state = self.state.cap.states[TRAIN_POOL]
            over, cand, _ = self.gang_units()[name]
            # every member's node index and GPU count, by C-level maps, summed per node by one bincount
            assignments = [a for a in map(_assignment_of, chain.from_iterable(cand if everything else over))
                           if a is not None]
            known = np.zeros(len(state.names), dtype=np.int64)
            if assignments:
                at = np.fromiter(map(state.node_index.get, map(_node_of, assignments), repeat(-1)),
                                 dtype=np.int64, count=len(assignments))
                gpus = np.fromiter(map(len, map(_gpus_of, assignments)), dtype=np.int64, count=len(assignments))
                ok = at >= 0
                known += np.bincount(at[ok], weights=gpus[ok], minlength=len(known)).astype(np.int64)
            self._unit_gpus[key] = known
        return known

    def _held_by(self, names: list[str], claimant: str) -> np.ndarray:
        """GPUs per train node of the candidate units of projects ``names`` (all of the claimant's own, the
        others' beyond their guarantee): the per-project counts summed, once per set of projects in a cycle
        (claimants of one cycle mostly see the same victim projects)."""
        if self._held_sums is None:
            self._held_sums = {}
        key = (frozenset(names), claimant if claimant in names else None)
        held = self._held_sums.get(key)
        if held is None:
            # (names is never empty here: the sum is an array)
            held = self._held_sums[key] = cast(np.ndarray, sum(self._gpus_per_node(n, n == claimant) for n in names))
        return held

    def claim_units(self, claimants: Sequence[Workload], req: Request, size: int, p: Project, within: bool,
                    gang: Gang | None) -> str | None:
        """Pause whole units so that ``size`` copies of ``req`` fit, and start the claimants (None); or say why not.

        A failure is remembered per (size, claimant kind) and request shape
        with dominance (:mod:`gpupool.policy.memo`) until room grows back.
        """
        lead = claimants[0]
        units = self.gang_units()
        mine = units.get(p.name, ([], [], 0))[1]
        own = bool(mine) and mine[0][0].priority < lead.priority  # (units go lowest priority first)
        within = within and bool(req.gpus or req.gpu_milli or req.gpu_memory_mib)
        if not within and not own:
            return why_no_room(self.state, p, within, 0, False)
        if gang is None and not (own and p.name in self._gang_owners) and not (
                within and not self._gang_over_owners <= {p.name}):
            return ""  # no gang it could pause: the plain reclaim has tried every victim (its reason stands)
        if self._gang_reclaim_failed is None:
            self._gang_reclaim_failed = FailureMemo()
        kind = (within, p.name if own else None, lead.priority if own else None)
        context = (size, *kind)
        generation = self.state.cap.generation
        # the same replicas failed for no more of them: the search (the same nodes, the same order) fails again
        smallest = self._gang_fail_sizes.get((kind, id(req)))
        if smallest is not None and smallest[0] is req and smallest[1] == generation and smallest[2] <= size:
            return why_no_room(self.state, p, within, *smallest[3])
        memo = self._gang_reclaim_failed.get(context, req, generation)
        if memo is not None:
            return why_no_room(self.state, p, within, *memo)
        outcome = self._reclaim_units(claimants, req, size, p, within, gang, units)
        if outcome is None:
            return None
        self._gang_reclaim_failed.add(context, req, generation, outcome)
        if smallest is None or smallest[0] is not req or smallest[1] != generation or size < smallest[2]:
            self._gang_fail_sizes[(kind, id(req))] = (req, generation, size, outcome)
        return why_no_room(self.state, p, within, *outcome)


    def _reclaim_units(self, claimants: Sequence[Workload], req: Request, size: int, p: Project, within: bool,
                       gang: Gang | None, units: dict[str, tuple[list[Unit], list[Unit], int]]
                       ) -> tuple[int, bool] | None:
        """Pause and start, returning None; or (units protected by min runtime, whether any victim was tried)."""
        st = self.state
        lead = claimants[0]
        names, protected = [], 0
        for name, (over, mine, young) in units.items():
            if name == p.name:
                if mine and mine[0][0].priority < lead.priority:
                    names.append(name)
                protected += young
            elif within and st.usage[name] > st.projects[name].train_guarantee_milli and over:
                names.append(name)
                protected += young
        if not names:
            return (protected, False)
        if gang is None and self._gang_owners.isdisjoint(names):
            return (protected, True)  # no gang to pause: the plain reclaim has searched these victims already
        recent = st.recent
        names.sort(key=lambda n: (st.shares.get(n, 0.0) - st.usage[n] - recent[n], n))
        ledger = st.cap.ledger
        state = st.cap.states[TRAIN_POOL]
        # upper bound: every candidate's GPUs as if free, as replicas per node (CPU, memory, models ignored);
        # remembered while nothing is started, paused or reserved (claimants of many sizes ask it in turn)
        bound_key = (frozenset(names), p.name if p.name in names else None, id(req), st.cap.generation,
                     len(st.started), len(st.preempted), len(st.reserved))
        if self._bounds is None:
            self._bounds = {}
        reachable = self._bounds.get(bound_key)
        if reachable is not None and reachable < size:
            return (protected, True)
        held = self._held_by(names, p.name)
        if req.gpus:
            free_now = state.replicas_fit(req)
            potential = (state.whole_free + held) // req.gpus
        else:
            free_now = np.zeros(len(state.names), dtype=np.int64)
            potential = (held > 0).astype(np.int64)
        for name in st.reserved:
            i = state.node_index.get(name)
            if i is not None:
                potential[i] = free_now[i] = 0
        reachable = self._bounds[bound_key] = int(np.maximum(potential, free_now).sum())
        if reachable < size:
            return (protected, True)
        # the candidates, in victim order, and the train nodes they touch
        cand: list[Unit] = []
        for name in names:
            over, mine, _ = units[name]
            for m in (mine if name == p.name else over):
                if name == p.name and m[0].priority >= lead.priority:
                    continue
                if not any(v.id in st.preempted for v in m):
                    cand.append(m)
        on_node: dict[int, list[int]] = {}
        for k, m in enumerate(cand):
            for i in sorted({state.node_index.get(v.assignment.node, -1) for v in m}):  # type: ignore[union-attr]
                if i >= 0 and potential[i] > free_now[i]:
                    on_node.setdefault(i, []).append(k)
        room = {i: int(free_now[i]) for i in on_node}
        total = int(free_now.sum())
        left: dict[str, int] = {}  # per victim project, its use after the tentative pauses
        given: list[int] = []

        def measure(i: int) -> int:
            node = state.names[i]
            return ledger_room(ledger, node, req) if ledger.could_ever_fit(node, req) else 0

        def shift(k: int, sign: int) -> None:
            """Pause (+1) or un-pause (-1) unit ``k`` on the ledger and update the room it touches."""
            nonlocal total
            m = cand[k]
            for v in m:
                (ledger.give if sign > 0 else ledger.take)(v.assignment, v.request)  # type: ignore[arg-type]
            for i in {state.node_index.get(v.assignment.node, -1) for v in m}:  # type: ignore[union-attr]
                if i >= 0 and state.names[i] not in st.reserved:
                    now = measure(i)
                    total += now - room.get(i, int(free_now[i]))
                    room[i] = now
            q = m[0].project
            left[q] = left.get(q, st.usage[q]) - sign * sum(st.milli[v.id] for v in m)

        def floor_ok(k: int) -> bool:
            m = cand[k]
            q = m[0].project
            if q == p.name:
                return True  # the project's own higher-priority work may take it below its guarantee
            after = left.get(q, st.usage[q]) - sum(st.milli[v.id] for v in m)
            return after >= st.projects[q].train_guarantee_milli

        chosen: set[int] = set()
        # nodes that could hold the most replicas first, then fewer candidates to pause there, then node order
        targets = sorted(on_node, key=lambda i: (-int(potential[i]), len(on_node[i]), i))
        for i in targets:
            if total >= size:
                break
            start_room = room.get(i, int(free_now[i]))
            mine_here = []
            for k in on_node[i]:
                if total >= size or room.get(i, 0) >= potential[i]:
                    break
                if k in chosen or not floor_ok(k):
                    continue
                shift(k, +1)
                chosen.add(k)
                given.append(k)
                mine_here.append(k)
            if room.get(i, 0) <= start_room:  # no replica more here: these pauses help nobody
                for k in reversed(mine_here):
                    shift(k, -1)
                    chosen.discard(k)
                    given.remove(k)
        if total < size:
            for k in reversed(given):
                shift(k, -1)
            return (protected, True)
        for k in reversed(given[:-1]):  # drop pauses that turn out unneeded, least preferred first
            shift(k, -1)
            if total >= size:
                given.remove(k)
            else:
                shift(k, +1)
        for k in reversed(given):
            shift(k, -1)
        return self._apply_units(claimants, req, size, p, gang, [cand[k] for k in sorted(given)])

    def _apply_units(self, claimants: Sequence[Workload], req: Request, size: int, p: Project, gang: Gang | None,
                     chosen: list[Unit]) -> tuple[int, bool] | None:
        """Pause ``chosen`` and seat the claimants on the room; undo and report a failure if they do not fit."""
        st = self.state
        before = {m[0].project: st.usage[m[0].project] for m in chosen}
        for m in chosen:
            for v in m:
                st.cap.release(v.assignment, v.request)  # type: ignore[arg-type]
                st.usage[v.project] -= st.milli[v.id]
        state = st.cap.states[TRAIN_POOL]
        plan: list[tuple[str, int]] | None
        if req.gpus:
            room = state.replicas_fit(req)
            for name in st.reserved:  # (a victim's GPUs on a reserved node stay with the starving job)
                i = state.node_index.get(name)
                if i is not None:
                    room[i] = 0
            picks = choose_nodes(room, size, gang_groups(st), state.whole_free)
            plan = None if picks is None else [(state.names[i], n) for i, n in picks]
        else:
            nodes = sorted({v.assignment.node for m in chosen for v in m},  # type: ignore[union-attr]
                           key=st.cap.ledger.order.__getitem__)
            plan = next(([(n, 1)] for n in nodes if n not in st.reserved and st.cap.ledger.fits(n, req)), None)
        limit = p.train_limit_milli
        one = req.gpus * MILLI if req.gpus else st.estimate(TRAIN_POOL, req)
        if plan is None or (limit is not None and st.usage[p.name] + size * one > limit):
            for m in chosen:  # cannot use the room after all: undo, nobody is paused
                for v in m:
                    st.cap.commit(v.assignment, v.request)  # type: ignore[arg-type]
                    st.usage[v.project] += st.milli[v.id]
            return (0, True)
        target = gang.text if gang is not None else f"job {claimants[0].id}"
        for m in chosen:
            q = st.projects[m[0].project]
            unit = f"gang {m[0].gang} (all {len(m)} replicas)" if m[0].gang else "this job"
            if q.name == p.name:
                reason = (f"paused {unit} for higher-priority {target} (priority {claimants[0].priority} > "
                          f"{m[0].priority}) of the same project {p.name}")
            else:
                reason = (
                    f"paused {unit} to give GPUs back to project {p.name} (below its "
                    f"{txt.gpus(p.train_guarantee_milli)} guarantee) for {target}: project {q.name} used "
                    f"{txt.gpus(before[q.name])}, over its {txt.gpus(q.train_guarantee_milli)} guarantee "
                    f"(fair share {txt.gpus(st.shares.get(q.name, 0.0))}"
                    + (f", {txt.gpus(st.recent[q.name])} on average recently" if st.recent[q.name] else "")
                    + ")"
                )
            for v in m:
                st.preempted[v.id] = reason
            st.touched.add(q.name)
            if st.queue is not None:
                st.queue.touch(q.name)
        self.reclaim.drop_paused({m[0].project for m in chosen})  # (they are mostly at its lists' front)
        st.cap.generation += 1  # the pauses may leave more room than the claimants take
        note = "on GPUs freed by pausing " + ", ".join(v.id for m in chosen for v in m)
        if gang is not None:
            seat_gang(st, gang, plan, note)
        else:
            a = st.cap.ledger.assign_on(plan[0][0], req)
            assert a is not None
            st.start(claimants[0], req, a, note)
        return None
