"""Build work (interactive kernels): the cycle's first decisions, before any training job.

A kernel runs on the build pool, only within its project's fixed build
quota, and is never paused. Over the quota it is rejected; within it but
with no room it may pause training on nodes shared with the train pool
(:mod:`gpupool.policy.build_reclaim`), and waits only when that cannot make
room (the admin gave out more quota than the pool holds). Kernels go first
so that a quota is there whenever it is asked for.
"""

from __future__ import annotations

from gpupool.policy import reasons as txt
from gpupool.policy.build_reclaim import BuildReclaim
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.model import BUILD_POOL, Project, Reject, Request, Wait, Workload
from gpupool.policy.queue import job_order


class Builds:
    """The build phase: each kernel in job order, within its project's quota."""

    def __init__(self, state: CycleState, claims: BuildReclaim) -> None:
        self.state = state
        self.claims = claims  # a kernel that does not fit pausing training on shared nodes

    def run(self, builds: list[Workload]) -> None:
        """Decide every pending build workload (priority, submission, id)."""
        req_of = self.state.req_of
        for w in sorted(builds, key=job_order):
            self.schedule(w, req_of[w.id])
        self.state.cap.drop(BUILD_POOL)  # build work is placed; train commits need not update its state

    def schedule(self, w: Workload, req: Request) -> None:
        """Start, refuse or hold one kernel (with ``req``, its interned request)."""
        st = self.state
        p = st.projects[w.project]
        if not st.fits_empty(BUILD_POOL, req):
            st.cannot_hold(w.id, BUILD_POOL, req, f"no node of the build pool can ever hold {txt.describe(req)}",
                              f"no node of the build pool can hold {txt.describe(req)} now")
            return
        used = st.build_used[p.name]
        need = st.estimate(BUILD_POOL, req)
        if used + need > p.build_quota_milli:
            st.rejects.append(Reject(w.id, self.over_build_quota(p, need)))
            return
        a = st.place(BUILD_POOL, req)
        if a is None:
            # training on nodes shared with the build pool gives way (gpupool/policy/build_reclaim.py)
            why = self.claims.claim(w, req, p)
            if why is not None:
                st.waits.append(Wait(w.id, why))
            return
        if used + a.total_milli > p.build_quota_milli:
            st.waits.append(Wait(
                w.id,
                f"the only GPU with room takes {txt.gpus(a.total_milli)} for this request, more than the "
                f"{txt.gpus(p.build_quota_milli - used)} left of project {p.name}'s build quota",
            ))
            return
        st.start(w, req, a)

    def over_build_quota(self, p: Project, need: int) -> str:
        """Why a kernel that would take its project past its build quota is refused."""
        used = self.state.build_used[p.name]
        return (
            f"project {p.name} has a build quota of {txt.gpus(p.build_quota_milli)}; "
            f"{txt.gpus(used)} is held by {txt.holders(self.state.build_holders[p.name])}; "
            f"this request needs {txt.gpus(need)} more"
        )
