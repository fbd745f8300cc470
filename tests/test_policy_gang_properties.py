"""Properties of multi-node gangs on random pools (hypothesis, small sizes).

Random racks of nodes, projects with guarantees and limits, single jobs and
gangs of 2-4 replicas, some already running (reached by an engine cycle,
so the running state is one the engine produced), more pending. Checked:
no gang ever runs partly (after every cycle, over several cycles with
finishes), capacity is never exceeded, a gang's replicas get one kind of
decision and are paused together, decisions do not depend on the order of
the workloads, reclaim never pushes another project below its guarantee,
and a snapshot with part of a gang running is put right (paused whole).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_helpers import (
    apply,
    assert_no_project_pushed_below_its_guarantee,
    assert_same_decisions_whatever_the_order,
    partial_gangs,
    train_usage,
    violations,
)

from gpupool.policy import (
    TRAIN_POOL,
    Gpu,
    Kind,
    Node,
    PolicyConfig,
    Project,
    Request,
    Snapshot,
    Workload,
    schedule,
)

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        n_gpus = draw(st.sampled_from([2, 4, 4, 8]))
        model = draw(st.sampled_from(["A100", "A100", "T4"]))
        gpus = tuple(Gpu(f"n{i}-g{j}", j, model, 40_000, f"nvl{j // 4}") for j in range(n_gpus))
        out.append(Node(f"n{i}", draw(st.sampled_from([16_000, 64_000])), 262_144, gpus,
                        frozenset({TRAIN_POOL}), draw(st.sampled_from(["", "r1", "r2"]))))
    return tuple(out)


@st.composite
def projects(draw: st.DrawFn) -> tuple[Project, ...]:
    out = []
    for name in ("A", "B", "C")[: draw(st.integers(1, 3))]:
        guarantee = draw(st.integers(0, 12)) * 1000
        limit = draw(st.one_of(st.none(), st.integers(guarantee // 1000, 24).map(lambda x: x * 1000)))
        out.append(Project(name, train_guarantee_milli=guarantee, train_limit_milli=limit,
                           weight=draw(st.sampled_from([1.0, 2.0]))))
    return tuple(out)


@st.composite
def work(draw: st.DrawFn, names: tuple[str, ...], prefix: str, t0: float) -> list[Workload]:
    out: list[Workload] = []
    for i in range(draw(st.integers(0, 8))):
        proj = draw(st.sampled_from(names))
        prio = draw(st.integers(0, 2))
        t = t0 + draw(st.integers(0, 50))
        cpu = draw(st.sampled_from([0, 0, 4_000]))
        models = draw(st.sampled_from([frozenset(), frozenset(), frozenset({"A100"})]))
        if draw(st.booleans()):
            replicas = draw(st.integers(2, 4))
            req = Request(gpus=draw(st.sampled_from([1, 2, 4])), cpu_milli=cpu, gpu_models=models)
            gid = f"{prefix}g{i}"
            out += [Workload(f"{gid}-{k}", proj, Kind.TRAIN, req, priority=prio, submitted_at=t, gang=gid,
                             gang_size=replicas) for k in range(replicas)]
        else:
            req = draw(st.sampled_from([Request(gpus=1), Request(gpus=2), Request(gpu_milli=500),
                                        Request(gpus=1, cpu_milli=cpu, gpu_models=models)]))
            out.append(Workload(f"{prefix}j{i}", proj, Kind.TRAIN, req, priority=prio, submitted_at=t))
    return out


@st.composite
def worlds(draw: st.DrawFn) -> Snapshot:
    ns, ps = draw(nodes()), draw(projects())
    names = tuple(p.name for p in ps)
    cfg = PolicyConfig(min_runtime_s=draw(st.sampled_from([0.0, 60.0])), resume_backoff_s=30.0,
                       starvation_s=draw(st.sampled_from([10.0, 1_000.0])),
                       max_reservations=draw(st.sampled_from([1, 2])))
    first = Snapshot(ns, ps, tuple(draw(work(names, "a", 0.0))), now=100.0, config=cfg)
    state = apply(first, schedule(first))
    more = draw(work(names, "b", 100.0))
    return dataclasses.replace(state, workloads=state.workloads + tuple(more), now=200.0)


def _gangs(s: Snapshot) -> dict[str, list[Workload]]:
    out: dict[str, list[Workload]] = defaultdict(list)
    for w in s.workloads:
        if w.gang:
            out[w.gang].append(w)
    return out


@SETTINGS
@given(worlds())
def test_no_partial_gang_and_capacity_holds(s: Snapshot) -> None:
    assert violations(s) == []
    d = schedule(s)
    after = apply(s, d)
    assert violations(after) == [], "capacity exceeded or a gang runs partly"
    assert partial_gangs(after) == []
    decided = sorted(x.workload_id for x in d.starts + d.rejects + d.waits)
    assert decided == sorted(w.id for w in s.workloads if not w.running), "one decision per pending workload"
    kind = {x.workload_id: type(x).__name__ for x in d.starts + d.rejects + d.waits}
    reason = {x.workload_id: x.reason for x in d.starts + d.rejects + d.waits}
    flag = {x.workload_id: x.preemptible for x in d.starts}
    paused = {x.workload_id for x in d.preempts}
    for gid, members in _gangs(s).items():
        pending = [w.id for w in members if not w.running]
        assert len({kind[i] for i in pending}) <= 1, f"gang {gid}: replicas decided differently"
        if pending and kind[pending[0]] != "Start":
            assert len({reason[i] for i in pending}) == 1, f"gang {gid}: replicas told different reasons"
        started = [i for i in pending if kind[i] == "Start"]
        assert len({flag[i] for i in started}) <= 1, f"gang {gid}: preemptible flag differs between replicas"
        running = [w.id for w in members if w.running]
        hit = [i for i in running if i in paused]
        assert not hit or len(hit) == len(running), f"gang {gid}: paused alone"
        if started:
            assert len(started) == members[0].gang_size
    limits = {p.name: p.train_limit_milli for p in s.projects}
    for name, used in train_usage(after).items():
        if limits.get(name) is not None:
            assert used <= limits[name]


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_same_decisions_whatever_the_order(s: Snapshot, rnd) -> None:
    assert_same_decisions_whatever_the_order(s, rnd)


@SETTINGS
@given(worlds())
def test_reclaim_never_pushes_another_project_below_its_guarantee(s: Snapshot) -> None:
    assert_no_project_pushed_below_its_guarantee(s)


@SETTINGS
@given(worlds())
def test_flags_pause_whole_gangs_without_breaking_the_floor(s: Snapshot) -> None:
    """Each preemptible unit (a gang is one) can be paused alone and keep its project at its guarantee."""
    d = schedule(s)
    after = apply(s, d)
    flagged = set(d.preemptible) | {x.workload_id for x in d.starts if x.preemptible}
    used = train_usage(after)
    guarantee = {p.name: p.train_guarantee_milli for p in s.projects}
    units: dict[str, list[Workload]] = defaultdict(list)
    for w in after.workloads:
        if w.assignment is not None:
            units[w.gang or w.id].append(w)
    for key, members in units.items():
        marks = {w.id in flagged for w in members}
        assert len(marks) == 1, f"unit {key} flagged in part"
        if marks == {True}:
            total = sum(w.assignment.total_milli for w in members)
            assert used[members[0].project] - total >= guarantee[members[0].project]


@settings(max_examples=40, deadline=None)
@given(worlds(), st.integers(2, 6))
def test_no_gang_ever_runs_partly_over_many_cycles(s: Snapshot, cycles: int) -> None:
    for k in range(cycles):
        d = schedule(s)
        s = apply(s, d, now=s.now + 20.0)
        assert violations(s) == []
        # every third cycle the oldest running unit finishes (a gang as a whole)
        if k % 3 == 2:
            running = sorted((w for w in s.workloads if w.running), key=lambda w: (w.started_at, w.id))
            if running:
                done = running[0]
                gone = {w.id for w in s.workloads if (done.gang and w.gang == done.gang) or w.id == done.id}
                s = dataclasses.replace(s, workloads=tuple(w for w in s.workloads if w.id not in gone))


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_a_partly_running_gang_is_put_right(s: Snapshot, rnd) -> None:
    """Make a running gang partly pending (a replica was lost): the engine pauses the rest, never starts it partly."""
    running_gangs = sorted({w.gang for w in s.workloads if w.gang and w.running})
    if not running_gangs:
        return
    gid = rnd.choice(running_gangs)
    lost = next(w.id for w in s.workloads if w.gang == gid)
    ws = tuple(dataclasses.replace(w, assignment=None, started_at=None) if w.id == lost else w for w in s.workloads)
    s = dataclasses.replace(s, workloads=ws)
    assert partial_gangs(s) == [gid]
    d = schedule(s)
    after = apply(s, d)
    assert partial_gangs(after) == [] and violations(after) == []
    assert not any(x.workload_id.startswith(gid + "-") for x in d.starts)
