"""Build work reclaims from training on nodes that serve both pools.

A project's build quota is a fixed reservation: "its share is always there
for you". On a node that serves both the ``build`` and the ``train`` pool (the
embedded default: one machine, both pools), training may take every GPU while
no kernel asks; when a kernel within its quota then finds no room, it may
pause **training** jobs on build-pool nodes to make room, and starts in the
same cycle (the service applies pauses before starts). Build work is never a
victim.

Who may be paused, in two stages (the second only if the first cannot make
room):

1. **preemptible** jobs of any project (beyond their project's guarantee;
   pausing them keeps it at or above the guarantee), whatever their age: they
   run on borrowed room, and a kernel's quota is not borrowed room. The
   minimum run time does not protect them from a build claim: no flap can
   follow (the kernel is never paused, and the paused job cannot come back onto
   the room the kernel holds), while making a kernel wait up to a minute is
   exactly what users notice.
2. then also **the kernel's own project's** training jobs, whatever their age,
   even where that takes the project below its training guarantee: both the
   build quota and the guarantee are the project's, and a project that asked
   for a kernel within its fixed quota trades its own training for it. This is
   the embedded default's case: one project whose guarantee is every GPU of a
   machine that serves both pools, so its training is never preemptible.
   And **other projects'** non-preemptible jobs whose pause keeps their
   project at or above its guarantee (e.g. the job that crossed it, where the
   project has jobs beyond it elsewhere), once they have run ``min_runtime_s``
   (so a stream of kernels does not pause the same job again and again).

Never paused for a kernel: build work, and a job whose pause would take
**another** project below its training guarantee. Guarantees are promises
too; a kernel that only such a pause could seat means the admin handed out
more build quota and guarantee than the shared nodes hold, and it waits with
a reason that says so (the "within quota, no room: pending" case of the rules).

Within a stage victims go: preemptible first, then jobs whose pause keeps
their project at its guarantee, then the project most above its fair share,
lowest priority, least run time, id. As few as needed: the first single
victim whose pause makes room wins; otherwise the fewest victims on one GPU
(for a fraction of a GPU: one paused job may free room for several kernels)
or on one node (whole GPUs, or when CPU or memory is what is short), preferring
earlier victims in the order.

Why the paused job does not flap back: the kernel holds its share of the GPU
and build work is never paused, so the room the job needs is not there until
the kernel ends; a paused job beyond its guarantee also waits out
``resume_backoff_s``.

A phase object of the cycle (:class:`BuildReclaim`), called by the build
phase (:mod:`gpupool.policy.build`) for a kernel that did not fit: it reads
the cycle state's usage and capacity and records pauses and starts in it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import BUILD_POOL, Kind, Project, Request, Workload
from gpupool.policy.reclaim import victims_on_node

_Key = tuple[int, int, float, int, float, str]
_Entry = tuple[_Key, Workload]


@dataclass
class _ProjectJobs:
    """One project's training jobs on build-pool nodes, classified at one use level, each list in victim order.

    Kept per cycle and redone only when the project's use changes (a pause),
    so a claim costs a merge of a few sorted lists, not a sort of every job.
    """

    usage: int  # the project's training use these were classified at
    preemptible: list[_Entry]  # beyond the guarantee: pausing keeps the project at or above it
    floor_old: list[_Entry]  # not preemptible, pausing keeps the floor, past the minimum run time
    floor_young: list[_Entry]  # the same, within the minimum run time
    breaks_floor: list[_Entry]  # pausing would take the project below its guarantee


class _ClaimState:
    """Per-cycle memory of build claims: fair shares (for victim order), jobs by project, failed shapes."""

    def __init__(self, shares: dict[str, float], on_build_nodes: dict[str, list[Workload]]) -> None:
        self.shares = shares
        self.on_build_nodes = on_build_nodes
        self.classified: dict[str, _ProjectJobs] = {}
        self.failed: FailureMemo[str] = FailureMemo()


class BuildReclaim:
    """Pausing training jobs on build-pool nodes for build work within its quota."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._build_claims: _ClaimState | None = None  # made on the first build claim of the cycle

    # ------------------------------------------------------------ entry point

    def claim(self, w: Workload, req: Request, p: Project) -> str | None:
        """Make room for build workload ``w`` (within its quota, it did not fit) and start it.

        Returns None when it started, else the reason it waits.
        """
        st = self.state
        head = (
            f"project {p.name} has {txt.gpus(p.build_quota_milli - st.build_used[p.name])} of its "
            f"{txt.gpus(p.build_quota_milli)} build quota left, but the build pool has no room for "
            f"{txt.describe(req)} now"
        )
        if not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            # build quotas are GPU quotas: a kernel asking no GPU has no reservation to claim
            return head + "; a kernel asking no GPU does not pause training, it starts when room frees up"
        claims = self._build_claims
        if claims is None:
            build_nodes = set(st.cap.pool_nodes.get(BUILD_POOL, ()))
            on_build_nodes = {
                # (a replica of a multi-node gang is never paused for a kernel: it would leave the gang
                # running partly; see docs/policy.md, "Multi-node gangs")
                name: [v for v in jobs if v.assignment is not None and v.assignment.node in build_nodes and not v.gang]
                for name, jobs in st.train_running.items()
            }
            claims = self._build_claims = _ClaimState(self._claim_shares(), on_build_nodes)
        context: Hashable = p.name  # who may be paused depends on the kernel's project (its own jobs)
        generation = st.cap.generation
        known = claims.failed.get(context, req, generation)
        if known is not None:
            return head + known
        outcome = self._claim(w, req, p, claims)
        if outcome is None:
            return None
        tail, remember = outcome
        if remember:
            claims.failed.add(context, req, generation, tail)
        return head + tail

    # ------------------------------------------------------------ victim choice

    def _claim_shares(self) -> dict[str, float]:
        """Fair shares of the train pool as the cycle starts (only used to order victims).

        Build claims run before the training passes compute their shares, so
        they are worked out here the same way: running plus pending training
        demand, train-pool GPUs not held by build work.
        """
        st = self.state
        trains = (w for w in st.pending if w.kind is Kind.TRAIN and w.project in st.projects)
        return st.train_shares(trains, st.train_capacity)

    def _classify(self, claims: _ClaimState, name: str) -> _ProjectJobs:
        """Project ``name``'s jobs on build-pool nodes by how a kernel may pause them (see the module docstring).

        Preemptible: flagged beyond the guarantee at the start of the cycle,
        and pausing it still keeps the project at or above its guarantee now
        (earlier pauses may have lowered the project's use).
        """
        st = self.state
        used = st.usage[name]
        known = claims.classified.get(name)
        if known is not None and known.usage == used:
            return known
        q = st.projects[name]
        above = used + st.recent[name] - claims.shares.get(name, 0.0)  # recent use counts (0 without history)
        min_start = st.now - st.cfg.min_runtime_s
        out = _ProjectJobs(used, [], [], [], [])
        for v in claims.on_build_nodes.get(name, ()):
            if v.id in st.preempted:
                continue
            keeps_floor = used - st.milli[v.id] >= q.train_guarantee_milli
            preemptible = keeps_floor and v.id in st.over_at_start
            started = v.started_at if v.started_at is not None else -math.inf
            entry = ((0 if preemptible else 1, 0 if keeps_floor else 1, -above, v.priority, -started, v.id), v)
            if preemptible:
                out.preemptible.append(entry)
            elif not keeps_floor:
                out.breaks_floor.append(entry)
            elif started > min_start:
                out.floor_young.append(entry)
            else:
                out.floor_old.append(entry)
        for lst in (out.preemptible, out.floor_old, out.floor_young, out.breaks_floor):
            lst.sort(key=_entry_key)
        claims.classified[name] = out
        return out

    def _in_order(self, lists: list[list[_Entry]]) -> Iterator[Workload]:
        """The jobs of several sorted lists in victim order, lazily (most claims need the first one only)."""
        preempted = self.state.preempted
        return (v for _, v in heapq.merge(*lists, key=_entry_key) if v.id not in preempted)

    def _claim(
        self, w: Workload, req: Request, p: Project, claims: _ClaimState
    ) -> tuple[str, bool] | None:
        """Pause and start (None), or (why it waits, whether that holds for the rest of the generation)."""
        jobs = {name: self._classify(claims, name) for name in sorted(claims.on_build_nodes)}
        own = jobs.get(p.name)
        first = [j.preemptible for j in jobs.values()]
        more = [j.floor_old for j in jobs.values()]
        if own is not None:
            more += [own.floor_young, own.breaks_floor]
        stages = [first]
        if any(more):
            stages.append(first + more)
        for lists in stages:
            found = self._fewest_victims(p, req, self._in_order(lists))
            if found is not None:
                node, chosen = found
                problem = self._pause_and_start(w, req, p, node, chosen, claims.shares)
                if problem is None:
                    return None
                return problem, False  # depends on the project's quota: not a fact about the shape
        young = [j.floor_young for name, j in jobs.items() if name != p.name]
        if any(young) and self._fewest_victims(p, req, self._in_order(first + more + young)) is not None:
            return (
                f"; making room would mean pausing another project's training job that started less than "
                f"{txt.seconds(self.state.cfg.min_runtime_s)} ago (minimum run time): it starts once that has passed "
                "or room frees up"
            ), True
        if self._training_in_the_way(claims, req):
            return (
                "; the training there runs within other projects' guarantees, which a kernel does not break "
                "(more build quota and training guarantee is handed out than the build pool's nodes hold); "
                "it starts when work there ends"
            ), True
        return (
            " (more build quota is handed out than the pool holds); it starts when build work elsewhere ends"
        ), True

    def _fewest_victims(
        self, p: Project, req: Request, candidates: Iterable[Workload]
    ) -> tuple[str, list[Workload]] | None:
        """Where to make room and whom to pause: one victim if one suffices, else the fewest on one GPU or node."""
        ledger = self.state.cap.ledger
        fractional = not req.gpus
        groups: dict[tuple[str, str], list[Workload]] = {}
        victims: list[Workload] = []  # those looked at, in order
        for v in candidates:
            victims.append(v)
            a = v.assignment
            assert a is not None
            if not ledger.could_ever_fit(a.node, req):
                continue
            ledger.give(a, v.request)
            fits = ledger.fits(a.node, req)
            ledger.take(a, v.request)
            if fits:
                return a.node, [v]
            if fractional:
                for gid, _ in a.gpus:
                    groups.setdefault((a.node, gid), []).append(v)
            groups.setdefault((a.node, ""), []).append(v)
        rank = {v.id: i for i, v in enumerate(victims)}
        best: tuple[int, list[int], int, str, list[Workload]] | None = None
        for (node, _gid), members in groups.items():
            if len(members) < 2:
                continue
            chosen = victims_on_node(self.state, req, p, node, members)  # shared with training reclaim
            if chosen is None:
                continue
            cand = (len(chosen), sorted(rank[v.id] for v in chosen), ledger.order[node], node, chosen)
            if best is None or cand[:3] < best[:3]:
                best = cand
        return None if best is None else (best[3], best[4])

    def _training_in_the_way(self, claims: _ClaimState, req: Request) -> bool:
        """Whether pausing every training job on some build-pool node would seat ``req`` (for the wait reason)."""
        ledger = self.state.cap.ledger
        per_node: dict[str, list[Workload]] = {}
        for jobs in claims.on_build_nodes.values():
            for v in jobs:
                if v.id not in self.state.preempted:
                    per_node.setdefault(v.assignment.node, []).append(v)  # type: ignore[union-attr]
        for node in sorted(per_node, key=ledger.order.__getitem__):
            if not ledger.could_ever_fit(node, req):
                continue
            for v in per_node[node]:
                ledger.give(v.assignment, v.request)  # type: ignore[arg-type]
            fits = ledger.fits(node, req)
            for v in per_node[node]:
                ledger.take(v.assignment, v.request)  # type: ignore[arg-type]
            if fits:
                return True
        return False

    # ------------------------------------------------------------ the pauses

    def _pause_and_start(
        self, w: Workload, req: Request, p: Project, node: str, victims: list[Workload], shares: dict[str, float]
    ) -> str | None:
        """Pause ``victims`` and start ``w`` on ``node`` (None); or undo and say why it cannot start there."""
        st = self.state
        ledger = st.cap.ledger
        before_free = ledger.node_free(node)
        before = {v.project: st.usage[v.project] for v in victims}
        preemptible = set()  # paused in turn, these keep their project at or above its guarantee
        left_after = dict(before)
        for v in victims:
            left_after[v.project] -= st.milli[v.id]
            if v.id in st.over_at_start and left_after[v.project] >= st.projects[v.project].train_guarantee_milli:
                preemptible.add(v.id)
        for v in victims:
            assert v.assignment is not None
            st.cap.release(v.assignment, v.request)
            st.usage[v.project] -= st.milli[v.id]
        a = ledger.assign_on(node, req)
        left = p.build_quota_milli - st.build_used[p.name]
        if a is None or a.total_milli > left:
            for v in victims:  # cannot use the room after all: undo, nobody is paused
                assert v.assignment is not None
                st.cap.commit(v.assignment, v.request)
                st.usage[v.project] += st.milli[v.id]
            if a is None:
                return "; the room pausing training would free does not seat it (an inconsistency; it retries)"
            return (
                f"; the GPU that pausing training would free takes {txt.gpus(a.total_milli)} for this request, "
                f"more than the {txt.gpus(left)} left of the quota"
            )
        share = (
            f"its build quota share ({txt.gpus(a.total_milli)} on {node}; project {p.name} has a fixed build "
            f"quota of {txt.gpus(p.build_quota_milli)})"
        )
        for v in victims:
            q = st.projects[v.project]
            used, guarantee = txt.gpus(before[q.name]), txt.gpus(q.train_guarantee_milli)
            fair = txt.gpus(shares.get(q.name, 0.0))
            if v.id in preemptible:
                why = (
                    f"project {q.name} ran {used} of training, over its {guarantee} guarantee "
                    f"(fair share {fair}); it resumes when GPUs free up"
                )
            elif q.name == p.name:
                why = (
                    f"no job beyond a guarantee could make room, and the project's kernels come before its own "
                    f"training (it ran {used} of training; guarantee {guarantee}); it resumes when GPUs free up"
                )
            else:
                why = (
                    f"no job beyond a guarantee could make room, and a build quota is a fixed reservation; "
                    f"project {q.name} keeps its {guarantee} guarantee without this job (it ran {used} of "
                    f"training, fair share {fair})"
                )
            if q.name == p.name:
                head = f"paused for notebook kernel {w.id} of the same project {p.name}, to give it {share}"
            else:
                head = f"paused to give notebook kernel {w.id} of project {p.name} {share}"
            st.preempted[v.id] = f"{head}: {why}"
            st.touched.add(v.project)
        st.start(w, req, a, note="after pausing training job" + ("s " if len(victims) > 1 else " ")
                 + ", ".join(v.id for v in victims) + " to make room for it")
        if ledger.grew(node, before_free):
            st.cap.generation += 1  # leftover room: shapes that failed before may fit now
        return None


def _entry_key(entry: _Entry) -> _Key:
    return entry[0]
