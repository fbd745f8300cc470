"""A stop that reaches a job after its command has ended never reruns it (issue 16, item 1).

The service notices an ended process only every ``poll_s``. A pause, a
reclaim or a cancel that arrives in between used to win over the recorded
exit status: the job became ``paused`` (and ran a second time on resume) or
``cancelled``. The recorded exit status must win. A command that ends
*because* it was stopped (a checkpoint on SIGTERM, status 0) is still paused.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.backends.local._wrapper import ENDED, STOPPED
from gpupool.wire.errors import Conflict
from tests.service.helpers import ADMIN, ALICE, BOB, CHECKPOINTING_JOB, PY, started, wait_for

RUN_ONCE = "import sys; open(sys.argv[1], 'a').write('RUN\\n')"


async def _ended_quickly(core, tmp_path: Path, name: str) -> tuple[dict, Path]:
    """A job whose command appends RUN to a file and exits 0 at once; returned once it has exited."""
    marks = tmp_path / f"{name}.txt"
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", RUN_ONCE, str(marks)]})
    job = await started(core, job["id"])
    assert job["state"] == "running"
    await wait_for(lambda: marks.exists(), what="the command to run")
    await asyncio.sleep(0.5)  # the command and its wrapper have exited; the monitor (poll_s=30) has not looked
    assert core.get_job(ALICE, job["id"])["state"] == "running"
    return job, marks


@pytest.mark.parametrize("action", ["pause", "cancel"])
async def test_a_stop_after_the_command_ended_leaves_the_job_succeeded(make_core, tmp_path, action):
    core = await make_core(poll_s=30.0)
    core.set_project(ADMIN, "p", {"train_guarantee": 2})
    job, marks = await _ended_quickly(core, tmp_path, action)
    after = await getattr(core, action)(ALICE, job["id"])
    assert after["state"] == "succeeded" and after["exit_code"] == 0, after
    with pytest.raises(Conflict):
        await core.resume(ALICE, job["id"])
    await asyncio.sleep(0.5)
    assert marks.read_text() == "RUN\n"  # ran once, never again
    states = [e["state"] for e in core.events_since(0) if e.get("job_id") == job["id"]]
    assert states[-1] == "succeeded" and "paused" not in states and "cancelled" not in states


async def test_a_reclaim_after_the_command_ended_does_not_rerun_it(make_core, tmp_path):
    core = await make_core(poll_s=30.0)
    core.set_project(ADMIN, "p", {"train_guarantee": 0})
    core.set_project(ADMIN, "owner", {"train_guarantee": 2})
    jobs = [await _ended_quickly(core, tmp_path, f"over{i}") for i in range(2)]
    claim, _ = await core.submit(BOB, {"project": "owner", "gpus": 2, "command": [PY, "-c", "pass"]})
    await wait_for(lambda: core.get_job(ADMIN, claim["id"])["state"] != "queued", what="the claim to start")
    for job, marks in jobs:
        assert core.get_job(ADMIN, job["id"])["state"] == "succeeded"
        assert marks.read_text() == "RUN\n"


async def test_a_job_stopped_while_running_is_still_paused_and_resumed(make_core, tmp_path):
    """The other side: a checkpointing command that exits 0 on SIGTERM was stopped, not finished."""
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    wd = tmp_path / "wd"
    wd.mkdir()
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "1000", "0.05"]})
    await started(core, job["id"])
    await wait_for(lambda: (wd / "ckpt.txt").exists(), what="a checkpoint")
    await core.pause(ALICE, job["id"])
    await wait_for(lambda: core.get_job(ALICE, job["id"])["state"] == "paused", what="the pause")
    paused = core.get_job(ALICE, job["id"])
    assert paused["exit_code"] == 0 and paused["attempts"] == 1
    await core.resume(ALICE, job["id"])
    await wait_for(lambda: len((wd / "starts.txt").read_text().splitlines()) == 2, what="the resume")
    assert (wd / "starts.txt").read_text().splitlines()[1].startswith("2 1 ")  # resumed from its checkpoint


def _wrapper(tmp_path: Path, *command: str) -> tuple[subprocess.Popen[bytes], str]:
    prefix = str(tmp_path / "attempt-1")
    Path(prefix + ".launch").write_text("t\n")
    Path(prefix + ".env").write_text(json.dumps({"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
    proc = subprocess.Popen([sys.executable, "-I", "-m", "gpupool.backends.local._wrapper", prefix, "--", *command],
                            start_new_session=True)
    return proc, prefix


def test_the_wrapper_records_whether_the_stop_reached_the_command(tmp_path):
    """SIGTERM to the wrapper alone: passed on to a running command (``stopped``); after the end, too late."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    running, prefix_a = _wrapper(tmp_path / "a", PY, "-c", "import time; time.sleep(60)")
    deadline = time.monotonic() + 30
    while not Path(prefix_a + ".pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    running.send_signal(signal.SIGTERM)
    assert running.wait(30) == 128 + signal.SIGTERM
    assert Path(prefix_a + ".exit").read_text().split() == [str(-signal.SIGTERM), STOPPED]

    done, prefix_b = _wrapper(tmp_path / "b", PY, "-c", "pass")
    assert done.wait(30) == 0
    assert Path(prefix_b + ".exit").read_text().split() == ["0", ENDED]
