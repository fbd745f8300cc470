"""A kernel within its build quota gets its share on a machine full of training (the embedded default).

The policy pauses a training job for it (gpupool/policy/build_reclaim.py);
the service stops that job and hands the kernel its share, within the submit
reply when the job stops promptly.
"""

from __future__ import annotations

import asyncio

from tests.service.helpers import ADMIN, ALICE, PY, wait_for

STOPS_ON_TERM = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open("ready", "w").close()
time.sleep(120)
"""


async def test_kernel_gets_its_share_at_once_on_a_machine_full_of_its_projects_training(make_core, tmp_path):
    # one node serving both pools, one project guaranteed every GPU: its training is never preemptible
    core = await make_core(simulate="4xA100-80GB", min_runtime_s=60.0, resume_backoff_s=30.0)
    core.set_project(ADMIN, "p", {"build_quota": 1, "train_guarantee": 4})
    jobs = []
    for i in range(4):
        wd = tmp_path / f"w{i}"
        wd.mkdir()
        job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                           "command": [PY, "-c", STOPS_ON_TERM]})
        jobs.append(job["id"])
    await wait_for(lambda: all((tmp_path / f"w{i}" / "ready").exists() for i in range(4)), what="training ready")

    kernel, _ = await core.submit(ALICE, {"project": "p", "kind": "build", "gpu_fraction": 0.25})
    assert kernel["state"] == "running"  # in the submit reply
    states = {j: core.get_job(ADMIN, j)["state"] for j in jobs}
    assert sorted(states.values()) == ["paused", "running", "running", "running"]
    (paused,) = [j for j, st in states.items() if st == "paused"]
    held = {g["id"] for g in core.get_job(ADMIN, kernel["id"])["assignment"]["gpus"]}

    for _ in range(5):  # later cycles: nothing flaps, the kernel keeps its share
        core.periodic.tick()
        await asyncio.sleep(0.05)
    assert core.get_job(ADMIN, kernel["id"])["state"] == "running"
    assert core.get_job(ADMIN, paused)["state"] == "paused"
    running = [core.get_job(ADMIN, j) for j in jobs if j != paused]
    assert all(r["state"] == "running" for r in running)
    assert not held & {g["id"] for r in running for g in r["assignment"]["gpus"]}
