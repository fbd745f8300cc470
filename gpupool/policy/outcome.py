"""The cycle's output: its decisions, with the reason for each start and the preemptible flags.

A mixin of the engine's cycle object (:class:`gpupool.policy.engine._Cycle`).
Once the passes are done, each project whose running set changed is counted
against its guarantee again (:meth:`OutcomeMixin.over_guarantee`): the jobs
beyond it, in the order they would be paused, are flagged preemptible, and a
start's reason says whether it runs within the guarantee or on idle GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang_setup import flag_units
from gpupool.policy.model import Assignment, Decisions, Kind, Preempt, Project, Request, Start, Workload
from gpupool.policy.reclaim import sort_by_start


@dataclass
class Started:
    """A start decided this cycle (the output's ``Start`` is built from it at the end)."""

    workload: Workload
    request: Request  # the interned request
    assignment: Assignment
    note: str  # what is specific to this start (e.g. "on GPUs freed by pausing j1")


_by_id = attrgetter("id")


def _new_then_priority(item: tuple[Workload, int]) -> tuple[int, int]:
    """Sort key, used reversed: higher priority first; within it running jobs (0) before new starts (1)."""
    return (item[0].priority, -item[1])


class OutcomeMixin(CycleState):
    """The decisions of a cycle, and who is preemptible (see the module docstring)."""

    if TYPE_CHECKING:  # beyond CycleState's (set by the engine)
        flags_at_start: dict[str, set[str]]
        build_used: dict[str, int]

        def reason(self, key: tuple, build) -> str: ...

    def decisions(self) -> Decisions:
        flags = dict(self.flags_at_start)
        started_by: dict[str, list[tuple[int, Started]]] = {}
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

    def over_guarantee(self, name: str, new_starts: Sequence[tuple[int, Started]] = ()) -> set[str]:
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
