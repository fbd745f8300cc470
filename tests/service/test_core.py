"""SchedulerCore end to end on simulated GPUs with real processes."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from gpupool.wire.errors import Conflict, Forbidden, InvalidRequest, NotFound, QuotaExceeded
from tests.service.helpers import ADMIN, ALICE, BOB, CHECKPOINTING_JOB, PY, SLOW_TO_STOP, started, wait_for


def _state(core, job_id):
    return core.get_job(ADMIN, job_id)["state"]


async def test_job_runs_with_gpu_environment_and_log(make_core, tmp_path):
    core = await make_core()
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    code = ("import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_SIMULATED'], "
            "os.environ['X'], flush=True); time.sleep(1)")
    job, created = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": [PY, "-c", code],
                                             "env": {"X": "extra"}})
    assert created and job["state"] == "queued" and job["user"] == "alice"  # the next cycle decides it
    job = await started(core, job["id"])
    assert job["state"] == "running"
    gpu = job["assignment"]["gpus"][0]
    assert gpu["milli"] == 1000 and gpu["memory_limit"] == 80 * 1024**3
    await wait_for(lambda: _state(core, job["id"]) == "succeeded", what="job success")
    done = core.get_job(ALICE, job["id"])
    assert done["exit_code"] == 0 and done["assignment"] is None and done["finished_at"]
    log = core.read_log(ALICE, job["id"], 0, None)
    assert f"{gpu['id']} 1 extra" in log["data"] and log["eof"]
    assert core.read_log(ALICE, job["id"], log["offset"], None) == {"data": "", "offset": log["offset"], "eof": True}
    assert os.path.isdir(done["workdir"])


async def test_failing_job_is_failed_with_code(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {})
    job, _ = await core.submit(ALICE, {"project": "p", "command": [PY, "-c", "raise SystemExit(7)"]})
    await wait_for(lambda: _state(core, job["id"]) == "failed")
    j = core.get_job(ALICE, job["id"])
    assert j["exit_code"] == 7 and "7" in j["reason"]


async def test_reclaim_pauses_victim_which_resumes_from_checkpoint(make_core, tmp_path):
    core = await make_core()
    core.set_project(ADMIN, "research", {"train_guarantee": 0})
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    wd = tmp_path / "victim"
    wd.mkdir()
    victim, _ = await core.submit(BOB, {"project": "research", "gpus": 2, "workdir": str(wd),
                                        "command": [PY, "-c", CHECKPOINTING_JOB, "60", "0.05"]})
    victim = await started(core, victim["id"])
    assert victim["state"] == "running" and victim["preemptible"]
    await wait_for(lambda: (wd / "ckpt.txt").exists() and int((wd / "ckpt.txt").read_text() or 0) >= 3)
    owner, _ = await core.submit(ALICE, {"project": "vision", "gpus": 2,
                                         "command": [PY, "-c", "import time; time.sleep(0.5)"]})
    await wait_for(lambda: _state(core, victim["id"]) == "paused", what="victim paused")
    paused = core.get_job(BOB, victim["id"])
    assert paused["attempts"] == 1 and paused["assignment"] is None
    await wait_for(lambda: _state(core, owner["id"]) in ("running", "succeeded"), what="owner started")
    await wait_for(lambda: _state(core, owner["id"]) == "succeeded", what="owner done")
    await wait_for(lambda: _state(core, victim["id"]) == "succeeded", timeout=60, what="victim done")
    starts = [line.split() for line in (wd / "starts.txt").read_text().splitlines()]
    assert starts[0] == ["1", "0", "0"]
    assert starts[1][:2] == ["2", "1"] and int(starts[1][2]) >= 3  # resumed from its checkpoint
    assert len(starts) == 2
    assert "checkpointed at" in core.read_log(BOB, victim["id"])["data"]
    metrics = core.registry.get_sample_value("gpupool_cycle_seconds_count")
    assert metrics and metrics > 0


async def test_user_pause_is_sticky_until_resume(make_core, tmp_path):
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    wd = tmp_path / "w"
    wd.mkdir()
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", CHECKPOINTING_JOB, "40", "0.05"]})
    await wait_for(lambda: (wd / "ckpt.txt").exists())
    paused = await core.pause(ALICE, job["id"])
    assert paused["state"] == "paused" and "alice" in paused["reason"]
    assert (await core.pause(ALICE, job["id"]))["state"] == "paused"  # pausing again is harmless
    core.periodic.tick()  # cycles run; a user pause is not undone by the scheduler
    assert _state(core, job["id"]) == "paused"
    assert core.registry.get_sample_value("gpupool_pauses_total", {"cause": "user"}) == 1
    resumed = await core.resume(ALICE, job["id"])
    assert resumed["state"] == "running" and resumed["attempts"] == 2
    await wait_for(lambda: _state(core, job["id"]) == "succeeded", timeout=60)
    starts = (wd / "starts.txt").read_text().splitlines()
    assert starts[1].startswith("2 1 ")


async def test_cancel_and_finished_job_conflicts(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", "import time; time.sleep(60)"]})
    assert (await started(core, job["id"]))["state"] == "running"
    cancelled = await core.cancel(ALICE, job["id"])
    assert cancelled["state"] == "cancelled" and cancelled["assignment"] is None
    for action in (core.cancel, core.pause, core.resume):
        with pytest.raises(Conflict):
            await action(ALICE, job["id"])
    with pytest.raises(NotFound):
        core.get_job(ALICE, "j-999999")
    with pytest.raises(NotFound):
        await core.pause(ALICE, "nope")


async def test_queued_job_waits_with_reason_and_starts_when_room(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 2})
    first, _ = await core.submit(ALICE, {"project": "p", "gpus": 2, "command": [PY, "-c", "import time; time.sleep(60)"]})
    second, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", "pass"]})
    assert (await started(core, first["id"]))["state"] == "running"
    second = core.get_job(ALICE, second["id"])
    assert second["state"] == "queued" and second["reason"] != "queued"  # the cycle said why it waits
    assert core.status()["queue"] == {"pending": 1, "running": 1, "paused": 0}
    await core.cancel(ALICE, first["id"])
    await wait_for(lambda: _state(core, second["id"]) == "succeeded")


BAD_SPECS = [
    ({"project": "nope", "command": ["x"]}, "unknown project"),
    ({"project": "p", "gpus": 1, "gpu_fraction": 0.5, "command": ["x"]}, "at most one"),
    ({"project": "p", "gpu_fraction": 0, "command": ["x"]}, "between 0 and 1"),
    ({"project": "p", "gpu_fraction": 1.0, "command": ["x"]}, "between 0 and 1"),
    ({"project": "p", "gpu_fraction": "half", "command": ["x"]}, "number"),
    ({"project": "p", "gpus": 3, "command": ["x"]}, "more than any node"),
    ({"project": "p", "gpus": -1, "command": ["x"]}, "at least 1"),
    ({"project": "p", "gpus": 1.5, "command": ["x"]}, "whole number"),
    ({"project": "p", "gpus": True, "command": ["x"]}, "whole number"),
    ({"project": "p", "gpu_model": "B9000", "gpus": 1, "command": ["x"]}, "unknown GPU model"),
    ({"project": "p", "gpu_memory": 10**15, "command": ["x"]}, "more than any GPU"),
    ({"project": "p"}, "command is required"),
    ({"project": "p", "command": "python x.py"}, "list of strings"),
    ({"project": "p", "kind": "build", "command": ["x"]}, "no command"),
    ({"project": "p", "kind": "serve", "command": ["x"]}, "kind"),
    ({"project": "p", "command": ["x"], "gpu": 1}, "unknown field ('gpu' was unexpected)"),
    ({"project": "p", "command": ["x"], "workdir": "relative/dir"}, "absolute"),
    ({"project": "p", "command": ["x"], "env": {"BAD KEY": "v"}}, "env must map variable names"),
    ({"project": "p", "command": ["x"], "priority": "high"}, "priority"),
    ({"project": "p", "command": ["x"], "cpu": 10**6}, "cpu must be a positive number of cores (at most 100000)"),
    ({"project": "p", "command": ["x"], "cpu": 10**4}, "more than this machine"),
    ("not a dict", "JSON object"),
]


@pytest.mark.parametrize("spec,words", BAD_SPECS)
async def test_bad_specs_change_nothing(make_core, spec, words):
    core = await make_core()
    core.set_project(ADMIN, "p", {"build_quota": 1})
    before = core.last_event_seq
    with pytest.raises(InvalidRequest) as e:
        await core.submit(ALICE, spec)
    assert words in e.value.message and e.value.status == 400
    assert core.list_jobs(ADMIN, {}) == [] and core.last_event_seq == before


async def test_build_quota_rejection_names_project_quota_and_holders(make_core):
    core = await make_core()
    core.set_project(ADMIN, "vision", {"build_quota": 1})
    a, _ = await core.submit(ALICE, {"project": "vision", "kind": "build", "gpu_fraction": 0.5,
                                     "labels": {"notebook": "exp/a.ipynb", "kernel_id": "k-123"}})
    assert a["state"] == "running" and a["env"]["GPUPOOL_GPU_FRACTION"] == "0.5"
    assert core.read_log(ALICE, a["id"], 0, None) == {"data": "", "offset": 0, "eof": True}  # no process, no log
    assert a["env"]["CUDA_VISIBLE_DEVICES"] == a["assignment"]["gpus"][0]["id"]
    assert "env" not in core.get_job(BOB, a["id"])  # only the owner/admin sees what the kernel runs with
    b, _ = await core.submit(BOB, {"project": "vision", "kind": "build", "gpu_fraction": 0.25})
    with pytest.raises(QuotaExceeded) as e:
        await core.submit(ALICE, {"project": "vision", "kind": "build", "gpu_fraction": 0.5})
    msg = e.value.message
    assert msg == (f"asked for ½ GPU; project 'vision' holds ¾ GPU of its build quota of 1 GPU "
                   f"(exp/a.ipynb ½ (alice, kernel k-123, {a['id']}); {b['id']} ¼ (bob)); ¼ GPU free")
    assert e.value.status == 409 and e.value.held_milli == 750
    await core.cancel(ALICE, a["id"])  # releases the share at once
    c, _ = await core.submit(ALICE, {"project": "vision", "kind": "build", "gpu_fraction": 0.5})
    assert c["state"] == "running"
    with pytest.raises(QuotaExceeded, match="asked for 0.1 GPU; project 'empty' has a build quota of only 0 GPUs") as e:
        core.set_project(ADMIN, "empty", {})
        await core.submit(ALICE, {"project": "empty", "kind": "build", "gpu_fraction": 0.1})
    assert e.value.held_milli == 0  # nothing held: the request alone is too big


async def test_build_lease_expires_unless_renewed(make_core):
    core = await make_core(lease_s=0.4)
    core.set_project(ADMIN, "p", {"build_quota": 1})
    a, _ = await core.submit(ALICE, {"project": "p", "kind": "build", "gpu_fraction": 0.5})
    b, _ = await core.submit(ALICE, {"project": "p", "kind": "build", "gpu_fraction": 0.5})
    for _ in range(6):
        core.renew(ALICE, b["id"])
        await asyncio.sleep(0.15)
    assert _state(core, a["id"]) == "cancelled" and "lease expired" in core.get_job(ALICE, a["id"])["reason"]
    assert _state(core, b["id"]) == "running"
    with pytest.raises(Conflict):
        core.renew(ALICE, a["id"])


async def test_client_key_is_idempotent_per_user(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {"build_quota": 2})
    spec = {"project": "p", "kind": "build", "gpu_fraction": 0.5, "client_key": "kernel-1"}
    first, created = await core.submit(ALICE, spec)
    again, created2 = await core.submit(ALICE, spec)
    assert created and not created2 and again["id"] == first["id"]
    other, created3 = await core.submit(BOB, spec)
    assert created3 and other["id"] != first["id"]
    await core.cancel(ALICE, first["id"])
    fresh, created4 = await core.submit(ALICE, spec)  # the old one is no longer live
    assert created4 and fresh["id"] != first["id"]


async def test_authorization(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {})
    job, _ = await core.submit(ALICE, {"project": "p", "command": [PY, "-c", "import time; time.sleep(60)"]})
    for action in (core.pause, core.resume, core.cancel):
        with pytest.raises(Forbidden):
            await action(BOB, job["id"])
    with pytest.raises(Forbidden):
        core.read_log(BOB, job["id"], 0, None)
    with pytest.raises(Forbidden):
        core.set_project(ALICE, "q", {})
    with pytest.raises(Forbidden):
        core.delete_project(ALICE, "p")
    with pytest.raises(Forbidden):
        core.create_token(ALICE, "carol")
    assert core.get_job(BOB, job["id"])["id"] == job["id"]  # reading is open to all users
    assert (await core.cancel(ADMIN, job["id"]))["state"] == "cancelled"  # admin may act on anyone's job


async def test_tokens(make_core, tmp_path):
    core = await make_core(admin_token=None, state_dir=tmp_path / "s2")
    path = tmp_path / "s2" / "admin_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert core.authenticate(path.read_text().strip()) == ADMIN
    made = core.create_token(ADMIN, "carol")
    assert core.authenticate(made["token"]).user == "carol"
    assert not core.authenticate(made["token"]).admin
    assert core.authenticate("wrong") is None and core.authenticate("") is None and core.authenticate(None) is None
    with pytest.raises(InvalidRequest):
        core.create_token(ADMIN, "bad name/with slash")
    with pytest.raises(InvalidRequest, match="admin"):
        core.create_token(ADMIN, "admin")
    # Only the hash is stored.
    db = (tmp_path / "s2" / "state.db").read_bytes()
    assert made["token"].encode() not in db


async def test_projects_crud_and_usage(make_core):
    core = await make_core()
    p = core.set_project(ADMIN, "vision", {"build_quota": 1.5, "train_guarantee": 1, "train_limit": None, "weight": 2})
    assert p["build_quota"] == 1.5 and p["train_guarantee"] == 1 and p["weight"] == 2
    for bad in ({"build_quota": -1}, {"build_quota": 99}, {"weight": 0}, {"quota": 1}, {"train_limit": "x"}):
        with pytest.raises(InvalidRequest):
            core.set_project(ADMIN, "vision", bad)
    with pytest.raises(InvalidRequest):
        core.set_project(ADMIN, "bad/name", {})
    job, _ = await core.submit(ALICE, {"project": "vision", "gpus": 2, "command": [PY, "-c", "import time; time.sleep(60)"]})
    await started(core, job["id"])
    proj = next(x for x in core.list_projects() if x["name"] == "vision")
    assert proj["usage"] == {"build": 0, "train": 2, "train_over_quota": 1}
    with pytest.raises(Conflict):
        core.delete_project(ADMIN, "vision")
    await core.cancel(ALICE, job["id"])
    core.delete_project(ADMIN, "vision")
    assert core.list_projects() == []
    with pytest.raises(NotFound):
        core.delete_project(ADMIN, "vision")


async def test_pool_events_history(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {"build_quota": 1})
    seq = core.last_event_seq
    job, _ = await core.submit(ALICE, {"project": "p", "kind": "build", "gpu_fraction": 0.25})
    events = await core.wait_events(seq, 1.0)
    assert events and events[0]["seq"] == seq + 1
    assert any(e["type"] == "job" and e["job_id"] == job["id"] and e["state"] == "running" for e in events)
    assert await core.wait_events(core.last_event_seq, 0.1) == []
    pool = core.pool()
    assert pool["simulated"] is True and pool["nodes"][0]["name"] == "testhost"
    gpu = next(g for g in pool["nodes"][0]["gpus"] if g["allocations"])
    assert gpu["allocated"] == 0.25 and gpu["allocations"][0]["job_id"] == job["id"]
    assert gpu["model"] == "A100-80GB" and gpu["memory"] == 80 * 1024**3
    await wait_for(lambda: any(s["projects"].get("p") == 250 for s in core.history(None)["samples"]), what="history")
    sample = core.history(None)["samples"][-1]
    assert sample["gpus"][gpu["id"]]["milli"] == 250
    assert core.history(sample["t"])["samples"] == []
    assert core.registry.get_sample_value("gpupool_gpu_share_allocated", {"gpu": gpu["id"]}) == 0.25
    filtered = core.list_jobs(ALICE, {"state": "running,queued", "kind": "build", "project": "p"})
    assert [j["id"] for j in filtered] == [job["id"]]
    with pytest.raises(InvalidRequest):
        core.list_jobs(ALICE, {"state": "nonsense"})


async def test_build_only_split(make_core):
    core = await make_core(simulate="4xT4", build_gpus=1)
    nodes = core.pool()["nodes"]
    assert [(n["name"], n["pools"], len(n["gpus"])) for n in nodes] == [
        ("testhost-build", ["build"], 1), ("testhost", ["train"], 3)]
    core.set_project(ADMIN, "p", {"build_quota": 2})
    with pytest.raises(InvalidRequest, match="more than any node of the build pool"):
        await core.submit(ALICE, {"project": "p", "kind": "build", "gpus": 2})


async def test_one_reclaim_preempts_one_victim_during_the_grace(make_core, tmp_path):
    core = await make_core(pause_grace_s=5.0)
    core.set_project(ADMIN, "research", {"train_guarantee": 0})
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    victims = []
    for i in range(2):
        wd = tmp_path / f"v{i}"
        wd.mkdir()
        v, _ = await core.submit(BOB, {"project": "research", "gpus": 1, "workdir": str(wd),
                                       "command": [PY, "-c", SLOW_TO_STOP, "1.0"]})
        victims.append(v["id"])
    await wait_for(lambda: all((tmp_path / f"v{i}" / "ready").exists() for i in range(2)))
    owner, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1,
                                         "command": [PY, "-c", "import time; time.sleep(2)"]})
    assert owner["state"] == "queued"  # the victim's GPU is not handed out before it is released
    for _ in range(5):  # several cycles while the victim takes its time to stop
        core.periodic.tick()
        await asyncio.sleep(0.1)
    await wait_for(lambda: _state(core, owner["id"]) == "running", what="owner running")
    assert sorted(_state(core, v) for v in victims) == ["paused", "running"]


async def test_expensive_cycles_are_coalesced_for_train_bursts(tmp_path):
    import time as _time

    from gpupool.app.backend import build_core
    from gpupool.service import fallback_policy
    from tests.service.helpers import fast_config

    calls = []

    def slow_policy(snapshot):
        calls.append(len(snapshot.workloads))
        _time.sleep(0.03)  # an expensive cycle, as with a very long queue
        return fallback_policy.schedule(snapshot)

    core = build_core(fast_config(tmp_path / "s", cycle_min_interval_s=0.5, tick_s=60), policy=slow_policy)
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 2})
        before = len(calls)
        jobs = [(await core.submit(ALICE, {"project": "p", "command": [PY, "-c", "pass"]}))[0] for _ in range(10)]
        assert len(calls) - before < 10  # the burst shared cycles
        await wait_for(lambda: all(_state(core, j["id"]) == "succeeded" for j in jobs), what="burst done")
        await core.submit(ALICE, {"project": "p", "command": [PY, "-c", "pass"]})  # a cycle just ran...
        b, _ = await core.submit(ALICE, {"project": "p", "kind": "build"})
        assert b["state"] == "running"  # ...but a build share is decided at once all the same
    finally:
        await core.stop()


async def test_a_lower_busy_share_runs_fewer_cycles_for_a_steady_stream_of_submits(tmp_path):
    """cycle_busy_share: the most of its time a busy service spends on cycles (fewer, larger ones when lower)."""
    import time as _time

    from gpupool.app.backend import build_core
    from gpupool.service import fallback_policy
    from gpupool.service.config import ServiceConfig
    from tests.service.helpers import fast_config

    async def cycles_for_stream(share: float) -> int:
        calls = []

        def slow_policy(snapshot):
            calls.append(len(snapshot.workloads))
            _time.sleep(0.04)  # a cycle over a big cluster's jobs
            return fallback_policy.schedule(snapshot)

        core = build_core(fast_config(tmp_path / f"s{share}", cycle_min_interval_s=0.001, tick_s=60,
                                      cycle_busy_share=share), policy=slow_policy)
        await core.start()
        try:
            core.set_project(ADMIN, "p", {"train_guarantee": 2})
            before = len(calls)
            for _ in range(30):  # a job every 20 ms, as pods arrive on a busy cluster
                await core.submit(ALICE, {"project": "p", "command": [PY, "-c", "import time; time.sleep(60)"]})
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # the last deferred cycle
            return len(calls) - before
        finally:
            await core.stop()

    every, tenth = await cycles_for_stream(1.0), await cycles_for_stream(0.1)
    assert tenth >= 1 and tenth * 3 < every, (tenth, every)
    for bad in (0, 1.5, -0.2):
        with pytest.raises(InvalidRequest, match="cycle_busy_share must be > 0 and <= 1"):
            ServiceConfig(state_dir=tmp_path, cycle_busy_share=bad)


async def test_memory_request_and_model_choice(make_core):
    core = await make_core(simulate="1xA100-80GB,1xT4")
    core.set_project(ADMIN, "p", {"build_quota": 2})
    want = 8 * 1024**3
    job, _ = await core.submit(ALICE, {"project": "p", "kind": "build", "gpu_memory": want, "gpu_model": "t4"})
    assert job["state"] == "running"
    (gpu,) = job["assignment"]["gpus"]
    assert gpu["model"] == "T4" and gpu["memory_limit"] == want and gpu["milli"] == 500  # 8 of 16 GiB
    assert job["env"]["GPUPOOL_GPU_MEMORY_LIMIT"] == str(want)
    assert job["request"]["gpu_model"] == "T4"


async def test_build_share_freed_by_a_stopping_job_is_granted_in_the_submit_reply(make_core, tmp_path):
    core = await make_core(pause_grace_s=5.0, reply_wait_s=4.0)
    core.set_project(ADMIN, "research", {"train_guarantee": 0})
    core.set_project(ADMIN, "vision", {"build_quota": 2})
    wd = tmp_path / "w"
    wd.mkdir()
    train, _ = await core.submit(BOB, {"project": "research", "gpus": 2, "workdir": str(wd),
                                       "command": [PY, "-c", SLOW_TO_STOP, "1.0"]})
    await wait_for(lambda: (wd / "ready").exists())
    cancelling = asyncio.create_task(core.cancel(BOB, train["id"]))  # takes ~1 s to stop
    await asyncio.sleep(0.1)
    kernel, _ = await core.submit(ALICE, {"project": "vision", "kind": "build", "gpus": 1})
    assert kernel["state"] == "running" and kernel["env"]["CUDA_VISIBLE_DEVICES"]
    assert (await cancelling)["state"] == "cancelled"


IGNORES_SIGTERM = r"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("ready", "w").close()
time.sleep(120)
"""


async def test_work_goes_to_a_free_gpu_not_to_one_a_stopping_job_still_holds(make_core, tmp_path):
    core = await make_core(pause_grace_s=30.0, reply_wait_s=0.1)
    await _free_gpu_not_the_stopping_jobs(core, tmp_path)


async def test_first_fit_start_on_a_stopping_jobs_gpu_is_placed_again_around_it(tmp_path):
    """First fit always picks the first GPU: the one the stopping job holds, in the view without it."""
    from gpupool.app.backend import build_core
    from gpupool.service import fallback_policy
    from gpupool.service.core import STOPPING_PROJECT
    from tests.service.helpers import fast_config

    held_views = []

    def first_fit(snapshot):
        if any(w.project == STOPPING_PROJECT for w in snapshot.workloads):
            held_views.append(snapshot)
        return fallback_policy.schedule(snapshot)

    core = build_core(fast_config(tmp_path / "s", pause_grace_s=30.0, reply_wait_s=0.1), policy=first_fit)
    await core.start()
    try:
        await _free_gpu_not_the_stopping_jobs(core, tmp_path)
    finally:
        await core.stop()
    assert held_views  # the second view was asked for, and only in cycles where a start collided
    assert all(sum(w.project == STOPPING_PROJECT for w in v.workloads) == 1 for v in held_views)


async def _free_gpu_not_the_stopping_jobs(core, tmp_path) -> None:
    core.set_project(ADMIN, "p", {"train_guarantee": 2})
    wd = tmp_path / "w"
    wd.mkdir()
    slow, _ = await core.submit(BOB, {"project": "p", "gpus": 1, "workdir": str(wd),
                                      "command": [PY, "-c", IGNORES_SIGTERM]})
    await wait_for(lambda: (wd / "ready").exists())
    held = core.get_job(ADMIN, slow["id"])["assignment"]["gpus"][0]["id"]
    try:
        stopping = await core.pause(BOB, slow["id"])
        assert stopping["state"] == "running"  # it ignores SIGTERM: stopping until the grace ends
        job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", "import time; time.sleep(30)"]})
        await wait_for(lambda: _state(core, job["id"]) == "running", timeout=10, what="the job on the free GPU")
        got = core.get_job(ADMIN, job["id"])["assignment"]["gpus"][0]["id"]
        assert got != held
        assert _state(core, slow["id"]) == "running"  # still stopping: its GPU was never handed out twice
        await core.cancel(ALICE, job["id"])
    finally:
        handle = core.attempts.procs.get(slow["id"])
        if handle is not None:
            core.executor.signal_group(handle, 9)  # end the grace now: the test need not wait 30 s
    await wait_for(lambda: _state(core, slow["id"]) == "paused", what="the slow job paused")


async def test_a_burst_of_train_submits_shares_one_cycle(tmp_path):
    from gpupool.app.backend import build_core
    from gpupool.service import fallback_policy
    from tests.service.helpers import fast_config

    calls = []

    def counting_policy(snapshot):
        calls.append(sum(1 for w in snapshot.workloads if w.assignment is None))
        return fallback_policy.schedule(snapshot)

    core = build_core(fast_config(tmp_path / "s", tick_s=60), policy=counting_policy)
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 2})
        before = len(calls)
        spec = {"project": "p", "gpus": 1, "command": [PY, "-c", "import time; time.sleep(30)"]}
        jobs = await asyncio.gather(*(core.submit(ALICE, spec) for _ in range(20)))
        assert all(j["state"] == "queued" for j, _ in jobs)  # stored and answered, not yet decided
        await wait_for(lambda: not core.cycle_pending, what="the deferred cycle")
        assert calls[before:] == [20]  # one policy run saw the whole burst
        states = sorted(_state(core, j["id"]) for j, _ in jobs)
        assert states == ["queued"] * 18 + ["running"] * 2
        # Durable before the reply: a second store handle sees every job.
        from gpupool.service.store import Store
        other = Store(core.config.database)
        try:
            assert len(other.jobs(("queued", "running"))) == 20
        finally:
            other.close()
    finally:
        await core.stop()


async def test_cancel_right_after_resume_stops_the_new_attempt(make_core):
    core = await make_core(pause_grace_s=2.0)
    core.set_project(ADMIN, "p", {"train_guarantee": 2})
    for _ in range(4):
        job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", "import time; time.sleep(60)"]})
        await started(core, job["id"])
        assert (await core.pause(ALICE, job["id"]))["state"] == "paused"
        assert (await core.resume(ALICE, job["id"]))["state"] == "running"  # attempt 2, while attempt 1's stop winds down
        assert (await core.cancel(ALICE, job["id"]))["state"] == "cancelled"
        assert not core.attempts.procs


async def test_event_log_is_trimmed_in_batches_and_keeps_the_newest(make_core):
    """The event table stays near events_max_rows: a tick trims it once a tenth of the limit has come since."""
    core = await make_core(events_max_rows=40)

    def oldest() -> int:
        return core.book.store.events_since(0, limit=10_000)[0]["seq"]

    for i in range(60):
        core.book.emit("test", i=i)
    last = core.last_event_seq
    core.periodic.tick()
    kept = [e["seq"] for e in core.book.store.events_since(0, limit=10_000) if e["seq"] <= last]
    assert len(kept) == 40 and kept[-1] == last  # the newest 40 of those, none lost in between
    trimmed_from = oldest()
    for i in range(3):  # fewer than a tenth of the limit: the next tick writes nothing
        core.book.emit("test", i=i)
    core.periodic.tick()
    assert oldest() == trimmed_from
    for i in range(5):
        core.book.emit("test", i=i)
    core.periodic.tick()
    assert oldest() > trimmed_from
