"""What the views read of allocated vs used (issue 26, item 3): each running job's recent use and the series over time.

The figures are checked against hand-computed cases first (the history is
driven sample by sample, as the tick does), then in a running service whose
job drives its own use through the simulation hook (gpupool.sim_use).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import jsonschema
import pytest

from gpupool.service.actor import Actor
from gpupool.service.gpu_use import JobUse
from gpupool.service.recent_use import RecentUse
from gpupool.service.store import Store
from gpupool.service.use_history import UseHistory
from gpupool.service.use_series import build_series, pick_step
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.schemas import COMPONENTS, to_json_schema
from tests.service.helpers import ADMIN, ALICE, PY
from tests.service.test_gpu_use import _drive, _job, _store

START = 1_000_000_200.0  # on a 5 min boundary (and a 30 s one)


def _driven(tmp_path: Path) -> tuple[Store, UseHistory]:
    """``_drive``'s two minutes: job 1 (vision, alice, train, 1 GPU) busy then idle, job 2 (vision, bob, build, a
    quarter) at 40 % of its share, job 3 (nlp, bob, train, half a GPU) unmeasured for the first minute only."""
    s = _store(tmp_path)
    h = UseHistory(s)
    _drive(h, START)
    return s, h


# ------------------------------------------------------------------ recent use (hand-computed)
def test_recent_use_is_the_last_minute_of_each_running_job(tmp_path):
    s, h = _driven(tmp_path)
    jobs = {n: _job(n, "p", "u", "train", []) for n in (1, 2, 3)}
    clock = [START + 60]
    recent = RecentUse(h, clock=lambda: clock[0], max_age_s=0)

    def busy(num: int) -> object:
        got = recent.of(jobs[num])
        return got if got is None else (got["busy"], got["measured"], got["peak_memory"])

    # the first minute: job 1 flat out, job 2 at 40 % of its quarter, job 3 held but never measured: no figure
    assert busy(1) == (1.0, 1.0, 4 << 30) and busy(2) == (0.4, 1.0, 1 << 29)
    assert busy(3) == (None, 0.0, 0)  # unmeasured is not idle: busy is unknown
    clock[0] = START + 90  # the window [30 s, 90 s): job 1 busy for its first half
    assert busy(1) == (0.5, 1.0, 4 << 30)
    clock[0] = START + 120  # the second minute: job 1 idle, job 3 no longer holds anything in the window
    assert busy(1) == (0.0, 1.0, 1 << 30) and busy(2) == (0.4, 1.0, 1 << 29) and busy(3) is None
    assert recent.of(_job(1, "p", "u", "train", [], state="paused")) is None  # only running jobs
    assert recent.of(_job(9, "p", "u", "train", [])) is None  # running, never sampled
    assert recent.of(jobs[1])["window_s"] == 60.0


def test_recent_use_reads_the_store_once_per_max_age(tmp_path):
    s, h = _driven(tmp_path)
    clock = [START + 60]
    recent = RecentUse(h, clock=lambda: clock[0], max_age_s=5)
    first = recent.sums()
    clock[0] = START + 62
    assert recent.sums() is first  # within max_age: the same read answers every job
    clock[0] = START + 90
    assert recent.sums() is not first


# ------------------------------------------------------------------ the series (hand-computed)
def _by_key(reply: dict, key: str = "project") -> dict[tuple[str, str], dict]:
    return {(x[key], x["kind"]): x for x in reply["series"]}


def test_the_series_matches_a_hand_computed_case(tmp_path):
    s, h = _driven(tmp_path)
    projects = {p.name: p for p in s.projects()}
    reply = build_series(ADMIN, h, s, projects, since=START, step=30, by="project", now=START + 121)
    jsonschema.validate(reply, to_json_schema(COMPONENTS["ReportSeries"]))
    assert reply["step"] == 30 and reply["since"] == START and reply["until"] == START + 120  # the last sample
    series = _by_key(reply)
    assert set(series) == {("vision", "train"), ("vision", "build"), ("nlp", "train")}
    t = [int(START) + 30 * i for i in range(4)]
    # mean GPUs per 30 s: a GPU busy then idle; a quarter at 40 % (0.1 GPU); half a GPU for a minute, unmeasured
    assert series[("vision", "train")] == {"project": "vision", "kind": "train", "t": t, "allocated": [1.0] * 4,
                                          "measured": [1.0] * 4, "used": [1.0, 1.0, 0.0, 0.0]}
    assert series[("vision", "build")]["allocated"] == [0.25] * 4 and series[("vision", "build")]["used"] == [0.1] * 4
    assert series[("nlp", "train")]["allocated"] == [0.5, 0.5, 0.0, 0.0]
    assert series[("nlp", "train")]["measured"] == [0.0] * 4 and series[("nlp", "train")]["used"] == [0.0] * 4

    # a sample not written yet counts (the open bucket), and the last bucket is the part of it sampled so far
    for t in (START + 125, START + 130, START + 135):
        h.add(t, {1: JobUse(1000, 1000, 500.0, 0)})
    reply = build_series(ADMIN, h, s, projects, since=START, step=30, by="project", now=START + 136)
    vision = _by_key(reply)[("vision", "train")]
    assert reply["until"] == START + 130 and vision["t"][-1] == START + 120  # [130, 135) is not complete yet
    assert vision["allocated"][-1] == 1.0 and vision["used"][-1] == 0.5


def test_a_steady_job_is_drawn_flat_whatever_the_samples_that_fall_in_each_bucket(tmp_path):
    """Samples every 6 s: the 10 s buckets get 12, 6 and 12 s of them (each interval goes by its middle). A mean
    over the bucket's length would draw 1.2, 0.6, 1.2 GPUs; over the seconds sampled it is the GPU held."""
    s = _store(tmp_path)
    h = UseHistory(s)
    for i in range(6):
        h.add(START + 6 * i, {1: JobUse(1000, 1000, 250.0, 0)})
    h.flush(START + 30)
    reply = build_series(ADMIN, h, s, {}, since=START, step=10, by="job", now=START + 31)
    assert reply["until"] == START + 30
    job, = reply["series"]
    assert job["t"] == [START, START + 10, START + 20]
    assert job["allocated"] == [1.0, 1.0, 1.0] and job["used"] == [0.25, 0.25, 0.25]


def test_a_user_sees_the_series_of_their_projects_and_their_own_jobs(tmp_path):
    s, h = _driven(tmp_path)
    projects = {p.name: p for p in s.projects()}

    def keys(actor: Actor, by: str) -> set[tuple[str, str]]:
        key = "job_id" if by == "job" else by
        return set(_by_key(build_series(actor, h, s, projects, START, 30, by, START + 121), key))

    assert keys(Actor("alice"), "project") == {("vision", "train"), ("vision", "build")}  # bob's kernel counts too
    assert keys(Actor("alice"), "job") == {("j-000001", "train")}
    assert keys(Actor("bob"), "user") == {("bob", "build"), ("bob", "train")}
    assert keys(Actor("carol"), "project") == set()  # a member of neither project
    assert keys(ADMIN, "user") == {("alice", "train"), ("bob", "build"), ("bob", "train")}
    for bad in ({"by": "team"}, {"step": 0}, {"step": -5}, {"step": 1e300}, {"since": "yesterday"},
                {"step": float("nan")}):
        with pytest.raises(InvalidRequest):
            build_series(ADMIN, h, s, projects, **{"since": START, "step": 30, "by": "project", **bad})


def test_the_series_stays_small_and_reads_the_5_min_rows_after_the_roll_up(tmp_path, monkeypatch):
    s, h = _driven(tmp_path)
    projects = {p.name: p for p in s.projects()}
    monkeypatch.setattr("gpupool.service.use_series.MAX_SERIES", 2)
    jobs = _by_key(build_series(ADMIN, h, s, projects, START, 30, "job", START + 121), "job_id")
    assert set(jobs) == {("j-000001", "train"), ("(other)", "build"), ("(other)", "train")}  # job 1 held most
    assert jobs[("(other)", "train")]["allocated"] == [0.5, 0.5, 0.0, 0.0]
    h.flush(START + 125, everything=True)
    s.close()

    s = Store(tmp_path / "state.db")  # a restart, two days later: the 10 s rows were rolled up and dropped
    h = UseHistory(s)
    later = START + 2 * 86400
    h.flush(later)
    reply = build_series(ADMIN, h, s, projects, since=START - 600, by="project", now=later)
    assert reply["step"] == 600 and len(reply["series"][0]["t"]) <= 361
    vision = _by_key(reply)[("vision", "train")]
    i = vision["t"].index(int(START))
    # a mean over the 120 s sampled in the bucket, not its 600 s (the rest of it is unknown, not "nothing held")
    assert vision["allocated"][i] == pytest.approx(1.0) and vision["used"][i] == pytest.approx(0.5)
    assert sum(vision["allocated"]) == pytest.approx(1.0)  # nothing anywhere else
    s.close()


def test_the_step_is_a_multiple_of_the_rows_and_keeps_series_short():
    assert pick_step(3600, 10, None) == 10
    assert pick_step(86400, 10, None) == 300  # 288 points
    assert pick_step(3600, 10, 7) == 10 and pick_step(3600, 10, 25) == 30
    assert pick_step(90 * 86400, 300, None) == 6 * 3600
    assert pick_step(90 * 86400, 300, 60) == 21600  # 360 points at most
    assert pick_step(86400, 300, 450) == 600


# ------------------------------------------------------------------ in a running service
HALF_BUSY = r"""
import time, gpupool
assert gpupool.sim_use(busy=0.5, memory=2 << 30)
time.sleep(60)
"""


async def test_a_running_job_shows_its_recent_use_and_its_project_series(make_core):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2, "members": ["alice"]})
    job, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": [PY, "-c", HALF_BUSY]})
    assert job["recent_use"] is None  # queued
    deadline = time.monotonic() + 30
    while True:
        now = core.get_job(ALICE, job["id"])
        use = now["recent_use"]
        if use is not None and use["busy"] and time.monotonic() > deadline - 27:
            break
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.1)
    # half of its GPU busy since it reported (a sample or two before it did read idle)
    assert now["state"] == "running" and 0.3 <= use["busy"] <= 0.505, use  # (rows hold whole milli-GPU-seconds)
    assert use["measured"] == 1.0 and use["peak_memory"] == 2 << 30 and use["window_s"] == 60.0
    listed, = [j for j in core.list_jobs(ALICE) if j["id"] == job["id"]]
    assert listed["recent_use"]["busy"] == pytest.approx(use["busy"], abs=0.1)
    while True:  # the series ends at the last 10 s boundary the samples passed
        reply = core.report_series(ALICE, since=time.time() - 60, step=10)
        vision = _by_key(reply).get(("vision", "train"))
        if vision and max(vision["allocated"]) > 0:
            break
        assert time.monotonic() < deadline + 15, reply
        await asyncio.sleep(0.2)
    # the bucket it started in: its GPU for part of it, half used once it reported (a bucket gets each sampled
    # interval by its middle, so a few tenths of a second more or less)
    i = max(range(len(vision["t"])), key=lambda k: vision["allocated"][k])
    assert 0 < vision["allocated"][i] <= 1.03 and vision["measured"][i] == vision["allocated"][i]
    assert 0 < vision["used"][i] <= vision["allocated"][i] / 2 + 0.01
    assert core.report_series(Actor("carol"), since=time.time() - 60)["series"] == []  # not a member of vision
    done = await core.cancel(ALICE, job["id"])
    assert core.get_job(ALICE, done["id"])["recent_use"] is None or done["state"] != "cancelled"


# ------------------------------------------------------------------ Prometheus, per job
def test_the_per_job_gauges_are_the_running_jobs_last_minute_with_the_rest_summed(tmp_path):
    from gpupool.service.use_metrics import JobUseGauges

    s, h = _driven(tmp_path)
    jobs = [_job(1, "vision", "alice", "train", [("GPU-0", 1000)]), _job(2, "vision", "bob", "build", [("GPU-1", 250)]),
            _job(3, "nlp", "bob", "train", [("GPU-1", 500)]), _job(4, "nlp", "bob", "train", [("GPU-2", 1000)],
                                                                  state="queued")]
    recent = RecentUse(h, clock=lambda: START + 90, max_age_s=0)

    def scrape(limit: int) -> dict[tuple[str, ...], float]:
        family, = JobUseGauges(lambda: jobs, recent, limit).collect()
        return {tuple(x.labels[k] for k in ("job", "project", "user", "kind", "what")): x.value for x in family.samples}

    got = scrape(10)
    # the window [30 s, 90 s): job 1 busy its first half; job 2 at 40 % of its quarter; job 3 held half a GPU
    # where nothing could be measured: none of it measured, none used (unknown, which a dashboard shows apart)
    assert got == {("j-000001", "vision", "alice", "train", "allocated"): 1.0,
                   ("j-000001", "vision", "alice", "train", "measured"): 1.0,
                   ("j-000001", "vision", "alice", "train", "used"): 0.5,
                   ("j-000002", "vision", "bob", "build", "allocated"): 0.25,
                   ("j-000002", "vision", "bob", "build", "measured"): 0.25,
                   ("j-000002", "vision", "bob", "build", "used"): 0.1,
                   ("j-000003", "nlp", "bob", "train", "allocated"): 0.5,
                   ("j-000003", "nlp", "bob", "train", "measured"): 0.0,
                   ("j-000003", "nlp", "bob", "train", "used"): 0.0}  # the queued job 4 has none
    capped = scrape(1)  # job 1 holds most; the others are summed per kind
    assert {k for k in capped if k[0] != "(other)"} == {k for k in got if k[0] == "j-000001"}
    assert capped[("(other)", "(other)", "(other)", "train", "allocated")] == 0.5
    assert capped[("(other)", "(other)", "(other)", "build", "used")] == 0.1
    assert len(capped) == 9


async def test_metrics_show_a_running_jobs_series_until_it_ends(make_core):
    core = await make_core(simulate="2xA100-80GB")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    job, _ = await core.submit(ALICE, {"project": "vision", "gpus": 1, "command": [PY, "-c", HALF_BUSY]})
    labels = {"job": job["id"], "project": "vision", "user": "alice", "kind": "train"}
    deadline = time.monotonic() + 20
    while not core.registry.get_sample_value("gpupool_job_gpus", {**labels, "what": "used"}):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert core.registry.get_sample_value("gpupool_job_gpus", {**labels, "what": "allocated"}) == 1.0
    assert core.registry.get_sample_value("gpupool_job_gpus", {**labels, "what": "measured"}) == 1.0
    await core.cancel(ALICE, job["id"])
    assert core.registry.get_sample_value("gpupool_job_gpus", {**labels, "what": "allocated"}) is None
