"""EmbeddedScheduler in the test's own asyncio loop, as the Jupyter extension uses it."""

from __future__ import annotations

import asyncio
import stat
import sys

import pytest

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from gpupool.wire.errors import InvalidRequest

FAST = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 2.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0}


async def wait_state(client: AsyncGpupoolClient, job_id: str, state: str, timeout: float = 30) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        job = await client.job(job_id)
        if job["state"] == state:
            return job
        assert asyncio.get_running_loop().time() < deadline, f"{job_id} stuck in {job['state']}, wanted {state}"
        await asyncio.sleep(0.05)


async def wait_log(client: AsyncGpupoolClient, job_id: str, text: str, timeout: float = 30) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        log = (await client.logs(job_id))["data"]
        if text in log:
            return log
        assert asyncio.get_running_loop().time() < deadline, f"{text!r} not in the log of {job_id}: {log}"
        await asyncio.sleep(0.05)


async def test_start_creates_projects_and_serves_http(tmp_path):
    sched = EmbeddedScheduler(tmp_path / "state", simulate="2xA100-80GB",
                              projects={"me": {"build_quota": 1, "train_guarantee": 1}}, config=FAST)
    await sched.start()
    try:
        assert sched.url.startswith("http://127.0.0.1:") and sched.core is not None
        token_file = tmp_path / "state" / "admin_token"
        assert sched.admin_token == token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        client = AsyncGpupoolClient(sched.url, sched.admin_token)
        assert (await client.whoami())["admin"] is True
        projects = {p["name"]: p for p in await client.projects()}
        assert projects["me"]["build_quota"] == 1 and projects["me"]["train_guarantee"] == 1
        status = await client.status()
        assert status["simulated"] is True and len(status["pool"]["nodes"][0]["gpus"]) == 2
        with pytest.raises(InvalidRequest, match="already started"):
            await sched.start()
    finally:
        await sched.stop()
    await sched.stop()  # a second stop is harmless


async def test_existing_projects_are_not_overwritten_and_jobs_resume_after_restart(tmp_path):
    state = tmp_path / "state"
    async with EmbeddedScheduler(state, simulate="2xA100-80GB", projects={"me": {"train_guarantee": 1}},
                                 admin_token="tok", config=FAST) as sched:
        client = AsyncGpupoolClient(sched.url, "tok")
        await client.set_project("me", train_guarantee=2)
        job = await client.submit({"project": "me", "gpus": 1, "command": [
            sys.executable, "-c", "import os, time; print('attempt', os.environ['GPUPOOL_ATTEMPT'], "
            "'resume', os.environ['GPUPOOL_RESUME'], flush=True); time.sleep(60)"]})
        await wait_state(client, job["id"], "running")
        await wait_log(client, job["id"], "attempt 1 resume 0")
        events = await client.events(since=0, timeout=1)
        assert events["events"] and events["last"] >= events["events"][-1]["seq"]
    # Stopping the embedded scheduler pauses the job; the next start resumes it.
    async with EmbeddedScheduler(state, simulate="2xA100-80GB", projects={"me": {"train_guarantee": 1}},
                                 admin_token="tok", config=FAST) as sched:
        client = AsyncGpupoolClient(sched.url, "tok")
        assert {p["name"]: p for p in await client.projects()}["me"]["train_guarantee"] == 2
        resumed = await wait_state(client, job["id"], "running")
        assert resumed["attempts"] == 2
        log = await wait_log(client, job["id"], "attempt 2 resume 1")
        assert "attempt 1 resume 0" in log
        await client.cancel(job["id"])
        await wait_state(client, job["id"], "cancelled")


async def test_bad_config_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidRequest, match="unknown service setting"):
        await EmbeddedScheduler(tmp_path / "s", config={"tick": 1}).start()


async def test_stop_ends_open_streams_and_long_polls(tmp_path):
    sched = EmbeddedScheduler(tmp_path / "state", simulate="1xA100-80GB", admin_token="tok", config=FAST)
    await sched.start()
    port = int(sched.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
                 b"Authorization: token tok\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert b"200 OK" in head and b"text/event-stream" in head
    client = AsyncGpupoolClient(sched.url, "tok")
    last = (await client.events(since=0))["last"]
    poll = asyncio.ensure_future(client.events(since=last, timeout=50))
    await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await sched.stop()
    assert loop.time() - t0 < 4.5  # neither the stream nor the long-poll held the stop for its 5 s limit
    rest = await asyncio.wait_for(reader.read(), 5)  # the stream ended (EOF), not left hanging
    assert isinstance(rest, bytes)
    reply = await asyncio.wait_for(poll, 5)
    assert reply["events"] == [] or all(e["seq"] > last for e in reply["events"])
    writer.close()


async def test_runtime_file_is_private_names_the_scheduler_and_goes_on_stop(tmp_path, monkeypatch):
    """What `gpupool` reads to find a scheduler on a random port: 0600 in a 0700 dir, gone after a clean stop."""
    import json

    from gpupool.client import runtime_file

    runtime = tmp_path / "runtime"
    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(runtime))
    sched = EmbeddedScheduler(tmp_path / "state", simulate="1xA100-80GB", config=FAST)
    await sched.start()
    try:
        files = list(runtime.iterdir())
        assert [str(f) for f in files] == [sched.runtime_path]
        assert stat.S_IMODE(files[0].stat().st_mode) == 0o600 and stat.S_IMODE(runtime.stat().st_mode) == 0o700
        info = json.loads(files[0].read_text())
        assert info["url"] == sched.url and info["token"] == sched.admin_token and info["pid"] > 0
        assert runtime_file.newest()["url"] == sched.url
        user_token = (await AsyncGpupoolClient(sched.url, sched.admin_token).create_token("erin"))["token"]
        sched.publish_token(user_token, user="erin")  # what the Jupyter extension does for its user
        assert json.loads(files[0].read_text())["token"] == user_token and len(list(runtime.iterdir())) == 1
    finally:
        await sched.stop()
    assert list(runtime.iterdir()) == [] and runtime_file.newest() is None


def test_stale_and_foreign_runtime_files_are_ignored(tmp_path, monkeypatch):
    import json
    import subprocess

    from gpupool.client import runtime_file

    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"scheduler-{dead.pid}-1.json"
    stale.write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "old", "pid": dead.pid, "started": 2.0}))
    (tmp_path / "scheduler-x-2.json").write_text("{not json")
    (tmp_path / "notes.json").write_text(json.dumps({"url": "http://127.0.0.1:3", "pid": 1}))
    assert runtime_file.newest() is None
    assert not stale.exists()  # a dead process's file is cleaned up on the way
    live = runtime_file.write("http://127.0.0.1:4", "t")
    older = tmp_path / "scheduler-1-5.json"  # pid 1 is alive; started earlier than ours
    older.write_text(json.dumps({"url": "http://127.0.0.1:5", "token": "u", "pid": 1, "started": 1.0}))
    assert [i["url"] for i in runtime_file.running()] == ["http://127.0.0.1:4", "http://127.0.0.1:5"]
    runtime_file.remove(live)
    assert runtime_file.newest()["url"] == "http://127.0.0.1:5"
