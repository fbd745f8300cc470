"""A near-zero fair share must not stop the scheduler's tick (issue 22, item 7).

A project whose long-run share rounds to 0.000 GPUs (a weight of 1e-9, or one
of thousands of personal projects) made every tick divide by that rounded 0
before its cycle ran, so reclaims that wait on time never happened. These tests
drive the real service core; the property tests cover the figures behind the
``fair_share`` wire field and the /metrics gauges over tiny and huge weights and
project counts.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from gpupool.policy.fairshare import ShareInput, entitlements
from gpupool.service.metrics import Metrics
from gpupool.service.usage import fair_share_figures, fair_share_standing, used_ratio
from tests.service.helpers import ADMIN, ALICE, BOB, PY, started, wait_for

SLEEPER = [PY, "-c", "import time; time.sleep(120)"]


async def _reclaim_that_waits_on_min_runtime(core: Any) -> tuple[str, str]:
    """p1 (guarantee 0) holds both GPUs; p2 (guarantee 1) asks for one, which it may take only once
    p1's job has run ``min_runtime_s``: a reclaim only the tick's cycle can decide. Returns the job ids."""
    core.set_project(ADMIN, "p1", {"train_guarantee": 0})
    core.set_project(ADMIN, "p2", {"train_guarantee": 1})
    hog, _ = await core.submit(ALICE, {"project": "p1", "gpus": 2, "command": SLEEPER})
    assert (await started(core, hog["id"]))["state"] == "running"
    waiter, _ = await core.submit(BOB, {"project": "p2", "gpus": 1, "command": SLEEPER})
    return hog["id"], waiter["id"]


async def test_a_project_with_a_tiny_weight_does_not_stop_time_based_reclaims(make_core):
    core = await make_core(simulate="2xA100-80GB", tick_s=1.0, min_runtime_s=3.0)
    core.set_project(ADMIN, "z", {"weight": 1e-9})  # its long-run share: 2e-9 of 2 GPUs, shown as 0.0
    hog, waiter = await _reclaim_that_waits_on_min_runtime(core)
    assert core.get_job(ADMIN, waiter)["state"] == "queued"  # p1's job has not run 3 s yet
    await wait_for(lambda: core.get_job(ADMIN, waiter)["state"] == "running", timeout=30,
                   what="p2's job to get the GPU reclaimed after min_runtime_s")
    assert core.get_job(ADMIN, hog)["state"] == "paused"
    fair = {p["name"]: p["fair_share"] for p in core.list_projects()}
    assert fair["z"]["gpus"] == 0.0 and fair["z"]["recent_gpus"] == 0.0
    assert fair["z"]["percent"] == 0  # 0 used of a share of a few micro-GPUs: 0 %, not an error
    await wait_for(lambda: 'gpupool_project_fair_share_used_ratio{project="z"} 0.0' in _metrics(core), timeout=10,
                   what="z's used-share gauge")
    ratios = [s.value for f in core.registry.collect() for s in f.samples
              if s.name == "gpupool_project_fair_share_used_ratio"]
    assert len(ratios) == 3 and all(math.isfinite(v) for v in ratios)


def _metrics(core: Any) -> str:
    return generate_latest(core.registry).decode()


async def test_a_tick_whose_one_part_fails_still_runs_its_cycle_and_later_parts(make_core, caplog):
    core = await make_core(simulate="2xA100-80GB", tick_s=0.5, min_runtime_s=2.0, history_interval_s=0.1,
                           events_max_rows=3)

    def broken_disk(*_: Any, **__: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    core.book.store.add_history = broken_disk  # the history part of every tick now fails
    caplog.set_level(logging.ERROR, logger="gpupool.service")
    hog, waiter = await _reclaim_that_waits_on_min_runtime(core)
    saved_before = core.book.store.load_usage()[0]
    await wait_for(lambda: core.get_job(ADMIN, waiter)["state"] == "running", timeout=30,
                   what="the tick's cycle to reclaim a GPU for p2 after min_runtime_s")
    assert core.get_job(ADMIN, hog)["state"] == "paused"
    assert any("tick: history failed" in r.getMessage() for r in caplog.records)
    # the parts after the failed one ran too: usage is saved and events are trimmed
    await wait_for(lambda: core.book.store.load_usage()[0] > saved_before, timeout=10, what="usage to be saved")
    assert core.last_event_seq > 6  # more events than are kept...
    await wait_for(lambda: len(core.events_since(0)) <= 3, timeout=10, what="events to be trimmed")  # ...trimmed


# ---------------------------------------------------------------- property tests
_WEIGHTS = st.one_of(
    st.floats(min_value=5e-324, max_value=1e-6, allow_subnormal=True),  # tiny, down to the smallest float
    st.floats(min_value=1e-6, max_value=1e6),
    st.sampled_from([5e-324, 1e-300, 1e-9, 1.0, 1e6]),
)
_PROJECT = st.tuples(
    _WEIGHTS,
    st.integers(min_value=0, max_value=8000),  # guarantee, milli-GPU
    st.one_of(st.none(), st.integers(min_value=0, max_value=8000)),  # limit
    st.floats(min_value=0.0, max_value=8000.0),  # recent average use, milli-GPU
)


@st.composite
def _pools(draw: st.DrawFn) -> tuple[int, dict[str, ShareInput], dict[str, float]]:
    """A train pool's capacity, a few projects drawn freely, and up to thousands of personal projects."""
    capacity = draw(st.integers(min_value=0, max_value=8000))
    projects: dict[str, ShareInput] = {}
    recent: dict[str, float] = {}
    for i, (weight, guarantee, limit, used) in enumerate(draw(st.lists(_PROJECT, min_size=1, max_size=8))):
        projects[f"p{i}"] = ShareInput(guarantee, limit, weight, 0)
        recent[f"p{i}"] = used
    personal = draw(st.sampled_from([0, 1, 50, 3000]))
    personal_weight = draw(_WEIGHTS)
    for i in range(personal):
        projects[f"user{i:04d}"] = ShareInput(0, None, personal_weight, 0)
        recent[f"user{i:04d}"] = 1000.0 if i % 7 == 0 else 0.0  # some of them used a GPU lately
    return capacity, projects, recent


_ISSUE_22 = (2000, {"p1": ShareInput(0, None, 1.0, 0), "p2": ShareInput(1000, None, 1.0, 0),
                    "z": ShareInput(0, None, 1e-9, 0)}, {"p1": 2000.0, "p2": 0.0, "z": 0.0})
"""The issue's repro: z's share is 1e-6 milli-GPU, shown as 0.0 GPUs."""
_PERSONAL = (8000, {f"user{i:04d}": ShareInput(0, None, 1.0, 0) for i in range(5000)},
             {f"user{i:04d}": 1.0 for i in range(5000)})
"""Thousands of personal projects on 8 GPUs: 1.6 milli-GPU each, shown as 0.002."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(_ISSUE_22, True)
@example(_PERSONAL, True)
@given(_pools(), st.booleans())
def test_fair_share_standing_is_finite_for_any_weights_and_project_count(pool, history):
    capacity, projects, recent = pool
    standing = fair_share_standing(capacity, projects, recent, history)
    assert set(standing) == set(projects)
    json.dumps(standing, allow_nan=False)  # what GET /projects sends: no NaN or infinity
    for name, fair in standing.items():
        assert math.isfinite(fair["gpus"]) and fair["gpus"] >= 0
        assert math.isfinite(fair["recent_gpus"]) and fair["recent_gpus"] >= 0
        if not history:
            assert fair["percent"] is None
        elif fair["gpus"] >= 0.001:  # a share shown as at least a milli-GPU always has a percentage
            assert isinstance(fair["percent"], int) and fair["percent"] >= 0
        if fair["percent"] is not None and recent[name] == 0:
            assert fair["percent"] == 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(_ISSUE_22, 3)
@example(_PERSONAL, 1)
@given(_pools(), st.integers(min_value=0, max_value=8))
def test_the_percentage_counts_what_runs_now_as_the_policy_ranks_projects(pool, gpus_now):
    """percent = (use now + recent use) / long-run share, from the unrounded figures (issue 22, item 13)."""
    capacity, projects, recent = pool
    current = {name: float(gpus_now * 1000 if i % 2 == 0 else 0) for i, name in enumerate(projects)}
    standing = fair_share_standing(capacity, projects, recent, True, current)
    json.dumps(standing, allow_nan=False)
    shares = entitlements(capacity, projects)
    for name, fair in standing.items():
        share = shares.get(name, 0.0)
        if share <= 0:
            assert fair["percent"] is None
        elif share >= 1.0:  # at least a milli-GPU: a quotient that never overflows
            assert fair["percent"] == round(100.0 * (current[name] + recent[name]) / share), (name, fair)
        assert fair["recent_gpus"] == round(recent[name] / 1000.0, 3)  # what runs now is not "recent"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(_ISSUE_22)
@example(_PERSONAL)
@given(_pools())
def test_the_metrics_refresh_is_finite_for_any_weights_and_project_count(pool):
    capacity, projects, recent = pool
    metrics = Metrics()
    figures = fair_share_figures(capacity, projects, recent)
    usage = {(name, "train"): used * 3600 for name, used in recent.items()}
    metrics.show_usage(usage, figures)
    ratios = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert math.isfinite(sample.value), sample
            if sample.name == "gpupool_project_fair_share_used_ratio":
                ratios[sample.labels["project"]] = sample.value
    for name, (share, used) in figures.items():
        if share >= 1.0:  # a share of at least a milli-GPU is always shown, as used over share
            assert ratios[name] == used / share


def test_used_ratio_has_no_value_where_there_is_no_finite_quotient():
    assert used_ratio(2e-6, 0.0) == 0.0  # the issue's project z: a tiny share, nothing used
    assert used_ratio(2e-6, 1000.0) == 1000.0 / 2e-6  # a huge ratio is still the true one
    assert used_ratio(0.0, 0.0) is None and used_ratio(0.0, 1000.0) is None
    assert used_ratio(5e-324, 1000.0) is None  # the quotient overflows a float
    assert used_ratio(math.inf, 1.0) is None and used_ratio(math.nan, 1.0) is None
    assert used_ratio(1000.0, math.nan) is None
