"""The reclaim story end to end, through the `gpupool` CLI against a real `gpupool serve`.

Two projects with a guarantee of 2 GPUs each share 4 simulated A100s. A fills
all 4 (2 borrowed); when B submits 2 jobs, two of A's are paused (SIGTERM,
checkpoint), B's run and finish, and A's resume with GPUPOOL_RESUME=1 and
finish from their checkpoints. Every step is done as a user would: real
processes, real files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .servers import ServeProcess, gpupool, wait_until

VICTIM = str(Path(__file__).with_name("victim.py"))
SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 5.0, "min_runtime_s": 0.5, "resume_backoff_s": 0.0,
            "on_shutdown": "stop", "history_interval_s": 1.0}
STEPS = 150


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


@pytest.fixture
def serve(tmp_path):
    srv = ServeProcess(tmp_path / "state", tmp_path, settings=SETTINGS).start()
    yield srv
    # Leave nothing running: cancel what is live, then stop the service.
    jobs = json.loads(ok(gpupool(["list", "--json"], srv.env())))
    for job in jobs:
        gpupool(["cancel", job["id"]], srv.env())
    srv.stop()


def jobs_by_id(env) -> dict[str, dict]:
    return {j["id"]: j for j in json.loads(ok(gpupool(["list", "--all", "--json"], env)))}


def test_reclaim_pauses_borrowers_and_they_resume_from_checkpoint(serve, tmp_path):
    admin = serve.env()
    assert "SIMULATED" in ok(gpupool(["status"], admin))
    ok(gpupool(["projects", "set", "A", "--guarantee", "2"], admin))
    ok(gpupool(["projects", "set", "B", "--guarantee", "2"], admin))
    alice = serve.env(ok(gpupool(["tokens", "create", "alice"], admin)).strip())
    bob = serve.env(ok(gpupool(["tokens", "create", "bob"], admin)).strip())
    assert ok(gpupool(["whoami"], alice)).startswith("alice")

    a_jobs = {}
    for i in range(4):
        out = tmp_path / f"a{i}.out"
        line = ok(gpupool(["submit", "--project", "A", "--gpus", "1", "--name", f"a{i}", "--",
                           sys.executable, VICTIM, str(tmp_path / f"a{i}.ckpt"), str(out), str(STEPS)], alice))
        a_jobs[line.split()[0]] = out
    wait_until(lambda: all(j["state"] == "running" for j in jobs_by_id(alice).values()), 60, 0.1,
               "A's four jobs to run")
    listing = ok(gpupool(["list"], alice))
    rows = [line for line in listing.splitlines() if line.startswith("j-")]
    assert len(rows) == 4 and all(" running" in r for r in rows)
    assert sum(" running* " in r for r in rows) == 2  # two run beyond A's guarantee, marked

    b_jobs = [ok(gpupool(["submit", "--project", "B", "--gpus", "1", "--", sys.executable, "-c",
                          "import time; time.sleep(4); print('b done')"], bob)).split()[0] for _ in range(2)]

    def paused_a() -> list[str]:
        jobs = jobs_by_id(alice)
        return [i for i in a_jobs if jobs[i]["state"] == "paused"]

    def two_paused() -> list[str] | None:
        paused = paused_a()
        return paused if len(paused) == 2 else None

    victims = wait_until(two_paused, 60, 0.1, "two of A's jobs to be paused")
    jobs = jobs_by_id(admin)
    assert all(jobs[i]["state"] == "running" for i in a_jobs if i not in victims)
    wait_until(lambda: all(jobs_by_id(bob)[b]["state"] in ("running", "succeeded") for b in b_jobs), 60, 0.1,
               "B's jobs to start")
    wait_until(lambda: all(jobs_by_id(bob)[b]["state"] == "succeeded" for b in b_jobs), 60, 0.1,
               "B's jobs to finish")
    assert "b done" in ok(gpupool(["logs", b_jobs[0]], bob))
    wait_until(lambda: all(jobs_by_id(alice)[i]["state"] == "succeeded" for i in a_jobs), 90, 0.2,
               "A's jobs to finish")

    jobs = jobs_by_id(admin)
    for job_id, out in a_jobs.items():
        result = json.loads(out.read_text())
        assert result["steps"] == STEPS
        starts = result["starts"]
        if job_id in victims:
            assert jobs[job_id]["attempts"] == 2
            assert [s["resume"] for s in starts] == [False, True]
            assert starts[1]["step"] > 0  # resumed from the checkpoint, not from scratch
            assert starts[1]["attempt"] == "2"
            log = ok(gpupool(["logs", job_id], alice))
            assert "paused: checkpoint at step" in log and f"starts at step {starts[1]['step']}" in log
        else:
            assert jobs[job_id]["attempts"] == 1 and len(starts) == 1
    described = ok(gpupool(["describe", next(iter(victims))], alice))
    assert "succeeded" in described and "attempts:         2" in described

    # The event stream told the story too.
    events = [json.loads(line) for line in ok(gpupool(["events", "--json"], admin)).splitlines()]
    paused_events = {e["job_id"] for e in events if e.get("type") == "job" and e.get("state") == "paused"}
    assert set(victims) <= paused_events
    assert any(victims[0] in line and "paused" in line for line in ok(gpupool(["events"], admin)).splitlines())
