"""The cycle's per-job view of the live jobs equals a rebuild from the records after every kind of change.

The cycle no longer sorts and re-reads every live job: it reads a view the core
refreshes for the jobs it wrote since the last cycle. These tests drive a real
core (simulated GPUs, real processes) through submits, starts, preemption,
pauses, resumes, cancels, exits and a reload, and after each step compare what
the cycle would use (workloads in the snapshot, GPU shares held, jobs in
number order) with what a from-scratch pass over the records gives.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.service.core import SchedulerCore
from gpupool.service.jobs import assigned_gpus
from gpupool.service.live_view import LiveView
from tests.service.helpers import ADMIN, ALICE, BOB, PY, wait_for

SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def _rebuilt(core: SchedulerCore) -> tuple[list[str], tuple[Any, ...], dict[str, int]]:
    """What the cycle read before the view: sorted records, their workloads, summed shares."""
    live = sorted(core.book.live.values(), key=lambda r: r.num)
    workloads = core.cycles.snapshot(live).workloads
    used: dict[str, int] = {}
    for r in live:
        if r.state == "running":
            for g in assigned_gpus(r):
                used[g["id"]] = used.get(g["id"], 0) + int(g["milli"])
    return [r.id for r in live], workloads, used


def _check(core: SchedulerCore) -> None:
    ids, workloads, used = _rebuilt(core)
    assert [r.id for r in core.book.live_jobs()] == ids
    assert core.cycles.snapshot(None).workloads == workloads
    assert core.cycles.allocations(None) == used
    fresh = LiveView()  # a view that starts from nothing agrees too
    assert fresh.workloads(core.book.live, core.book.shown) == workloads
    assert fresh.used(core.book.live, core.book.shown) == used


async def test_view_matches_a_rebuild_through_a_jobs_life(make_core, tmp_path):
    core = await make_core(simulate="4xA100-80GB", min_runtime_s=0, resume_backoff_s=0, pause_grace_s=1)
    core.set_project(ADMIN, "low", {"train_guarantee": 0})
    core.set_project(ADMIN, "high", {"train_guarantee": 4})
    core.set_project(ADMIN, "kernels", {"build_quota": 1})
    _check(core)
    low = []
    for _ in range(4):  # fill the pool with jobs of a project without guarantee: preemptible
        job, _ = await core.submit(ALICE, {"project": "low", "gpus": 1, "command": SLEEP, "workdir": str(tmp_path)})
        low.append(job["id"])
        _check(core)
    core.cycles.run()
    _check(core)
    assert {core.get_job(ADMIN, j)["state"] for j in low} == {"running"}
    assert len(core.cycles.allocations(None)) == 4
    frac, _ = await core.submit(BOB, {"project": "high", "gpu_fraction": 0.5, "command": SLEEP,
                                      "workdir": str(tmp_path)})
    _check(core)
    core.cycles.run()  # preempts a low job for the guaranteed one: a stopping job leaves the snapshot
    _check(core)
    await wait_for(lambda: core.get_job(ADMIN, frac["id"])["state"] == "running" or None, 20, "the guaranteed job")
    _check(core)
    paused = [j for j in low if core.get_job(ADMIN, j)["state"] == "paused"]
    assert paused, "one low job was preempted"
    await core.resume(ALICE, paused[0])
    _check(core)
    running = [j for j in low if core.get_job(ADMIN, j)["state"] == "running"]
    await core.pause(ALICE, running[0])  # user-paused: sticky, not shown to the policy
    _check(core)
    await core.cancel(ALICE, running[1])
    _check(core)
    core.cycles.run()
    _check(core)
    build, _ = await core.submit(ALICE, {"project": "kernels", "kind": "build", "gpu_fraction": 0.5})
    _check(core)
    await core.cancel(ADMIN, frac["id"])
    core.cycles.run()
    _check(core)
    await asyncio.sleep(0)
    core.book.reload()  # the mirror replaced: the view rebuilds
    _check(core)
    await core.cancel(ALICE, build["id"])
    _check(core)


def test_a_job_out_of_number_order_rebuilds_the_view():
    """A job entering the mirror with a lower number than one the view holds keeps the view in number order."""
    from gpupool.service.store import JobRecord

    def rec(num: int) -> JobRecord:
        return JobRecord(id=f"j-{num:06d}", num=num, name="x", project="p", user="u", kind="train", state="running",
                         request={"gpus": 1}, priority=0, submitted_at=float(num), command=["true"], workdir="/tmp",
                         assignment={"node": "n", "gpus": [{"id": f"g{num}", "milli": 1000}]})

    live = {r.id: r for r in (rec(1), rec(5))}
    view = LiveView()
    shown = lambda r: ()  # noqa: E731
    assert [r.num for r in view.ordered(live, shown)] == [1, 5]
    live["j-000003"] = rec(3)
    view.touch("j-000003")
    assert [r.num for r in view.ordered(live, shown)] == [1, 3, 5]
    assert view.used(live, shown) == {"g1": 1000, "g3": 1000, "g5": 1000}
    del live["j-000001"]
    view.touch("j-000001")
    live["j-000005"].state = "paused"
    view.touch("j-000005")
    assert [r.num for r in view.ordered(live, shown)] == [3, 5]
    assert view.used(live, shown) == {"g3": 1000}
    live["j-000009"] = rec(9)  # an unmarked change never yields a partial view
    assert [r.num for r in view.ordered(live, shown)] == [3, 5, 9]
