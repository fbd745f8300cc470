"""Service shutdown modes: "stop" pauses running jobs (resumed on next start); "leave" re-adopts them."""

from __future__ import annotations

import pytest

from gpupool.app.backend import build_core
from gpupool.service.core import SchedulerCore
from tests.service.helpers import ADMIN, ALICE, CHECKPOINTING_JOB, PY, SLOW_TO_STOP, fast_config, wait_for


async def test_stop_mode_pauses_and_next_start_resumes(tmp_path):
    wd = tmp_path / "w"
    wd.mkdir()
    core = build_core(fast_config(tmp_path / "s", on_shutdown="stop"))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "30", "0.05"]})
    await wait_for(lambda: (wd / "ckpt.txt").exists())
    await core.stop()
    again = build_core(fast_config(tmp_path / "s", on_shutdown="stop"))
    rec = again.book.store.job(job["id"])
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
    core = build_core(fast_config(tmp_path / "s", on_shutdown="leave"))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "20", "0.05"]})
    await wait_for(lambda: (wd / "ckpt.txt").exists())
    await core.stop()
    again = build_core(fast_config(tmp_path / "s", on_shutdown="leave"))
    await again.start()
    try:
        assert again.get_job(ALICE, job["id"])["state"] == "running"
        await wait_for(lambda: again.get_job(ALICE, job["id"])["state"] == "succeeded", timeout=60)
        # Adopted processes are not our children: the exit status comes from the wrapper's file.
        assert again.get_job(ALICE, job["id"])["exit_code"] == 0
    finally:
        await again.stop()
    assert len((wd / "starts.txt").read_text().splitlines()) == 1


async def test_start_interrupted_before_spawn_is_requeued_not_lost(tmp_path):
    """The store says "starting attempt 1" but the service died before the process existed."""
    from gpupool.service.store import JobRecord, Store

    core = build_core(fast_config(tmp_path / "s"))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    gpu = core.pool()["nodes"][0]["gpus"][0]
    await core.stop()
    marker = tmp_path / "ran.txt"
    store = Store(tmp_path / "s" / "state.db")
    store.insert_job(JobRecord(
        id="j-000900", num=900, name="x", project="p", user="alice", kind="train", state="running",
        request={"gpus": 1}, attempts=1, submitted_at=1.0, reason="starting attempt 1",
        assignment={"node": "testhost", "gpus": [{"id": gpu["id"], "index": 0, "model": gpu["model"],
                                                  "milli": 1000, "memory_limit": gpu["memory"]}]},
        workdir=str(tmp_path), command=[PY, "-c", f"import os; open({str(marker)!r}, 'a').write(os.environ['GPUPOOL_ATTEMPT'] + os.environ['GPUPOOL_RESUME'] + chr(10))"],
    ))
    ticket = tmp_path / "s" / "jobs" / "j-000900" / "run" / "attempt-1.launch"
    ticket.parent.mkdir(parents=True)
    ticket.write_text("x")  # written, but the wrapper never claimed it
    store.close()
    again = build_core(fast_config(tmp_path / "s"))
    await again.start()
    try:
        events = [e for e in again.events_since(0) if e.get("job_id") == "j-000900"]
        assert any("start interrupted" in e["reason"] for e in events)
        await wait_for(lambda: again.get_job(ALICE, "j-000900")["state"] == "succeeded")
    finally:
        await again.stop()
    assert marker.read_text() == "10\n"  # ran once, as a first attempt


async def test_wait_events_wakes_on_new_event(make_core):
    import asyncio

    core = await make_core()
    seq = core.last_event_seq
    waiter = asyncio.create_task(core.wait_events(seq, 10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    core.set_project(ADMIN, "p", {})
    events = await asyncio.wait_for(waiter, 5)
    assert events and events[0]["type"] == "project" and events[0]["seq"] == seq + 1


def test_process_owner_found_by_environment(tmp_path):
    import os
    import subprocess

    from gpupool.service.watchdog import job_of_process

    proc = subprocess.Popen([PY, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                            env={**os.environ, "GPUPOOL_JOB_ID": "j-000042"}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # exec'd: its own environment now
        assert job_of_process(proc.pid, {}) == "j-000042"  # a kernel: found through its environment
        assert job_of_process(os.getpid(), {os.getsid(0): "j-1"}) == "j-1"  # a job: found through its session
    finally:
        proc.kill()
        proc.wait()


async def test_one_service_per_state_dir(tmp_path):
    from gpupool.wire.errors import Unavailable

    first = build_core(fast_config(tmp_path / "s"))
    await first.start()
    try:
        try:
            build_core(fast_config(tmp_path / "s"))
        except Unavailable as e:
            assert "another gpupool scheduler" in e.message and str(__import__("os").getpid()) in e.message
        else:
            raise AssertionError("a second service started on the same state dir")
    finally:
        await first.stop()
    second = build_core(fast_config(tmp_path / "s"))  # released at stop
    await second.start()
    await second.stop()


def test_bad_simulation_spec_is_a_clear_error_and_frees_the_state_dir(tmp_path):
    import pytest

    from gpupool.wire.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="unknown GPU model"):
        build_core(fast_config(tmp_path / "s", simulate="2xB9000"))
    build_core(fast_config(tmp_path / "s"))._lock.close()  # the lock was released


async def _crash(core: SchedulerCore) -> None:
    """What kill -9 leaves: no stop(), loops and stop tasks gone, the state dir lock released."""
    import asyncio

    core.life.closing = True
    for t in [*core._tasks, *core.attempts.stop_tasks.values()]:
        t.cancel()
    await asyncio.sleep(0)
    core.book.store.close()
    core._lock.close()


async def test_crash_during_a_pause_still_ends_paused(tmp_path):
    wd = tmp_path / "w"
    wd.mkdir()
    core = build_core(fast_config(tmp_path / "s", reply_wait_s=0.05))
    await core.start()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd), "command": [PY, "-c", SLOW_TO_STOP, "0.8"]})
    await wait_for(lambda: (wd / "ready").exists())
    reply = await core.pause(ALICE, job["id"])
    assert reply["state"] == "running"  # SIGTERM sent; the job takes its time
    await _crash(core)
    again = build_core(fast_config(tmp_path / "s"))
    await again.start()
    try:
        await wait_for(lambda: again.get_job(ALICE, job["id"])["state"] == "paused", what="paused after restart")
        rec = again.book.job(job["id"])
        assert rec is not None and rec.user_paused and rec.assignment is None  # still the user's sticky pause
        resumed = await again.resume(ALICE, job["id"])
        assert resumed["state"] == "running" and resumed["attempts"] == 2
    finally:
        await again.stop()


async def test_crash_during_a_cancel_still_ends_cancelled(tmp_path):
    wd = tmp_path / "w"
    wd.mkdir()
    core = build_core(fast_config(tmp_path / "s", reply_wait_s=0.05))
    await core.start()
    core.set_project(ADMIN, "p", {})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd), "command": [PY, "-c", SLOW_TO_STOP, "0.8"]})
    await wait_for(lambda: (wd / "ready").exists())
    await core.cancel(ALICE, job["id"])
    await _crash(core)
    import asyncio

    await asyncio.sleep(1.5)  # the job finishes its SIGTERM handling while no service runs
    again = build_core(fast_config(tmp_path / "s"))
    await again.start()
    try:
        done = again.get_job(ALICE, job["id"])
        assert done["state"] == "cancelled" and done["exit_code"] == 0
    finally:
        await again.stop()


class _Recorded(Exception):
    pass


def test_serve_leaves_jobs_running_and_embedded_stops_them_by_default(tmp_path, monkeypatch):
    import json

    from gpupool.app import embedded
    from gpupool.cli import main as cli
    from gpupool.service.config import ServiceConfig

    seen: list[ServiceConfig] = []
    original = embedded.EmbeddedScheduler

    class Recording(embedded.EmbeddedScheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.service_config())
            raise _Recorded  # stop before anything listens

    monkeypatch.setattr(embedded, "EmbeddedScheduler", Recording)
    with pytest.raises(_Recorded):
        cli.main(["serve", "--state-dir", str(tmp_path / "a"), "--port", "0", "--simulate", "1xA100-80GB"])
    assert seen[-1].on_shutdown == "leave"  # `gpupool serve`: a restart or upgrade re-adopts running jobs
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"on_shutdown": "stop"}))
    with pytest.raises(_Recorded):
        cli.main(["serve", "--state-dir", str(tmp_path / "b"), "--port", "0", "--simulate", "1xA100-80GB",
                  "--config", str(config)])
    assert seen[-1].on_shutdown == "stop"  # a config file may still choose "stop"
    # The embedded scheduler (Jupyter's default): processes never outlive the server.
    assert original(tmp_path / "c").service_config().on_shutdown == "stop"
    assert ServiceConfig(state_dir=tmp_path / "d").on_shutdown == "stop"
