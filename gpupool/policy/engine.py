"""The scheduling cycle: one :class:`Snapshot` in, one :class:`Decisions` out.

The rules are written down for users in docs/policy.md; in short:

* **Build** work (interactive kernels) runs on the build pool, only within its
  project's fixed build quota, and is never paused. Over the quota it is
  rejected; within it but with no room it may pause training on nodes shared
  with the train pool (:mod:`gpupool.policy.build_reclaim`), and waits only
  when that cannot make room (the admin gave out more quota than the pool holds).
* **Training** work runs on the train pool in two passes. Pass 1 takes the
  jobs of projects below their guarantee (the job may take its project past
  it: a project claims its guarantee with its next job, whatever its size,
  and that job is not preemptible); such a job that does not fit may *reclaim*: pause jobs of projects above their guarantee
  (:mod:`gpupool.policy.reclaim`). Pass 2 takes the rest, which may only use
  idle capacity and start as preemptible. In each pass jobs go by priority,
  then by the project furthest below its fair share
  (:mod:`gpupool.policy.fairshare`), then by submission time. In pass 2 and
  in the choice of reclaim victims a project's recent use (``Project.recent_milli``,
  history decayed by a half-life) counts on top of its use now, so idle GPUs go
  first to the projects that had least of them lately; guarantees ignore history.
* A job may pause lower-priority jobs of its own project.
* A job that has waited longer than ``starvation_s`` is served in pass 1 at its
  place in the order; if it still does not fit it reserves the node closest to
  fitting it, and nothing else starts there this cycle.
* A paused job is not resumed on idle capacity within ``resume_backoff_s`` of
  its pause; within its project's guarantee (where nothing can pause it again)
  it may resume at once.

Everything is deterministic: inputs are sorted by id before use, ties are
broken by names and ids, and no clock or random source is read.

The cycle runs in phases, each handed one :class:`~gpupool.policy.cycle_state.CycleState`
(what the cycle reads and writes) and calling only phases below it:

1. intake (:mod:`gpupool.policy.intake`): the snapshot indexed, requests
   interned, use counted, gangs sorted out (:mod:`gpupool.policy.gang_setup`),
   the jobs beyond each guarantee flagged (:mod:`gpupool.policy.guarantee`);
2. build work (:mod:`gpupool.policy.build`), with build claims
   (:mod:`gpupool.policy.build_reclaim`);
3. training (:mod:`gpupool.policy.training`): admission, fair shares, the two
   passes, with reclaim (:mod:`gpupool.policy.reclaim`), a gang's turn
   (:mod:`gpupool.policy.gangs`) and gang reclaim (:mod:`gpupool.policy.gang_reclaim`);
4. outcome (:mod:`gpupool.policy.outcome`): the decisions and preemptible flags.

Speed: a cycle touches each pending job once or twice. Equal request shapes
share per-cycle memos (a shape that did not fit still does not fit while
capacity only shrinks; the same for reclaim), reasons are built once per
shape and project state, and only projects whose jobs changed are re-counted
against their guarantee at the end.
"""

from __future__ import annotations

import gc

from gpupool.policy.build import Builds
from gpupool.policy.build_reclaim import BuildReclaim
from gpupool.policy.cache import PolicyCache, using
from gpupool.policy.gang_reclaim import GangReclaim
from gpupool.policy.gangs import GangTurns
from gpupool.policy.intake import open_cycle
from gpupool.policy.model import Decisions, Snapshot
from gpupool.policy.outcome import decisions
from gpupool.policy.reclaim import Reclaim
from gpupool.policy.training import Training

__all__ = ["schedule"]


def schedule(snapshot: Snapshot, cache: PolicyCache | None = None) -> Decisions:
    """Decide what starts where, what is paused and why, for one cycle.

    ``cache``: what the caller's last cycle left to start from (gpupool/policy/cache.py);
    None starts from nothing. The decisions are the same either way.

    The cyclic garbage collector is held off for the cycle: a cycle allocates
    tens of thousands of short-lived containers (freed by reference counting),
    and the collections they trigger walk the objects the caller holds (a
    10k-pending snapshot is some 200k objects): at that scale about a tenth of
    a steady cycle, and a cycle that hits a full collection took twice as
    long. It is switched back on (if it was on) on the way out, whatever
    happens.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        with using(cache if cache is not None else PolicyCache()):
            state, builds, trains = open_cycle(snapshot)
            try:
                Builds(state, BuildReclaim(state)).run(builds)
                reclaim = Reclaim(state)
                gang_reclaim = GangReclaim(state, reclaim)  # builds on the plain reclaim's victim lists
                Training(state, reclaim, gang_reclaim, GangTurns(state, gang_reclaim)).run(trains)
                return decisions(state)
            finally:
                state.queue = None  # the queue holds a bound method of the state: break the loop
    finally:
        if enabled:
            gc.enable()
