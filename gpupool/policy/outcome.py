"""Outcome, the cycle's last phase: its decisions, with the reason for each start and the preemptible flags.

Once the passes are done, each project whose running set changed is counted
against its guarantee again (:func:`~gpupool.policy.guarantee.over_guarantee`):
the jobs beyond it, in the order they would be paused, are flagged
preemptible, and a start's reason says whether it runs within the guarantee
or on idle GPUs.
"""

from __future__ import annotations

from functools import partial

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState, Started
from gpupool.policy.guarantee import over_guarantee
from gpupool.policy.model import Decisions, Kind, Preempt, Project, Start


def decisions(state: CycleState) -> Decisions:
    """The :class:`Decisions` of the cycle, from what the phases recorded in ``state``."""
    flags = dict(state.flags_at_start)
    started_by: dict[str, list[tuple[int, Started]]] = {}
    for i, s in enumerate(state.started):
        if s.workload.kind is Kind.TRAIN:
            started_by.setdefault(s.workload.project, []).append((i, s))
    for name in state.touched:
        flags[name] = over_guarantee(state, name, started_by.get(name, []))
    flagged: set[str] = set().union(*flags.values()) if flags else set()
    starts = []
    for s in state.started:
        w = s.workload
        p = state.projects[w.project]
        if w.kind is Kind.BUILD:
            reason = (
                f"granted on {s.assignment.node} within project {p.name}'s build quota "
                f"({txt.gpus(state.build_used[p.name])} of {txt.gpus(p.build_quota_milli)} held)"
            ) + (" " + s.note if s.note else "")
            starts.append(Start(w.id, s.assignment, False, reason))
            continue
        pre = w.id in flagged
        # (what follows the node depends only on the project and the flag: built once for each)
        reason = f"starts on {s.assignment.node}" + state.reason(
            ("start", p.name, pre), partial(_start_reason, state, p, pre))
        if s.note:
            reason += " " + s.note
        starts.append(Start(w.id, s.assignment, pre, reason))
    # flagged holds running training jobs and this cycle's starts (over_guarantee): the running ones
    # still running are the rest, found without a pass over every running job
    started_ids = {s.workload.id for s in state.started}
    preempted = state.preempted
    running_flagged = sorted(i for i in flagged if i not in preempted and i not in started_ids)
    return Decisions(
        starts=tuple(starts),
        preempts=tuple(Preempt(i, r) for i, r in state.preempted.items()),
        rejects=tuple(state.rejects),
        waits=tuple(state.waits),
        preemptible=tuple(running_flagged),
    )


def _start_reason(state: CycleState, p: Project, pre: bool) -> str:
    """Why a training job of project ``p`` starts, after "starts on <node>" (usage as after this cycle)."""
    used, guarantee = txt.gpus(state.usage[p.name]), txt.gpus(p.train_guarantee_milli)
    if pre:
        return (
            f" as preemptible: project {p.name} runs {used} of training, "
            f"over its guarantee of {guarantee}, on idle GPUs "
            f"(fair share {txt.gpus(state.shares.get(p.name, 0.0))}"
            + (f", {txt.gpus(state.recent[p.name])} on average recently" if state.recent[p.name] else "")
            + ")"
        )
    if state.usage[p.name] > p.train_guarantee_milli:
        return (
            f" on project {p.name}'s guarantee of {guarantee}: the project "
            f"was below it, and a job started below the guarantee is not preemptible even where it "
            f"goes past it (the project runs {used} of training after this cycle)"
        )
    return (
        f" within project {p.name}'s guarantee of {guarantee} "
        f"(the project runs {used} of training after this cycle)"
    )
