"""What the service itself says and shows, through the real core (issue 22, item 13).

Each test runs the real :class:`SchedulerCore` on simulated GPUs and checks
what a user reads: the event log's words, a job's wire form, a project's
fair-share standing.
"""

from __future__ import annotations

from tests.service.helpers import ADMIN, ALICE, PY, started, wait_for

SLEEP = [PY, "-c", "import time; time.sleep(60)"]


async def test_the_start_event_counts_gpus_in_words(make_core, tmp_path):
    one = await make_core(simulate="1xA100-80GB", state_dir=tmp_path / "one")
    two = await make_core(simulate="2xA100-80GB", state_dir=tmp_path / "two")
    said = {}
    for name, core in (("one", one), ("two", two)):
        said[name] = [e["reason"] for e in core.events_since(0) if e["type"] == "pool"]
    assert said["one"] == ["scheduler started with 1 simulated GPU"], said
    assert said["two"] == ["scheduler started with 2 simulated GPUs"], said


async def test_a_running_jobs_reason_follows_its_preemptible_flag(make_core):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    first, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": SLEEP})
    assert (await started(core, first["id"]))["state"] == "running"
    second, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": SLEEP})
    job = await started(core, second["id"])
    assert job["preemptible"] is True and " as preemptible: " in job["reason"], job

    await core.cancel(ALICE, first["id"])  # the second job is now the one within the guarantee
    job = await wait_for(lambda: (j := core.get_job(ALICE, second["id"]))["preemptible"] is False and j,
                         what="the flag cleared")
    assert "preemptible:" not in job["reason"], job["reason"]
    assert job["reason"] == ("runs on testhost within project vision's guarantee of 1 GPU (the project runs 1 GPU "
                             "of training); no longer preemptible"), job["reason"]

    core.set_project(ADMIN, "vision", {"train_guarantee": 0})  # and back: beyond a guarantee of 0
    job = await wait_for(lambda: (j := core.get_job(ALICE, second["id"]))["preemptible"] is True and j,
                         what="the flag set again")
    assert job["reason"] == ("runs on testhost as preemptible: project vision runs 1 GPU of training, over its "
                             "guarantee of 0 GPUs; this job is beyond the guarantee and may be paused to make room"), job["reason"]
    await core.cancel(ALICE, second["id"])


async def test_a_job_that_is_not_running_shows_where_it_last_ran(make_core, tmp_path):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    done, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": [PY, "-c", "pass"]})
    job = await wait_for(lambda: (j := core.get_job(ALICE, done["id"]))["state"] == "succeeded" and j,
                         what="the job finished")
    assert job["assignment"] is None
    ran = job["ran_on"]
    assert ran["node"] == "testhost" and [(g["index"], g["milli"]) for g in ran["gpus"]] == [(0, 1000)], job
    usage = {p["name"]: p["usage"] for p in core.list_projects()}["vision"]
    assert usage["train"] == 0  # what it ran on is shown, not counted as held

    held, _ = await core.submit(ALICE, {"project": "vision", "gpus": 2, "command": SLEEP})
    running = await started(core, held["id"])
    assert running["ran_on"] is None and running["assignment"]["node"] == "testhost"  # running: its assignment
    await core.pause(ALICE, held["id"])
    paused = await wait_for(lambda: (j := core.get_job(ALICE, held["id"]))["state"] == "paused" and j,
                            what="the job paused")
    assert paused["assignment"] is None
    assert sorted(g["index"] for g in paused["ran_on"]["gpus"]) == [0, 1], paused
    assert {p["name"]: p["usage"] for p in core.list_projects()}["vision"]["train"] == 0
    await core.cancel(ALICE, held["id"])  # cancelled while paused: it still last ran on GPUs 0 and 1
    assert sorted(g["index"] for g in core.get_job(ALICE, held["id"])["ran_on"]["gpus"]) == [0, 1]
    await core.stop()
    again = await make_core(simulate="2xA100-80GB")  # kept in the store across a restart
    assert again.get_job(ALICE, done["id"])["ran_on"] == ran


async def test_a_project_running_beyond_its_guarantee_reads_so_in_its_fair_share_at_once(make_core):
    core = await make_core(simulate="4xA100-80GB")  # the default 7-day half-life, and no history yet
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    core.set_project(ADMIN, "nlp", {"train_guarantee": 0})
    core.set_project(ADMIN, "empty", {"train_guarantee": 0, "train_limit": 0})  # a share of 0
    jobs = [(await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": SLEEP}))[0] for _ in range(3)]
    for job in jobs:
        assert (await started(core, job["id"]))["state"] == "running"
    fair = {p["name"]: p["fair_share"] for p in core.list_projects()}
    # vision's long-run share: its guarantee of 1, then half of the 3 other GPUs (nlp has the same weight)
    assert fair["vision"]["gpus"] == 2.5 and fair["vision"]["recent_gpus"] == 0.0
    assert fair["vision"]["percent"] == 120, fair  # 3 GPUs now on a share of 2.5, as the policy ranks it; was 0
    assert fair["nlp"]["percent"] == 0
    assert fair["empty"]["gpus"] == 0.0 and fair["empty"]["percent"] is None
    await wait_for(lambda: (core.registry.get_sample_value("gpupool_project_fair_share_used_ratio",
                                                           {"project": "vision"}) or 0) > 1.19,
                   what="the used-share gauge agreeing with the percentage")
    for job in jobs:
        await core.cancel(ALICE, job["id"])
    fair = {p["name"]: p["fair_share"] for p in core.list_projects()}["vision"]
    assert fair["percent"] == 0  # nothing runs now, and a few seconds of 3 GPUs is nothing over 7 days
