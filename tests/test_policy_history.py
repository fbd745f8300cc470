"""Fair share over time in the engine: properties with recent usage (``Project.recent_milli``).

History orders who gets idle GPUs beyond guarantees and whose over-quota jobs
are paused first (docs/policy.md, "Fair share over time"). It must never cost a
guarantee, keep every other invariant of the engine, and with no history
(every project at 0) decide exactly what the engine decides without it.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_helpers import (
    apply,
    assert_no_project_pushed_below_its_guarantee,
    assert_same_decisions_whatever_the_order,
    train_usage,
    violations,
)
from test_policy_properties import _four_gpu_train_nodes, guarantee_worlds, worlds

from gpupool.policy import Kind, PolicyConfig, Project, Request, Snapshot, Workload, schedule

SETTINGS = settings(max_examples=60, deadline=None)
RECENT = st.sampled_from([0.0, 250.0, 1_000.0, 4_000.0, 12_000.0])


@st.composite
def with_history(draw: st.DrawFn, base: st.SearchStrategy[Snapshot]) -> Snapshot:
    """A world from ``base`` whose projects carry random recent usage."""
    s = draw(base)
    projects = tuple(dataclasses.replace(p, recent_milli=draw(RECENT)) for p in s.projects)
    return dataclasses.replace(s, projects=projects)


def _without_history(s: Snapshot) -> Snapshot:
    return dataclasses.replace(s, projects=tuple(dataclasses.replace(p, recent_milli=0.0) for p in s.projects))


@SETTINGS
@given(with_history(worlds()))
def test_history_keeps_capacity_quotas_and_one_decision_per_job(s: Snapshot) -> None:
    d = schedule(s)
    assert violations(apply(s, d)) == []
    decided = sorted(x.workload_id for x in d.starts + d.rejects + d.waits)
    assert decided == sorted(w.id for w in s.workloads if not w.running)


@SETTINGS
@given(with_history(worlds()), st.randoms(use_true_random=False))
def test_history_decisions_are_deterministic(s: Snapshot, rnd) -> None:
    assert_same_decisions_whatever_the_order(s, rnd)


@SETTINGS
@given(with_history(worlds()))
def test_history_never_takes_a_project_below_its_guarantee(s: Snapshot) -> None:
    assert_no_project_pushed_below_its_guarantee(s)


@settings(max_examples=100, deadline=None)
@given(with_history(guarantee_worlds()))
def test_history_does_not_delay_a_claimed_guarantee(s: Snapshot) -> None:
    """A project under its guarantee starts a job this cycle, whatever anyone's history."""
    used = train_usage(s)
    guarantees = {p.name: p.train_guarantee_milli for p in s.projects}
    over = {n for n in guarantees if used[n] > guarantees[n]}
    started = {x.workload_id for x in schedule(s).starts}
    for p in s.projects:
        pending = [w for w in s.workloads if w.project == p.name and not w.running]
        if pending and used[p.name] + 1000 <= p.train_guarantee_milli and (over - {p.name}):
            assert any(w.id in started for w in pending), f"project {p.name} under its guarantee got nothing"


@SETTINGS
@given(worlds())
def test_no_history_decides_as_without_the_field(s: Snapshot) -> None:
    """Half-life 0 (the service passes 0 for everyone) is today's engine: same decisions, same reasons."""
    zeroed = _without_history(dataclasses.replace(
        s, projects=tuple(dataclasses.replace(p, recent_milli=123.0) for p in s.projects)))
    assert schedule(zeroed) == schedule(s)


@SETTINGS
@given(st.integers(1, 3), RECENT, RECENT, st.sampled_from([0, 1, 2]))
def test_idle_gpus_go_first_to_the_project_with_less_recent_use(n_nodes: int, ra: float, rb: float,
                                                                 guarantee: int) -> None:
    """Two projects alike but for their history, both with more one-GPU work than the free pool holds:
    the one that used less lately gets at least as many of the idle GPUs."""
    nodes = _four_gpu_train_nodes(n_nodes)
    projects = (Project("A", train_guarantee_milli=guarantee * 1000, recent_milli=ra),
                Project("B", train_guarantee_milli=guarantee * 1000, recent_milli=rb))
    jobs = tuple(Workload(f"{name}{i:02d}", name, Kind.TRAIN, Request(gpus=1), submitted_at=float(i))
                 for name in "AB" for i in range(4 * n_nodes))
    s = Snapshot(nodes, projects, jobs, now=100.0, config=PolicyConfig())
    got = train_usage(apply(s, schedule(s)))
    assert got["A"] + got["B"] == 4000 * n_nodes
    assert min(got["A"], got["B"]) >= guarantee * 1000  # guarantees first, history or not
    if ra < rb:
        assert got["A"] >= got["B"]
    elif rb < ra:
        assert got["B"] >= got["A"]


def test_a_project_that_ran_a_day_waits_behind_one_that_had_nothing() -> None:
    """The issue's story in the engine: A held 8 GPUs for a day (half-life one day: 4 GPUs on average
    lately), B nothing; both queue over-quota work on a free 8-GPU pool. B's jobs go first, and A's
    waiting job says why."""
    nodes = _four_gpu_train_nodes(2)
    projects = (Project("A", recent_milli=4000.0), Project("B"))
    jobs = tuple(Workload(f"{name}{i}", name, Kind.TRAIN, Request(gpus=1), submitted_at=float(i) + (0 if name == "A"
                 else 0.5)) for name in "AB" for i in range(8))
    s = Snapshot(nodes, projects, jobs, now=100.0)
    d = schedule(s)
    got = train_usage(apply(s, d))
    assert got == {"A": 2000, "B": 6000}  # (0 + 4) / 4 = 1 once B holds 4: then they alternate
    first = [x.workload_id for x in d.starts][:4]
    assert all(j.startswith("B") for j in first), first
    why = next(w.reason for w in d.waits if w.workload_id.startswith("A"))
    assert "idle GPUs go first to projects that used less of their fair share lately" in why
    assert "project A held 4 GPUs on average recently" in why
    no_history = schedule(_without_history(s))
    assert train_usage(apply(s, no_history)) == {"A": 4000, "B": 4000}
