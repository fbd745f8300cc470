"""Each project's recent GPU use, decayed by a half-life (issue 16's successor, issue 15, step 1)."""

from __future__ import annotations

import asyncio
import math

import pytest

from gpupool.service.usage import DecayedUsage, gpu_hours
from tests.service.helpers import ADMIN, ALICE, BOB, PY, started, wait_for


def test_holding_for_one_half_life_then_nothing():
    h = 3600.0
    u = DecayedUsage(h, t=1000.0)
    u.accrue(1000.0 + h, {("a", "train"): 8000})  # 8 GPUs for one half-life
    expected = 8000 * h / math.log(2) * 0.5
    assert u.values[("a", "train")] == pytest.approx(expected)
    assert u.values[("a", "train")] < 8000 * h  # the early part has already decayed somewhat
    u.accrue(1000.0 + 2 * h, {})  # nothing held for another half-life: half of it is left
    assert u.values[("a", "train")] == pytest.approx(expected / 2)
    assert u.at(1000.0 + 3 * h)[("a", "train")] == pytest.approx(expected / 4)
    assert ("b", "train") not in u.values


def test_short_holds_add_up_to_gpu_seconds_and_half_life_zero_keeps_nothing():
    u = DecayedUsage(7 * 86400.0, t=1.0)
    for i in range(10):  # 1 GPU for 10 s, in 1 s steps
        u.accrue(2.0 + i, {("a", "build"): 1000})
    assert gpu_hours(u.values[("a", "build")]) * 3600 == pytest.approx(10.0, rel=1e-3)
    off = DecayedUsage(0.0, {("a", "train"): 5.0}, t=1.0)
    off.accrue(100.0, {("a", "train"): 1000})
    assert off.values == {} and off.at(200.0) == {}
    with pytest.raises(ValueError):
        DecayedUsage(-1.0)


async def test_the_service_counts_what_each_project_held_and_keeps_it_across_a_restart(make_core, tmp_path):
    core = await make_core(simulate="4xA100-80GB")  # room for the share beside the training job
    core.set_project(ADMIN, "a", {"train_guarantee": 2, "build_quota": 1})
    core.set_project(ADMIN, "b", {"train_guarantee": 0})
    job, _ = await core.submit(ALICE, {"project": "a", "gpus": 2, "command": [PY, "-c", "import time; time.sleep(60)"]})
    assert (await started(core, job["id"]))["state"] == "running"
    share, _ = await core.submit(BOB, {"project": "a", "kind": "build", "gpu_fraction": 0.5})
    await asyncio.sleep(1.5)
    await core.cancel(ALICE, job["id"])
    await core.cancel(BOB, share["id"])
    await asyncio.sleep(0.5)  # held nothing meanwhile
    projects = {p["name"]: p["recent_gpu_hours"] for p in core.list_projects()}
    train_s, build_s = projects["a"]["train"] * 3600, projects["a"]["build"] * 3600
    assert 2 * 1.4 <= train_s <= 2 * 3.5  # 2 GPUs for ~1.5 s (plus start and stop)
    assert 0.5 * 1.4 <= build_s <= 0.5 * 3.5
    assert projects["b"] == {"build": 0, "train": 0}
    assert core.status(ADMIN)["usage_half_life_s"] == 7 * 86400
    await wait_for(lambda: "gpupool_project_recent_gpu_hours" in _metrics(core), what="the gauge")
    await core.stop()
    again = await make_core(simulate="4xA100-80GB")
    kept = {p["name"]: p["recent_gpu_hours"] for p in again.list_projects()}["a"]
    assert kept["train"] * 3600 == pytest.approx(train_s, abs=0.05)  # a week's half-life: no visible decay


async def test_half_life_zero_keeps_no_history(make_core):
    core = await make_core(usage_half_life_s=0)
    core.set_project(ADMIN, "a", {"build_quota": 1})
    await core.submit(ALICE, {"project": "a", "kind": "build", "gpu_fraction": 0.5})
    await asyncio.sleep(0.5)
    assert core.list_projects()[0]["recent_gpu_hours"] == {"build": 0, "train": 0}
    assert core.list_projects()[0]["fair_share"]["percent"] is None
    # what the policy is given: no history at all, so it decides as it always did
    assert all(p.recent_milli == 0.0 for p in core.cycles.snapshot(core.book.live_jobs()).projects)


async def test_the_policy_is_given_each_projects_recent_training_use(make_core):
    core = await make_core(simulate="2xA100-80GB", usage_half_life_s=3600)
    core.set_project(ADMIN, "a", {"train_guarantee": 0})
    core.set_project(ADMIN, "b", {"train_guarantee": 0})
    job, _ = await core.submit(ALICE, {"project": "a", "gpus": 2, "command": [PY, "-c", "import time; time.sleep(60)"]})
    assert (await started(core, job["id"]))["state"] == "running"
    await asyncio.sleep(1.0)
    core.recent_gpu_hours()  # counts what was held up to now
    recent = {p.name: p.recent_milli for p in core.cycles.snapshot(core.book.live_jobs()).projects}
    # 2 GPUs for ~1 s, over (3600 s / ln 2): about 0.4 milli-GPU on average
    assert 2000 * 0.8 * math.log(2) / 3600 < recent["a"] < 2000 * 3.0 * math.log(2) / 3600
    assert recent["b"] == 0.0
    fair = {p["name"]: p["fair_share"] for p in core.list_projects()}
    assert fair["a"]["gpus"] == fair["b"]["gpus"] == 1.0  # two projects of weight 1 on 2 GPUs
    # a: 2 GPUs now (and a fraction of a milli-GPU lately) on a share of 1, as the policy ranks it; b: nothing
    assert fair["a"]["percent"] == 200 and fair["b"]["percent"] == 0
    await wait_for(lambda: 'gpupool_project_fair_share_used_ratio{project="a"}' in _metrics(core), what="the gauge")
    await core.cancel(ALICE, job["id"])


def _metrics(core) -> str:
    from prometheus_client import generate_latest

    return generate_latest(core.registry).decode()


def test_gpupool_projects_shows_recent_gpu_hours():
    from gpupool.cli.tables import projects_table

    row = {"name": "a", "build_quota": 1, "train_guarantee": 2, "usage": {}, "pending": 0,
           "recent_gpu_hours": {"build": 0.5, "train": 12.0}, "members": None}
    text = projects_table([row, {**row, "name": "b", "recent_gpu_hours": {"build": 0, "train": 0}}])
    assert "RECENT GPU-h" in text
    assert [line.split()[-3] for line in text.splitlines()[1:]] == ["12.5", "0"]
    assert "OF FAIR SHARE" in text and "entitled" not in text  # no standing known: no footnote
    fair = {**row, "fair_share": {"gpus": 4, "recent_gpus": 1.6, "percent": 40}}
    text = projects_table([fair])
    assert "40% of 4" in text.splitlines()[1]
    assert "as a share of what it is entitled to" in text
