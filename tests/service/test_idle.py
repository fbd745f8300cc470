"""Idle GPUs by use (gpupool.service.idle) in a running service: the jobs drive their own use (gpupool.sim_use).

Each job reads the busy part of its share from a file the test writes (argv[1])
and reports it whenever it changes, as a notebook or trainer on simulated GPUs
does. Windows are a second or two, so the flags come within the test.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.tables import jobs_table, status_text
from gpupool.inventory import GpuSample
from gpupool.wire.errors import InvalidRequest
from tests.service.helpers import ADMIN, ALICE, BOB, PY

pytestmark = pytest.mark.timeout(90)

DRIVEN = r"""
import os, signal, sys, time, gpupool
load, out = sys.argv[1], sys.argv[2]
def term(*_):
    open(os.path.join(out, "checkpointed"), "w").write("saved")  # the checkpoint signal: save, then leave
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
last = None
while True:
    try:
        busy = float(open(load).read().strip() or 0)
    except (OSError, ValueError):
        busy = 0.0
    if busy != last:
        assert gpupool.sim_use(busy=busy, memory=1 << 30)
        last = busy
    time.sleep(0.05)
"""
"""A job whose GPU use is what the file argv[1] says (0..1 of its share); SIGTERM writes argv[2]/checkpointed."""


def _set_load(path: Path, busy: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(busy))
    os.replace(tmp, path)


async def _until(what: str, check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _idle_events(core: Any, job_id: str) -> list[dict[str, Any]]:
    return [e for e in core.events_since(0) if e["type"] == "idle" and e.get("job_id") == job_id]


async def _driven_job(core: Any, tmp_path: Path, busy: float, project: str = "vision") -> tuple[dict[str, Any], Path]:
    load = tmp_path / "load"
    _set_load(load, busy)
    job, _ = await core.submit(ALICE, {"project": project, "gpus": 1,
                                       "command": [PY, "-c", DRIVEN, str(load), str(tmp_path)]})
    await _until("the job to run", lambda: core.get_job(ALICE, job["id"])["state"] == "running")
    return job, load


async def test_a_training_job_busy_then_idle_is_flagged_after_its_window_and_cleared_when_busy_again(
        make_core, tmp_path):
    core = await make_core(simulate="2xA100-80GB")
    project = core.set_project(ADMIN, "vision", {"train_guarantee": 2,
                                                 "idle": {"train": {"action": "flag", "window_s": 1.5}}})
    assert project["idle"] == {"build": {"below_percent": 5.0, "window_s": 1800.0, "action": "cull"},
                               "train": {"below_percent": 5.0, "window_s": 1.5, "action": "flag"}}
    job, load = await _driven_job(core, tmp_path, busy=0.8)
    await asyncio.sleep(2.5)  # busy for longer than the window: never idle
    seen = core.get_job(ALICE, job["id"])
    assert seen["idle_since"] is None and seen["idle_action"] is None and _idle_events(core, job["id"]) == []

    _set_load(load, 0.02)  # 2 % of its share: under the 5 % threshold
    went_idle = time.time()
    flagged = await _until("the idle flag", lambda: core.get_job(ALICE, job["id"])["idle_since"])
    seen_at = time.time()
    since = datetime.datetime.fromisoformat(flagged).timestamp()  # to the second
    assert seen_at - went_idle >= 1.5 - 0.3  # not before the window (less a tick of sampling)
    # since when: where the idle stretch began (at or after the load fell), a whole window before the flag
    assert went_idle - 1.0 <= since and since + 1.5 <= seen_at + 0.1
    listed, = core.list_jobs(BOB, {"state": "running"})
    assert listed["idle_since"] == flagged and listed["idle_action"] == "flag"  # every view, every user
    assert core.status(BOB)["idle_running"] == 1
    assert "running idle" in jobs_table([listed]) and "(idle:" in jobs_table([listed])
    assert "1 running (1 idle)" in status_text("http://x", core.status(BOB))
    event, = _idle_events(core, job["id"])
    assert event["idle_since"] == flagged and event["action"] == "flag" and event["user"] == "alice"
    assert "under 5 % of its GPU share for 1.5 s" in event["reason"]
    assert core.get_job(ALICE, job["id"])["state"] == "running"  # flagged only

    _set_load(load, 0.5)
    await _until("the flag to clear", lambda: core.get_job(ALICE, job["id"])["idle_since"] is None)
    cleared = _idle_events(core, job["id"])[-1]
    assert cleared["idle_since"] is None and "busy again: 50 %" in cleared["reason"]
    assert core.status(BOB)["idle_running"] == 0
    await core.cancel(ALICE, job["id"])


async def test_pause_on_idle_pauses_with_the_checkpoint_signal_until_the_owner_resumes(make_core, tmp_path):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2,
                                       "idle": {"train": {"action": "pause", "window_s": 1, "below_percent": 10}}})
    job, load = await _driven_job(core, tmp_path, busy=0.05)  # 5 %: under this project's 10 %
    paused = await _until("the idle pause", lambda: (j := core.get_job(ALICE, job["id"]))["state"] == "paused" and j)
    assert (tmp_path / "checkpointed").read_text() == "saved"  # asked to stop with the checkpoint signal
    assert "used under 10 % of its GPU share for 1 s" in paused["reason"]
    assert f"gpupool resume {job['id']}" in paused["reason"] and paused["idle_since"] is None
    event, = _idle_events(core, job["id"])
    assert event["action"] == "pause" and event["kind"] == "train"
    await asyncio.sleep(1.0)
    assert core.get_job(ALICE, job["id"])["state"] == "paused"  # sticky: free GPUs do not restart it
    _set_load(load, 1.0)
    await core.resume(ALICE, job["id"])
    again = await _until("the resumed run", lambda: core.get_job(ALICE, job["id"])["state"] == "running")
    assert again
    await asyncio.sleep(2.0)  # busy now: not paused again
    assert core.get_job(ALICE, job["id"])["state"] == "running"
    await core.cancel(ALICE, job["id"])


async def test_unmeasured_time_is_never_idle(make_core, tmp_path):
    """GPUs that cannot say what each process uses (NVML without per-process accounting) flag nothing."""
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2, "idle": {"train": {"action": "pause", "window_s": 1}}})
    unmeasured = {gid: GpuSample(utilization=0.0, memory_used=0, processes={}, process_util=None)
                  for gid in core.pool_state.gpus}
    core.backend.sample = lambda: dict(unmeasured)  # type: ignore[method-assign]
    job, _ = await _driven_job(core, tmp_path, busy=0.0)
    await asyncio.sleep(3.0)
    seen = core.get_job(ALICE, job["id"])
    assert seen["state"] == "running" and seen["idle_since"] is None and _idle_events(core, job["id"]) == []
    await core.cancel(ALICE, job["id"])


async def test_training_jobs_are_not_watched_by_default_and_a_kernel_share_is_flagged_for_its_server(
        make_core, tmp_path):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1, "build_quota": 1,
                                       "idle": {"build": {"window_s": 1}}})
    job, _ = await _driven_job(core, tmp_path, busy=0.0)
    share, _ = await core.submit(BOB, {"project": "vision", "kind": "build", "gpu_fraction": 0.25})
    kernel = subprocess.Popen([PY, "-c", "import time, gpupool; gpupool.sim_use(busy=0.0); time.sleep(60)"],
                              env={**os.environ, **share["env"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    try:
        flagged = await _until("the kernel's flag", lambda: core.get_job(BOB, share["id"])["idle_since"])
        assert core.get_job(BOB, share["id"])["idle_action"] == "cull"
        assert core.get_job(BOB, share["id"])["state"] == "running"  # culling is its Jupyter server's (after a notice)
        event, = _idle_events(core, share["id"])
        assert event["idle_since"] == flagged and event["kind"] == "build" and event["user"] == "bob"
        assert core.get_job(ALICE, job["id"])["idle_since"] is None  # train: off by default
        assert _idle_events(core, job["id"]) == []
        # the admin turns kernels' rule off: the flag goes
        core.set_project(ADMIN, "vision", {"idle": {"build": {"action": "off"}}})
        await _until("the flag to clear", lambda: core.get_job(BOB, share["id"])["idle_since"] is None)
        assert "rule for build jobs is off" in _idle_events(core, share["id"])[-1]["reason"]
    finally:
        kernel.kill()
        kernel.wait()
        await core.cancel(BOB, share["id"])
        await core.cancel(ALICE, job["id"])


async def test_idle_settings_are_merged_kept_and_bad_ones_refused(make_core):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"idle": {"train": {"action": "pause"}}})
    got = core.set_project(ADMIN, "vision", {"idle": {"train": {"window_s": 600}, "build": {"below_percent": 2}}})
    assert got["idle"]["train"] == {"below_percent": 5.0, "window_s": 600.0, "action": "pause"}
    assert got["idle"]["build"] == {"below_percent": 2.0, "window_s": 1800.0, "action": "cull"}
    assert core.set_project(ADMIN, "vision", {"weight": 2})["idle"] == got["idle"]  # left out: kept
    bad = [({"train": {"action": "cull"}}, "idle"), ({"build": {"action": "pause"}}, "idle.build.action"),
           ({"build": {"below_percent": 0}}, "below_percent"), ({"train": {"window_s": 0.5}}, "window_s"),
           ({"train": {"window_s": "long"}}, "window_s"), ({"gpu": {}}, "gpu"), ({"train": {"when": 1}}, "when"),
           ("often", "idle")]
    for value, named in bad:
        with pytest.raises(InvalidRequest) as err:
            core.set_project(ADMIN, "vision", {"idle": value})
        assert named in str(err.value), (value, str(err.value))
    assert core.list_projects()[0]["idle"] == got["idle"]  # nothing changed by a refusal
    assert core.set_project(ADMIN, "vision", {"idle": None})["idle"]["train"]["action"] == "off"  # the defaults


class _PodsOutsideGpupool:
    """The one question the idle watch asks of a backend's foreign work (kubectl pods): does a job stand for one?"""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def stands_for(self, job: Any) -> str | None:
        return "team-a/train-0" if job.id == self.job_id else None


async def test_pause_on_idle_only_flags_a_job_standing_for_a_pod_made_outside_gpupool(make_core, tmp_path):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2, "idle": {"train": {"action": "pause", "window_s": 1}}})
    job, _ = await _driven_job(core, tmp_path, busy=0.0)
    core.idle.foreign = _PodsOutsideGpupool(job["id"])  # as the Kubernetes backend's kubectl pods are
    flagged = await _until("the idle flag", lambda: core.get_job(ALICE, job["id"])["idle_since"])
    assert flagged
    await asyncio.sleep(1.0)
    seen = core.get_job(ALICE, job["id"])
    assert seen["state"] == "running" and seen["idle_action"] == "pause"
    event, = _idle_events(core, job["id"])
    assert "which cannot be paused" in event["reason"]
    await core.cancel(ALICE, job["id"])
