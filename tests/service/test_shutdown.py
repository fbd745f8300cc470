"""Service shutdown modes: "stop" pauses running jobs (resumed on next start); "leave" re-adopts them."""

from __future__ import annotations

from scheduler.service.core import SchedulerCore
from tests.service.conftest import ADMIN, ALICE, fast_config
from tests.service.helpers import CHECKPOINTING_JOB, PY, wait_for


async def test_stop_mode_pauses_and_next_start_resumes(tmp_path):
    wd = tmp_path / "w"
    wd.mkdir()
    core = SchedulerCore(fast_config(tmp_path / "s", on_shutdown="stop"))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "30", "0.05"]})
    await wait_for(lambda: (wd / "ckpt.txt").exists())
    await core.stop()
    again = SchedulerCore(fast_config(tmp_path / "s", on_shutdown="stop"))
    rec = again._store.job(job["id"])
    assert rec is not None and rec.state == "paused" and not rec.user_paused and "shutdown" in rec.reason
    await again.start()
    try:
        await wait_for(lambda: again.get_job(ALICE, job["id"])["state"] == "succeeded", timeout=60)
    finally:
        await again.stop()
    starts = (wd / "starts.txt").read_text().splitlines()
    assert len(starts) == 2 and starts[1].startswith("2 1 ") and int(starts[1].split()[2]) > 0


async def test_leave_mode_readopts_running_jobs(tmp_path):
    wd = tmp_path / "w"
    wd.mkdir()
    core = SchedulerCore(fast_config(tmp_path / "s", on_shutdown="leave"))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "20", "0.05"]})
    await wait_for(lambda: (wd / "ckpt.txt").exists())
    await core.stop()
    again = SchedulerCore(fast_config(tmp_path / "s", on_shutdown="leave"))
    await again.start()
    try:
        assert again.get_job(ALICE, job["id"])["state"] == "running"
        await wait_for(lambda: again.get_job(ALICE, job["id"])["state"] == "succeeded", timeout=60)
        # Adopted processes are not our children: the exit status comes from the wrapper's file.
        assert again.get_job(ALICE, job["id"])["exit_code"] == 0
    finally:
        await again.stop()
    assert len((wd / "starts.txt").read_text().splitlines()) == 1
