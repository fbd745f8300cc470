"""Reclaim: pausing running training jobs so that a pending one can start.

Two kinds of claimant may pause jobs:

* a job of a project **below its guarantee** (it may take the project past
  it: see :func:`~gpupool.policy.guarantee.over_guarantee`) may pause the preemptible jobs of
  other projects above their guarantee, never taking a project below its own
  guarantee;
* any job may pause **lower-priority jobs of its own project**.

Jobs younger than ``min_runtime_s`` are never paused, and build work never is.
Victims go in this order: the project most above its fair share first, then
the lowest priority, then the least run time, then id. As few as needed: the
first single victim whose pause lets the claimant fit wins; only when no
single one does are nodes searched for the fewest victims on one node (a gang
job needs all its GPUs on one node), preferring earlier victims in the order.

The claimant starts in the same cycle on the room its victims leave (the
service applies pauses before starts), seated on that node by
:meth:`~gpupool.policy.capacity.Ledger.assign_on`.

A phase object of the cycle (:class:`Reclaim`), made once per cycle and
called by the training pass: it reads the cycle state's usage, shares and
capacity, and records pauses and starts in it. Gang reclaim
(:mod:`gpupool.policy.gang_reclaim`) builds on its victim lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import filterfalse
from operator import attrgetter

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.guarantee import sort_by_start
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import Project, Request, Workload
from gpupool.policy.wait_reasons import no_room

_by_id = attrgetter("id")
_by_priority = attrgetter("priority")
_gang_of = attrgetter("gang")

Victims = dict[str, tuple[list[Workload], list[Workload], int]]  # see Reclaim.victim_lists


class Reclaim:
    """Victim selection for single claimants and the pauses it decides (see the module docstring)."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        # context (within guarantee, own project, priority) -> (jobs protected, victims tried)
        self.reclaim_failed: FailureMemo[tuple[int, bool]] = FailureMemo()
        self._victims: Victims | None = None
        self.smallest_over: dict[str, int] = {}
        self.smallest_any: dict[str, int] = {}  # the same over all of a project's pause candidates
        # per project: GPUs its candidates hold on each node (all of them, and the over-guarantee ones)
        self._gpus_on: dict[str, tuple[dict[str, int], dict[str, int]]] = {}

    def new_pass(self) -> None:
        """Pass 2 starts: its starts push projects above their guarantee, which changes who may be paused."""
        self.reclaim_failed = FailureMemo()

    def victim_lists(self) -> Victims:
        """Per project: (its over-guarantee jobs, all its jobs, how many are protected by min runtime).

        Both lists hold only jobs past the minimum run time, in pause order:
        lowest priority, least run time, id. The first list is what other
        projects' claimants may pause; the second what the project's own
        higher-priority jobs may. Built once per cycle, on the first reclaim.
        """
        st = self.state
        if self._victims is None:
            min_start = st.now - st.cfg.min_runtime_s
            train_nodes = st.train_nodes
            over_at_start, milli = st.over_at_start, st.milli
            lists = {}
            # (a job on a node gone from the inventory, or off the train pool, is nobody's victim)
            every_node = st.cap.every_job_on_a_node and len(train_nodes) == len(st.cap.ledger.nodes)
            for name, jobs in st.train_running.items():
                cand = list(jobs) if every_node else [
                    v for v in jobs if v.assignment.node in train_nodes]  # type: ignore[union-attr]
                if st.running_gangs:
                    # a gang is paused whole or not at all: gpupool/policy/gangs.py treats gangs as units
                    cand = list(filterfalse(_gang_of, cand))  # (C-level: this runs on every running job)
                # pause order as stable C-level sorts, last key first (this runs on every running job):
                # id, then least run time (latest start first; no start time counts as the longest run),
                # then lowest priority
                cand.sort(key=_by_id)
                sort_by_start(cand, latest_first=True)
                cand.sort(key=_by_priority)
                young = [v for v in cand if v.started_at is not None and v.started_at > min_start]
                if young:
                    cand = [v for v in cand if not (v.started_at is not None and v.started_at > min_start)]
                over = [v for v in cand if v.id in over_at_start]
                lists[name] = (over, cand, len(young))
                # a lower bound for the rest of the cycle: pausing only removes jobs from the list
                self.smallest_over[name] = min((milli[v.id] for v in over), default=0)
                self.smallest_any[name] = min((milli[v.id] for v in cand), default=0)
            self._victims = lists
        return self._victims

    def claim(self, w: Workload, req: Request, p: Project, within: bool) -> str | None:
        """Try to make room for ``w`` by pausing other jobs; start it and return None, or say why not.

        A failure is remembered per (shape, claimant kind), with dominance
        (:mod:`gpupool.policy.memo`): while the cycle goes on, capacity and
        the set of possible victims only shrink (a reclaim that leaves more
        room than before bumps the generation). A claimant with no
        lower-priority jobs of its own to pause sees the same victims whatever
        its project (its own project, within its guarantee, has none to give),
        so those share one memo.
        """
        lists = self.victim_lists()
        mine = lists.get(p.name, ([], [], 0))[1]
        own = bool(mine) and mine[0].priority < w.priority
        # guarantees are GPU guarantees: a job asking no GPU does not pause other projects' work
        within = within and bool(req.gpus or req.gpu_milli or req.gpu_memory_mib)
        if not within and not own:
            return no_room(self.state, req, p, within, 0, tried=False)
        context = (within, p.name if own else None, w.priority if own else None)
        generation = self.state.cap.generation
        memo = self.reclaim_failed.get(context, req, generation)
        if memo is not None:
            return no_room(self.state, req, p, within, *memo)
        outcome = self._reclaim(w, req, p, within)
        if outcome is None:
            return None
        if within:
            # the over-guarantee jobs, as flagged, are spread so that no node frees enough (each node also
            # runs a job counted within its project's guarantee): any jobs of those projects may be paused
            # then, as long as each keeps its guarantee
            wide = self._reclaim(w, req, p, within, wide=True)
            if wide is None:
                return None
            outcome = (outcome[0], outcome[1] or wide[1])
        self.reclaim_failed.add(context, req, generation, outcome)
        return no_room(self.state, req, p, within, *outcome)

    def _reclaim(self, w: Workload, req: Request, p: Project, within: bool,
                 wide: bool = False) -> tuple[int, bool] | None:
        """Pause and start, returning None; or (jobs protected by min runtime, whether any victim was tried).

        ``wide``: other projects' victims are all their jobs past the minimum
        run time, not only those flagged over the guarantee (the floor is kept
        by the per-victim room and :func:`victims_on_node`).
        """
        st = self.state
        ledger = st.cap.ledger
        lists = self.victim_lists()
        names = []
        protected = 0
        for name, (over, mine, young) in lists.items():
            if name == p.name:
                if mine and mine[0].priority < w.priority:
                    names.append(name)
                protected += young
            elif within and st.usage[name] > st.projects[name].train_guarantee_milli:
                # the smallest over-guarantee job must fit in what the project may lose
                room = st.usage[name] - st.projects[name].train_guarantee_milli
                if wide:
                    if mine and self.smallest_any[name] <= room:
                        names.append(name)
                elif over and self.smallest_over[name] <= room:
                    names.append(name)
                protected += young
        # the project most above its fair share first, its recent use counted (0 without history)
        recent = st.recent
        names.sort(key=lambda n: (st.shares.get(n, 0.0) - st.usage[n] - recent[n], n))
        if wide and not names:
            return (protected, False)
        if req.gpus > 1 and not self._gang_reachable(req.gpus, p.name, names, wide):
            return (protected, bool(names))
        node_ok: dict[str, bool] = {}
        room_on: dict[str, tuple[int, int, int, int]] = {}
        per_node: dict[str, list[tuple[int, Workload]]] = {}
        rank = 0
        preempted, milli = st.preempted, st.milli
        for name in names:
            own = name == p.name
            room = st.usage[name] - st.projects[name].train_guarantee_milli  # may go without breaking the floor
            over, mine, _ = lists[name]
            for v in mine if own or wide else over:
                if own and v.priority >= w.priority:
                    break
                if v.id in preempted or (not own and milli[v.id] > room):
                    continue
                a = v.assignment
                assert a is not None
                node = a.node
                ok = node_ok.get(node)
                if ok is None:
                    ok = node_ok[node] = ledger.could_ever_fit(node, req)
                    room_on[node] = ledger.headroom(node, req)
                if not ok:
                    continue
                per_node.setdefault(node, []).append((rank, v))
                rank += 1
                if not _could_help(room_on[node], a.gpus, v.request, req):
                    continue  # an upper bound says this pause alone cannot make room
                ledger.give(a, v.request)
                fits = ledger.fits(node, req)
                ledger.take(a, v.request)
                if fits:
                    return self.apply_reclaim(w, req, p, node, [v])
        best: tuple[int, list[int], int, str, list[Workload]] | None = None
        for node, ranked in per_node.items():
            if len(ranked) < 2 or not _could_help(
                room_on[node], [g for _, v in ranked for g in v.assignment.gpus],  # type: ignore[union-attr]
                Request(cpu_milli=sum(v.request.cpu_milli for _, v in ranked),
                        memory_mib=sum(v.request.memory_mib for _, v in ranked)),
                req,
            ):
                continue
            chosen = victims_on_node(st, req, p, node, [v for _, v in ranked])
            if chosen is None:
                continue
            ranks = {v.id: r for r, v in ranked}
            cand = (len(chosen), sorted(ranks[v.id] for v in chosen), ledger.order[node], node, chosen)
            if best is None or cand[:3] < best[:3]:
                best = cand
        if best is None:
            # (tried: some project's jobs could be paused, even if none sits on a node that could hold
            # the claimant; the reason must not say that nobody runs above a guarantee then)
            return (protected, bool(names))
        return self.apply_reclaim(w, req, p, best[3], best[4])

    def gpus_on(self, name: str) -> tuple[dict[str, int], dict[str, int]]:
        """GPUs project ``name``'s pause candidates hold per node: (all of them, the over-guarantee ones).

        Counted on first use (only gang claimants ask) from the victim lists as
        they are then; jobs only leave those lists (and the GPUs of paused ones
        count as free), so the counts stay upper bounds.
        """
        counts = self._gpus_on.get(name)
        if counts is None:
            over, cand, _ = self.victim_lists()[name]
            counts = self._gpus_on[name] = (_gpus_per_node(cand), _gpus_per_node(over))
        return counts

    def _gang_reachable(self, gpus: int, own: str, names: list[str], wide: bool = False) -> bool:
        """Upper bound: could pausing every candidate of ``names`` free ``gpus`` whole GPUs on one node?

        Counts, per node, the GPUs wholly free now plus every GPU a candidate
        holds there (as if each became whole). Candidates only leave during a
        cycle and free GPUs only grow by their pauses, so a False here is safe.
        A gang rarely finds one node with enough of one project's jobs on a
        big busy pool; this turns those failures into one pass over a
        per-node count instead of a victim-by-victim search.
        """
        whole = self.state.cap.ledger.whole
        if len(names) == 1:
            counts = self.gpus_on(names[0])[0 if wide or names[0] == own else 1]
            return any(n + whole[node] >= gpus for node, n in counts.items())
        total: dict[str, int] = {}
        for name in names:
            for node, n in self.gpus_on(name)[0 if wide or name == own else 1].items():
                total[node] = total.get(node, 0) + n
        return any(n + whole[node] >= gpus for node, n in total.items())

    def apply_reclaim(
        self, w: Workload, req: Request, p: Project, node: str, victims: list[Workload]
    ) -> tuple[int, bool] | None:
        """Pause ``victims`` and start ``w`` on ``node`` in their place (None), or undo and say it failed."""
        st = self.state
        ledger = st.cap.ledger
        before_free = ledger.node_free(node)
        before = {v.project: st.usage[v.project] for v in victims}
        for v in victims:
            assert v.assignment is not None
            st.cap.release(v.assignment, v.request)
            st.usage[v.project] -= st.milli[v.id]
        a = ledger.assign_on(node, req)
        limit = p.train_limit_milli
        if a is None or (limit is not None and st.usage[p.name] + a.total_milli > limit):
            for v in victims:  # cannot use the room after all: undo, nobody is paused
                assert v.assignment is not None
                st.cap.commit(v.assignment, v.request)
                st.usage[v.project] += st.milli[v.id]
            return (0, True)
        for v in victims:
            if v.project == p.name:
                reason = (
                    f"paused for higher-priority job {w.id} (priority {w.priority} > {v.priority}) "
                    f"of the same project {p.name}"
                )
            else:
                q = st.projects[v.project]
                reason = (
                    f"paused to give GPUs back to project {p.name} (below its "
                    f"{txt.gpus(p.train_guarantee_milli)} guarantee) for job {w.id}: project {q.name} "
                    f"used {txt.gpus(before[q.name])}, over its {txt.gpus(q.train_guarantee_milli)} "
                    f"guarantee (fair share {txt.gpus(st.shares.get(q.name, 0.0))}"
                    + (f", {txt.gpus(st.recent[q.name])} on average recently" if st.recent[q.name] else "")
                    + ")"
                )
            st.preempted[v.id] = reason
            st.touched.add(v.project)
            if st.queue is not None:
                st.queue.touch(v.project)
        self.drop_paused({v.project for v in victims})
        st.start(w, req, a, note="on GPUs freed by pausing " + ", ".join(v.id for v in victims))
        if ledger.grew(node, before_free):
            st.cap.generation += 1  # leftover room: shapes that failed before may fit now
        return None

    def drop_paused(self, projects: set[str]) -> None:
        """Drop the jobs just paused from the front of these projects' victim lists.

        Victims are mostly taken from the front (pause order), so the lists
        stay short to walk; a paused job elsewhere in a list is skipped where
        it is read.
        """
        if self._victims is not None:
            for name in projects:
                for lst in self._victims.get(name, ([], [], 0))[:2]:
                    while lst and lst[0].id in self.state.preempted:
                        del lst[0]


def victims_on_node(
    state: CycleState, req: Request, p: Project, node: str, victims: list[Workload]
) -> list[Workload] | None:
    """Fewest victims on ``node`` (taken in victim order) whose pause lets ``req`` fit there, or None.

    Shared by this reclaim and the build claims (:mod:`gpupool.policy.build_reclaim`).
    """
    ledger = state.cap.ledger
    left: dict[str, int] = {}
    chosen: list[Workload] = []
    fits = False
    for v in victims:
        assert v.assignment is not None
        if v.project != p.name:
            after = left.get(v.project, state.usage[v.project]) - state.milli[v.id]
            if after < state.projects[v.project].train_guarantee_milli:
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
            assert v.assignment is not None
            ledger.take(v.assignment, v.request)
            if ledger.fits(node, req):
                chosen.remove(v)
            else:
                ledger.give(v.assignment, v.request)
    for v in chosen:
        assert v.assignment is not None
        ledger.take(v.assignment, v.request)
    return chosen if fits else None



def _gpus_per_node(jobs: Sequence[Workload]) -> dict[str, int]:
    """GPUs the jobs hold per node (a GPU shared by two jobs counts twice: an upper bound)."""
    out: dict[str, int] = {}
    for v in jobs:
        a = v.assignment
        if a is not None and a.gpus:
            out[a.node] = out.get(a.node, 0) + len(a.gpus)
    return out


def _could_help(room: tuple[int, int, int, int], gpus: Sequence[tuple[str, int]], freed: Request,
                req: Request) -> bool:
    """Upper bound: could releasing ``gpus`` (and ``freed``'s CPU and memory) make ``req`` fit?

    ``room`` is the node's (whole free GPUs, largest free share, free CPU,
    free memory). Counting every released GPU as becoming whole and every
    share as landing on the freest GPU can only overestimate, so a False here
    is safe to skip.
    """
    whole, share, cpu, mem = room
    if cpu + freed.cpu_milli < req.cpu_milli or mem + freed.memory_mib < req.memory_mib:
        return False
    if req.gpus:
        return whole + len({gid for gid, _ in gpus}) >= req.gpus
    if req.gpu_milli:
        return share + max((m for _, m in gpus), default=0) >= req.gpu_milli
    return True
