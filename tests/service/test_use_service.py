"""Allocated vs used in a running service: simulated jobs and kernels drive their own use (gpupool.sim_use)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from tests.service.helpers import ADMIN, ALICE, BOB, PY

BUSY_THEN_IDLE = r"""
import time, gpupool
assert gpupool.sim_use(busy=1.0, memory=3 << 30)
time.sleep(2.0)
gpupool.sim_use(busy=0.0, memory=1 << 30)
time.sleep(2.0)
"""


async def _final(core, job_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = core.get_job(ADMIN, job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.05)


async def test_a_job_busy_then_idle_is_counted_used_then_idle(make_core):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    job, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": [PY, "-c", BUSY_THEN_IDLE]})
    done = await _final(core, job["id"])
    assert done["state"] == "succeeded", done
    await asyncio.sleep(0.3)  # a tick after its end
    row, = core.report(ALICE, since=time.time() - 60, by="job")["rows"]
    used_s, alloc_s = row["used_gpu_hours"] * 3600, row["allocated_gpu_hours"] * 3600
    assert row["job_id"] == job["id"] and row["kind"] == "train" and row["unmeasured_gpu_hours"] == 0
    assert 1.4 <= used_s <= 2.6  # busy for 2 s of one GPU
    assert alloc_s >= 3.6 and alloc_s - used_s >= 1.4  # held for 4 s and more (the start), idle the rest
    assert row["idle_gpu_hours"] * 3600 == pytest.approx(alloc_s - used_s, abs=0.01)
    assert row["peak_memory"] == 3 << 30
    metric = {what: core.registry.get_sample_value("gpupool_project_gpu_seconds_total",
                                                   {"project": "vision", "kind": "train", "what": what})
              for what in ("allocated", "measured", "used")}
    assert metric["allocated"] == pytest.approx(alloc_s, abs=0.3) and metric["used"] == pytest.approx(used_s, abs=0.3)
    assert metric["measured"] == pytest.approx(metric["allocated"])
    assert core.report(BOB, since=time.time() - 60, by="job")["rows"] == []  # not Bob's job


async def test_a_kernel_on_a_quarter_gpu_reports_through_its_share_environment(make_core):
    """A build share's environment (what the provisioner starts the kernel with) carries the hook's folder, and
    the kernel's process is found by its GPUPOOL_JOB_ID: half busy on a quarter GPU is an eighth of a GPU used."""
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"build_quota": 1})
    share, _ = await core.submit(BOB, {"project": "vision", "kind": "build", "gpu_fraction": 0.25})
    assert share["state"] == "running" and share["env"]["GPUPOOL_SIM_USE_DIR"]
    kernel = subprocess.Popen([PY, "-c", "import time, gpupool; gpupool.sim_use(busy=0.5); time.sleep(30)"],
                              env={**os.environ, **share["env"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    try:
        await asyncio.sleep(2.5)
        pool = core.pool()
        gpu = next(g for n in pool["nodes"] for g in n["gpus"] if g["allocations"])
        assert gpu["utilization"] == pytest.approx(12.5)  # the pool view shows what the kernel reports
        row, = core.report(BOB, since=time.time() - 60, by="job")["rows"]
        assert row["kind"] == "build" and row["efficiency"] is not None
        assert 0.3 <= row["efficiency"] <= 0.5  # busy from a moment after the share was granted
    finally:
        kernel.kill()
        kernel.wait()
        await core.cancel(BOB, share["id"])
