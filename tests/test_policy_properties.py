"""Properties of the engine on random pools and workloads (hypothesis, small sizes).

Each example builds a random pool and projects, runs a first cycle on a
random set of pending work to reach a valid running state, applies it, adds
more pending work, and checks the second cycle: capacity is never exceeded,
build quotas hold, build work is never paused, gangs land whole on one node,
decisions do not depend on the order of the input, guarantees are honoured,
and nothing flaps.
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
    train_usage,
    violations,
)

from gpupool.policy import (
    BUILD_POOL,
    TRAIN_POOL,
    Assignment,
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

SETTINGS = settings(max_examples=60, deadline=None)
MODELS = ("A100", "T4")
POOLS = (frozenset({TRAIN_POOL}), frozenset({BUILD_POOL}), frozenset({BUILD_POOL, TRAIN_POOL}))


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        n_gpus = draw(st.integers(0, 4))
        model = draw(st.sampled_from(MODELS))
        # mostly whole GPUs; some with part of their share withheld or all of it (capacity 0)
        caps = [draw(st.sampled_from([1000, 1000, 1000, 500, 0])) for _ in range(n_gpus)]
        gpus = tuple(Gpu(f"n{i}-g{j}", j, model, 40_000, f"grp{j // 2}", caps[j]) for j in range(n_gpus))
        out.append(Node(f"n{i}", draw(st.sampled_from([8_000, 32_000])), draw(st.sampled_from([32_768, 131_072])),
                        gpus, draw(st.sampled_from(POOLS))))
    return tuple(out)


@st.composite
def projects(draw: st.DrawFn) -> tuple[Project, ...]:
    out = []
    for name in ("A", "B", "C")[: draw(st.integers(1, 3))]:
        guarantee = draw(st.integers(0, 8)) * 500
        limit = draw(st.one_of(st.none(), st.integers(guarantee // 500, 12).map(lambda x: x * 500)))
        out.append(Project(name, build_quota_milli=draw(st.integers(0, 8)) * 250, train_guarantee_milli=guarantee,
                           train_limit_milli=limit, weight=draw(st.sampled_from([1.0, 2.0, 3.0]))))
    return tuple(out)


@st.composite
def requests(draw: st.DrawFn, kind: Kind) -> Request:
    form = draw(st.sampled_from(["gpus", "milli", "memory", "cpu"] if kind is Kind.TRAIN else ["milli", "gpus", "memory"]))
    models = draw(st.sampled_from([frozenset(), frozenset({"A100"}), frozenset({"T4"})]))
    cpu = draw(st.sampled_from([0, 1_000, 4_000]))
    mem = draw(st.sampled_from([0, 4_096, 16_384]))
    if form == "gpus":
        return Request(gpus=draw(st.integers(1, 3)), gpu_models=models, cpu_milli=cpu, memory_mib=mem)
    if form == "milli":
        return Request(gpu_milli=draw(st.sampled_from([250, 500, 750])), gpu_models=models, cpu_milli=cpu, memory_mib=mem)
    if form == "memory":
        return Request(gpu_memory_mib=draw(st.sampled_from([10_000, 20_000])), gpu_models=models, cpu_milli=cpu,
                       memory_mib=mem)
    return Request(cpu_milli=cpu or 1_000, memory_mib=mem)


@st.composite
def workloads(draw: st.DrawFn, names: tuple[str, ...], prefix: str, t0: float) -> list[Workload]:
    out = []
    for i in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from([Kind.TRAIN, Kind.TRAIN, Kind.BUILD]))
        out.append(Workload(f"{prefix}{i:02d}", draw(st.sampled_from(names)), kind, draw(requests(kind)),
                            priority=draw(st.integers(0, 2)), submitted_at=t0 + draw(st.integers(0, 50))))
    return out


@st.composite
def worlds(draw: st.DrawFn) -> Snapshot:
    """A snapshot with a valid running state (reached by one engine cycle) and new pending work."""
    ns, ps = draw(nodes()), draw(projects())
    names = tuple(p.name for p in ps)
    cfg = PolicyConfig(min_runtime_s=draw(st.sampled_from([0.0, 60.0])), resume_backoff_s=30.0,
                       starvation_s=draw(st.sampled_from([10.0, 1_000.0])))
    first = Snapshot(ns, ps, tuple(draw(workloads(names, "a", 0.0))), now=100.0, config=cfg)
    state = apply(first, schedule(first))
    more = draw(workloads(names, "b", 100.0))
    return dataclasses.replace(state, workloads=state.workloads + tuple(more), now=200.0)


@SETTINGS
@given(worlds())
def test_capacity_quotas_gangs_and_build_safety(s: Snapshot) -> None:
    assert violations(s) == []
    d = schedule(s)
    after = apply(s, d)
    assert violations(after) == []
    by_id = {w.id: w for w in s.workloads}
    for p in d.preempts:
        w = by_id[p.workload_id]
        assert w.kind is Kind.TRAIN and w.running, "only running training work is ever paused"
        assert p.reason
    for start in d.starts:
        w = by_id[start.workload_id]
        assert not w.running and start.reason
        if w.kind is Kind.BUILD:
            assert not start.preemptible
        if w.request.gpus:
            assert len(start.assignment.gpus) == w.request.gpus  # the whole gang, one node
            node = next(n for n in s.nodes if n.name == start.assignment.node)
            capacity = {g.id: g.capacity_milli for g in node.gpus}
            # each GPU held in full, and none of them withheld from the pool
            assert all(capacity[gid] > 0 and milli == capacity[gid] for gid, milli in start.assignment.gpus)
    decided = [x.workload_id for x in d.starts + d.rejects + d.waits]
    pending = sorted(w.id for w in s.workloads if not w.running)
    assert sorted(decided) == pending, "every pending workload gets exactly one decision"
    assert all(x.reason for x in d.waits + d.rejects)
    limits = {p.name: p.train_limit_milli for p in s.projects}
    for name, used in train_usage(after).items():
        if limits.get(name) is not None:
            assert used <= limits[name]


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_same_snapshot_same_decisions_whatever_the_order(s: Snapshot, rnd) -> None:
    assert_same_decisions_whatever_the_order(s, rnd)


@SETTINGS
@given(worlds())
def test_preemptible_flags_match_the_guarantee(s: Snapshot) -> None:
    """Flags tell the truth about the guarantee floor.

    Every flagged job can be paused on its own without taking its project
    below its guarantee; the unflagged jobs go past the guarantee by less than
    one of them (the job that crossed it), so pausing any GPU job among them
    would break the floor, and none is flagged while the project is within
    its guarantee.
    """
    d = schedule(s)
    after = apply(s, d)
    flagged = set(d.preemptible) | {x.workload_id for x in d.starts if x.preemptible}
    used = train_usage(after)
    safe: dict[str, list[int]] = defaultdict(list)
    guarantees = {p.name: p.train_guarantee_milli for p in s.projects}
    for w in after.workloads:
        if w.kind is not Kind.TRAIN or w.assignment is None:
            continue
        milli = w.assignment.total_milli
        if w.id in flagged:
            assert used[w.project] - milli >= guarantees[w.project], f"pausing {w.id} breaks the floor"
            assert used[w.project] > guarantees[w.project]
        else:
            safe[w.project].append(milli)
    for name, jobs in safe.items():
        assert sum(jobs) - max(jobs) < guarantees[name] or sum(jobs) <= guarantees[name]


@SETTINGS
@given(worlds())
def test_reclaim_never_pushes_another_project_below_its_guarantee(s: Snapshot) -> None:
    assert_no_project_pushed_below_its_guarantee(s)


@SETTINGS
@given(worlds())
def test_no_flapping_when_nothing_changes(s: Snapshot) -> None:
    """Apply a cycle, run the next one a second later: nothing just started is paused,
    and nothing just paused is restarted outside its project's guarantee."""
    s = dataclasses.replace(s, config=dataclasses.replace(s.config, min_runtime_s=60.0))
    d1 = schedule(s)
    s2 = dataclasses.replace(apply(s, d1), now=s.now + 1)
    d2 = schedule(s2)
    started1 = {x.workload_id for x in d1.starts}
    paused1 = {x.workload_id for x in d1.preempts}
    assert not started1 & {x.workload_id for x in d2.preempts}
    for x in d2.starts:
        if x.workload_id in paused1:
            assert not x.preemptible


# ---------------------------------------------------------------- guarantees


def _four_gpu_train_nodes(n: int) -> tuple[Node, ...]:
    """Train-only nodes of 4 one-model GPUs, with CPU and memory to spare (only GPUs constrain)."""
    return tuple(
        Node(f"n{i}", 1_000_000, 1_000_000, tuple(Gpu(f"n{i}-g{j}", j, "A100", 40_000) for j in range(4)),
             frozenset({TRAIN_POOL}))
        for i in range(n)
    )


@st.composite
def guarantee_worlds(draw: st.DrawFn) -> Snapshot:
    """Train-only nodes, one-GPU jobs, whole-GPU guarantees that the pool can honour."""
    n_nodes = draw(st.integers(1, 3))
    ns = _four_gpu_train_nodes(n_nodes)
    total = 4 * n_nodes
    guarantees = draw(st.lists(st.integers(0, 4), min_size=2, max_size=3).filter(lambda g: sum(g) <= total))
    ps = tuple(Project(n, train_guarantee_milli=g * 1000, weight=draw(st.sampled_from([1.0, 2.0])))
               for n, g in zip("ABC", guarantees, strict=False))
    names = tuple(p.name for p in ps)
    cfg = PolicyConfig(min_runtime_s=0.0, resume_backoff_s=0.0)

    def jobs(prefix: str, t0: float) -> list[Workload]:
        return [Workload(f"{prefix}{i:02d}", draw(st.sampled_from(names)), Kind.TRAIN, Request(gpus=1),
                         priority=draw(st.integers(0, 1)), submitted_at=t0 + i)
                for i in range(draw(st.integers(0, 14)))]

    first = Snapshot(ns, ps, tuple(jobs("a", 0.0)), now=10.0, config=cfg)
    state = apply(first, schedule(first))
    return dataclasses.replace(state, workloads=state.workloads + tuple(jobs("b", 10.0)), now=20.0)


@settings(max_examples=100, deadline=None)
@given(guarantee_worlds())
def test_project_below_guarantee_gets_its_job_in_the_same_cycle(s: Snapshot) -> None:
    """If another project is over its guarantee (or GPUs are idle), a project under its guarantee
    with a pending job that fits in it starts one in this very cycle."""
    used = train_usage(s)
    guarantees = {p.name: p.train_guarantee_milli for p in s.projects}
    over = {n for n in guarantees if used[n] > guarantees[n]}
    d = schedule(s)
    started = {x.workload_id for x in d.starts}
    for p in s.projects:
        pending = [w for w in s.workloads if w.project == p.name and not w.running]
        if pending and used[p.name] + 1000 <= p.train_guarantee_milli and (over - {p.name}):
            assert any(w.id in started for w in pending), f"project {p.name} under its guarantee got nothing"
    assert violations(apply(s, d)) == []


@st.composite
def gang_worlds(draw: st.DrawFn) -> Snapshot:
    """Full train-only nodes of one-GPU jobs of several projects, and pending gangs that may reclaim."""
    n_nodes = draw(st.integers(1, 4))
    ns = _four_gpu_train_nodes(n_nodes)
    names = ("A", "B", "C")
    guarantees = draw(st.lists(st.integers(0, 4), min_size=3, max_size=3))
    ps = tuple(Project(n, train_guarantee_milli=g * 1000) for n, g in zip(names, guarantees, strict=True))
    running = []
    for node in ns:
        for g in node.gpus:
            if draw(st.booleans()) or draw(st.booleans()):
                running.append(Workload(f"r-{g.id}", draw(st.sampled_from(names)), Kind.TRAIN, Request(gpus=1),
                                        priority=draw(st.integers(0, 1)), assignment=Assignment(node.name, ((g.id, 1000),)),
                                        started_at=float(draw(st.sampled_from([0, 90]))), submitted_at=0.0))
    pending = [Workload(f"p{i}", draw(st.sampled_from(names)), Kind.TRAIN, Request(gpus=draw(st.integers(2, 4))),
                        priority=draw(st.integers(0, 2)), submitted_at=float(draw(st.integers(0, 99))))
               for i in range(draw(st.integers(1, 6)))]
    return Snapshot(ns, ps, tuple(running + pending), now=100.0, config=PolicyConfig(min_runtime_s=30.0))


@SETTINGS
@given(gang_worlds())
def test_gang_reclaim_bound_only_skips_searches_that_would_fail(s: Snapshot) -> None:
    """The upper bound in front of a gang's victim search (Reclaim._gang_reachable) changes no decision."""
    from gpupool.policy.reclaim import Reclaim

    with_bound = schedule(s)
    original = Reclaim._gang_reachable
    try:
        Reclaim._gang_reachable = lambda self, gpus, own, names, wide=False: True  # type: ignore[method-assign]
        without = schedule(s)
    finally:
        Reclaim._gang_reachable = original  # type: ignore[method-assign]
    assert with_bound == without
