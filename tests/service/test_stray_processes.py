"""Issue 22 item 3: every process an attempt started ends with the attempt, in its process group or not.

The attacker's (or a careless library's) way out is ``setsid``: a process in
a session of its own is out of the group the executor signals, and before
the fix it kept running, with the GPU in its ``CUDA_VISIBLE_DEVICES``, after
its job had ended and its GPU had gone to the next job.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpupool.backends.local.executor import LocalExecutor, proc_start_time
from gpupool.backends.local.sweep import RUN_ID, run_id_of
from tests.service.helpers import ADMIN, ALICE, wait_for

# Leaves a sleeper in a new session (out of the job's process group), notes its pid, then ends at once.
ESCAPE = "setsid sleep 120 & echo $! > stray.pid; {then}"


def _stray(workdir: str) -> int:
    path = Path(workdir) / "stray.pid"
    deadline = time.monotonic() + 30
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, "the job never noted its stray process"
        time.sleep(0.02)
    return int(path.read_text())


def _gone(pid: int) -> bool:
    return proc_start_time(pid) is None  # gone, or a zombie nobody reaped yet


async def test_a_process_that_left_the_group_ends_with_its_job_before_the_gpu_is_given_again(make_core):
    core = await make_core(simulate="1xA100-80GB")
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    first, _ = await core.submit(ALICE, {"project": "p", "gpus": 1,
                                         "command": ["sh", "-c", ESCAPE.format(then="sleep 1")]})
    second, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": ["sleep", "30"]})
    await wait_for(lambda: core.get_job(ADMIN, first["id"])["state"] == "running", what="the first job")
    stray = _stray(core.get_job(ADMIN, first["id"])["workdir"])
    assert run_id_of(stray) is not None  # it carries its attempt's identity
    await wait_for(lambda: core.get_job(ADMIN, second["id"])["state"] == "running", what="the second job")
    assert core.get_job(ADMIN, first["id"])["state"] == "succeeded"
    assert _gone(stray), "the first job's process still runs while its GPU is the second job's"
    await core.cancel(ALICE, second["id"])


async def test_cancel_reaches_a_process_that_left_the_group(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1,
                                       "command": ["sh", "-c", ESCAPE.format(then="sleep 60")]})
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running", what="the job")
    stray = _stray(core.get_job(ADMIN, job["id"])["workdir"])
    await core.cancel(ALICE, job["id"])
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "cancelled", what="the cancel")
    assert _gone(stray)


def test_after_a_restart_strays_of_attempts_nobody_adopted_are_ended(tmp_path):
    """What a service killed with kill -9 leaves: the sweep at recovery ends it, and spares live attempts."""
    ex = LocalExecutor(tmp_path / "jobs")
    pids = {}
    for job_id in ("j-dead", "j-live"):
        wd = tmp_path / job_id
        handle = ex.spawn(job_id, 1, ["sh", "-c", ESCAPE.format(then="true")], str(wd), {"PATH": os.environ["PATH"]})
        pids[job_id] = _stray(str(wd))
        assert handle.popen is not None and handle.popen.wait(30) == 0
    assert run_id_of(pids["j-dead"]) == str(ex.job_dir("j-dead") / "run" / "attempt-1")
    ex.recovered({("j-live", 1)})
    deadline = time.monotonic() + 10
    while not _gone(pids["j-dead"]):
        assert time.monotonic() < deadline, "the unadopted attempt's stray survived recovery"
        time.sleep(0.02)
    assert not _gone(pids["j-live"]), "a live attempt's process was killed"
    os.kill(pids["j-live"], signal.SIGKILL)


def test_a_job_cannot_choose_its_own_run_id(tmp_path):
    """The identity is the service's: a job's own GPUPOOL_RUN_ID is replaced, so it cannot hide."""
    ex = LocalExecutor(tmp_path / "jobs")
    wd = tmp_path / "w"
    handle = ex.spawn("j-1", 1, ["sh", "-c", ESCAPE.format(then="true")], str(wd),
                      {"PATH": os.environ["PATH"], RUN_ID: "elsewhere"})
    stray = _stray(str(wd))
    assert handle.popen is not None and handle.popen.wait(30) == 0
    assert run_id_of(stray) == str(ex.job_dir("j-1") / "run" / "attempt-1")
    ex.release(handle)
    assert _gone(stray)
