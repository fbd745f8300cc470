"""Build work reclaims from training on nodes shared by both pools (gpupool/policy/build_reclaim.py).

The user's question is "does my kernel get its GPU share at once": a kernel
within its project's fixed build quota that finds a shared node full of
training pauses as few training jobs as needed (preemptible ones first) and
starts in the same cycle; build work is never paused, and another project's
guarantee is never broken for it.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_helpers import (
    apply,
    build,
    cycle,
    finish,
    node,
    on,
    project,
    running_ids,
    snap,
    submit,
    train,
    violations,
)

from gpupool.policy import BUILD_POOL, TRAIN_POOL, Kind, Snapshot, schedule

BOTH = frozenset({BUILD_POOL, TRAIN_POOL})


def _ids(items) -> list[str]:
    return sorted(x.workload_id for x in items)


def _full_shared_node(min_runtime_s: float = 60.0) -> Snapshot:
    """One 4-GPU node in both pools, full of training: A (guarantee 2) runs a0, a1 within it;
    B (guarantee 1) runs b0 within it and b1 beyond it (preemptible). K has a 1-GPU build quota."""
    return snap(
        [node("n1", 4, pools=BOTH)],
        [project("A", 2), project("B", 1), project("K", build=1)],
        [on(train("a0", "A"), "n1", 0, started=0), on(train("a1", "A"), "n1", 1, started=0),
         on(train("b0", "B", prio=1), "n1", 2, started=0), on(train("b1", "B"), "n1", 3, started=900)],
        now=1000, min_runtime_s=min_runtime_s,
    )


def test_kernel_pauses_one_preemptible_training_job_and_starts_in_the_same_cycle() -> None:
    assert schedule(_full_shared_node()).preemptible == ("b1",)
    s = submit(_full_shared_node(), build("k", "K", milli=250, t=999))
    d = schedule(s)
    # b1 started 100 s ago (past the minimum run time); the preemptible job goes, not a within-guarantee one
    assert _ids(d.preempts) == ["b1"]
    (start,) = d.starts
    assert start.workload_id == "k" and not start.preemptible
    assert start.assignment.gpus == (("n1-g3", 250),)  # on the GPU its victim leaves
    reason = d.preempts[0].reason
    assert "notebook kernel k of project K" in reason and "build quota" in reason
    assert "project B" in reason and "over its 1 GPU guarantee" in reason
    assert "after pausing training job b1" in start.reason and "build quota" in start.reason
    after = apply(s, d)
    assert violations(after) == []
    assert running_ids(after) == {"a0", "a1", "b0", "k"}


def test_minimum_run_time_does_not_protect_a_preemptible_job_from_a_kernel() -> None:
    s = _full_shared_node()
    young = tuple(dataclasses.replace(w, started_at=995.0) if w.id == "b1" else w for w in s.workloads)
    s = submit(dataclasses.replace(s, workloads=young), build("k", "K", milli=250))
    d = schedule(s)
    assert _ids(d.preempts) == ["b1"] and _ids(d.starts) == ["k"]


def test_one_paused_job_makes_room_for_several_kernels_on_its_gpu() -> None:
    s = submit(_full_shared_node(), *(build(f"k{i}", "K", milli=250, t=i) for i in range(4)))
    d = schedule(s)
    assert _ids(d.preempts) == ["b1"]
    assert _ids(d.starts) == ["k0", "k1", "k2", "k3"]
    assert {st.assignment.gpus[0][0] for st in d.starts} == {"n1-g3"}
    assert violations(apply(s, d)) == []


def test_fractional_kernel_takes_the_gpu_needing_fewest_victims() -> None:
    """g0 holds four quarter-GPU jobs, g1 two half-GPU jobs, all preemptible (no guarantees).
    A 0.75 kernel needs three victims on g0 or two on g1: two on g1 it is, although g0's come
    first in victim order (lower priority)."""
    jobs = [on(train(f"q{i}", "A", milli=250, prio=0), "n1", 0, started=0) for i in range(4)]
    jobs += [on(train(f"h{i}", "B", milli=500, prio=1), "n1", 1, started=0) for i in range(2)]
    s = snap([node("n1", 2, pools=BOTH)], [project("A"), project("B"), project("K", build=1)],
             jobs + [build("k", "K", milli=750)], now=1000)
    d = schedule(s)
    assert _ids(d.preempts) == ["h0", "h1"]
    (start,) = d.starts
    assert start.assignment.gpus == (("n1-g1", 750),)
    assert violations(apply(s, d)) == []


def test_victims_come_from_the_project_most_above_its_fair_share_then_lowest_priority() -> None:
    """A and B run only preemptible jobs (no guarantees). With B's pending job, B's fair share is 2
    (weight 3) and A's 2, so A (running 3) is the furthest above its share: A's lowest-priority job
    goes, even though B's running job has a lower priority still (priority does not cross projects)."""
    jobs = [on(train("a0", "A", prio=2), "n1", 0, started=0), on(train("a1", "A", prio=1), "n1", 1, started=0),
            on(train("a2", "A", prio=3), "n1", 2, started=0), on(train("b0", "B", prio=0), "n1", 3, started=0)]
    s = snap([node("n1", 4, pools=BOTH)], [project("A"), project("B", weight=3.0), project("K", build=1)],
             jobs + [train("b1", "B", t=5), build("k", "K", gpus=1)], now=1000)
    d = schedule(s)
    assert _ids(d.preempts) == ["a1"]
    assert _ids(d.starts) == ["k"]
    assert "fair share 2 GPUs" in d.preempts[0].reason


def test_over_quota_kernel_is_still_rejected_and_pauses_nothing() -> None:
    s = submit(_full_shared_node(), build("k0", "K", milli=750, t=0), build("k1", "K", milli=500, t=1))
    d = schedule(s)
    assert _ids(d.starts) == ["k0"]
    assert _ids(d.rejects) == ["k1"]
    assert "build quota of 1 GPU" in d.rejects[0].reason
    assert _ids(d.preempts) == ["b1"]  # paused for k0 only


def test_build_work_is_never_paused_for_a_kernel() -> None:
    """The shared node is full of other projects' kernels: a kernel within its quota waits; nothing is paused."""
    kernels = [on(build(f"x{i}", "X", gpus=1), "n1", i, started=0) for i in range(4)]
    s = snap([node("n1", 4, pools=BOTH)], [project("X", build=4), project("K", build=1)],
             kernels + [build("k", "K", milli=250)], now=1000)
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    (wait,) = d.waits
    assert "more build quota is handed out than the pool holds" in wait.reason


def test_kernel_never_breaks_another_projects_guarantee() -> None:
    """A's four jobs are all within its guarantee of 4: the admin handed out 4 GPUs of guarantee and
    1 of build quota on a 4-GPU node. The kernel waits and says so; A keeps its guarantee."""
    s = snap([node("n1", 4, pools=BOTH)], [project("A", 4), project("K", build=1)],
             [on(train(f"a{i}", "A"), "n1", i, started=0) for i in range(4)] + [build("k", "K", milli=250)],
             now=1000)
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    (wait,) = d.waits
    assert "within other projects' guarantees" in wait.reason and "build quota" in wait.reason


def test_several_pauses_together_never_break_another_projects_guarantee() -> None:
    """Y (guarantee 3) runs 6 GPUs: y0 and y3 on a train-only node; y1 (not preemptible, but pausing it
    alone leaves Y at 4) and y2 (beyond the guarantee) fill the 4-GPU shared node. A 4-GPU kernel would
    need both paused, leaving Y at 2: it waits. A 2-GPU kernel pauses y2 only."""
    nodes = [node("n1", 4, pools=BOTH), node("n2", 4)]
    jobs = [on(train("y0", "Y", gpus=1, prio=2), "n2", 0, started=0),
            on(train("y1", "Y", gpus=2, prio=1), "n1", 0, 1, started=0),
            on(train("y2", "Y", gpus=2, prio=0), "n1", 2, 3, started=0),
            on(train("y3", "Y", gpus=1, prio=0), "n2", 1, started=0)]
    s = snap(nodes, [project("Y", 3), project("K", build=4)], jobs + [build("k", "K", gpus=4)], now=1000)
    assert sorted(schedule(snap(nodes, [project("Y", 3)], jobs)).preemptible) == ["y2", "y3"]
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    assert "within other projects' guarantees" in d.waits[0].reason
    d = schedule(snap(nodes, [project("Y", 3), project("K", build=4)], jobs + [build("k", "K", gpus=2)], now=1000))
    assert _ids(d.preempts) == ["y2"] and _ids(d.starts) == ["k"]


def test_embedded_default_kernel_pauses_its_own_projects_training() -> None:
    """The embedded default: one project whose guarantee is every GPU of a machine serving both pools.
    Its training is never preemptible, yet its kernel within quota starts at once, by pausing one of
    the project's own jobs (the lowest priority, then the youngest) even within the minimum run time."""
    jobs = [on(train("t0", "P", prio=1), "n1", 0, started=990), on(train("t1", "P"), "n1", 1, started=900),
            on(train("t2", "P"), "n1", 2, started=995), on(train("t3", "P", prio=1), "n1", 3, started=999)]
    s = snap([node("n1", 4, pools=BOTH)], [project("P", 4, build=1)], jobs + [build("k", "P", milli=500)],
             now=1000, min_runtime_s=60.0)
    d = schedule(s)
    assert _ids(d.preempts) == ["t2"]
    assert "of the same project P" in d.preempts[0].reason
    assert _ids(d.starts) == ["k"] and d.starts[0].assignment.gpus == (("n1-g2", 500),)
    # the next cycles: t2 (within its guarantee, so no backoff) does not flap back onto the kernel's GPU
    s = apply(s, d)
    for advance in (1, 40, 100):
        s, d = cycle(s, advance=advance)
        assert d.preempts == () and d.starts == ()
        assert "k" in running_ids(s)
    s = finish(s, "k")
    s, d = cycle(s, advance=1)
    assert _ids(d.starts) == ["t2"] and d.preempts == ()


def test_a_kernel_that_cannot_pause_anything_does_not_stop_another_projects_kernel() -> None:
    """Same shape, two projects: X's kernel may not break P's guarantee and waits; P's own kernel
    (asked later) pauses P's own job. What one project may pause is not what another may."""
    s = snap([node("n1", 2, pools=BOTH)], [project("P", 2, build=1), project("X", build=1)],
             [on(train("t0", "P"), "n1", 0, started=0), on(train("t1", "P"), "n1", 1, started=0),
              build("kx", "X", milli=500, t=1), build("kp", "P", milli=500, t=2)], now=1000)
    d = schedule(s)
    assert _ids(d.starts) == ["kp"] and len(d.preempts) == 1
    assert "of the same project P" in d.preempts[0].reason
    # kx then fits beside kp on the half GPU left: one paused job seats both
    s, d = cycle(apply(s, d), advance=1)
    assert _ids(d.starts) == ["kx"] and d.preempts == ()


def test_another_projects_job_within_its_guarantee_is_protected_by_minimum_run_time_only() -> None:
    """Y (guarantee 3) runs y0 (2 GPUs) and y2 (1 GPU, beyond the guarantee) on a train-only node, and
    y1, a 2-GPU job that crossed the guarantee, on the 2-GPU shared node: pausing y1 leaves Y at 3.
    The kernel may pause it once it has run the minimum run time; before that it waits and says why."""
    nodes = [node("n1", 2, pools=BOTH), node("n2", 4)]
    projects = [project("Y", 3), project("K", build=1)]
    jobs = [on(train("y0", "Y", gpus=2, prio=1), "n2", 0, 1, started=0),
            on(train("y1", "Y", gpus=2), "n1", 0, 1, started=990),
            on(train("y2", "Y", gpus=1), "n2", 2, started=995), build("k", "K", milli=250)]
    s = snap(nodes, projects, jobs, now=1000, min_runtime_s=60.0)
    d = schedule(s)
    assert d.preemptible == ("y2",)
    assert d.preempts == () and d.starts == ()
    assert "minimum run time" in d.waits[0].reason

    s, d = cycle(s, advance=60)
    assert _ids(d.preempts) == ["y1"] and _ids(d.starts) == ["k"]
    assert "keeps its 3 GPUs guarantee" in d.preempts[0].reason
    used = sum(w.assignment.total_milli for w in s.workloads if w.project == "Y" and w.assignment)
    assert used == 3000


def test_paused_job_does_not_resume_onto_the_kernels_gpu() -> None:
    s = submit(_full_shared_node(), build("k", "K", milli=250))
    s, d = cycle(s, advance=0)
    assert _ids(d.preempts) == ["b1"]
    for advance in (1, 40, 100):  # past the resume backoff too
        s, d = cycle(s, advance=advance)
        assert d.preempts == () and d.starts == ()
        (wait,) = d.waits
        assert wait.workload_id == "b1"
        assert running_ids(s) == {"a0", "a1", "b0", "k"}
    s = finish(s, "k")
    s, d = cycle(s, advance=1)
    assert _ids(d.starts) == ["b1"]


def test_kernel_asking_no_gpu_does_not_pause_training() -> None:
    s = snap([node("n1", 1, pools=BOTH, cpu=4_000)], [project("A"), project("K", build=1)],
             [on(train("a0", "A", cpu=4_000), "n1", 0, started=0),
              dataclasses.replace(build("k", "K"), request=dataclasses.replace(build("k", "K").request, cpu_milli=1000))],
             now=1000)
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    assert "asking no GPU" in d.waits[0].reason


# ------------------------------------------------------------------ property


@st.composite
def shared_full_worlds(draw: st.DrawFn) -> tuple[Snapshot, str]:
    """One or two 4-GPU nodes in both pools, filled with training by an engine cycle, and a kernel.

    The kernel's project K may have any training guarantee and run training of its own; the other
    projects have no guarantee (all their training is beyond it), so no other project's guarantee
    stands in the way. The kernel asks for what one node could hold, within K's quota.
    """
    n_nodes = draw(st.integers(1, 2))
    nodes = [node(f"n{i}", 4, pools=BOTH) for i in range(n_nodes)]
    k_guarantee = draw(st.integers(0, 4))
    projects = [project("A", weight=draw(st.sampled_from([1.0, 2.0]))), project("B"),
                project("K", k_guarantee, build=4)]
    jobs = []
    for i in range(draw(st.integers(4 * n_nodes, 4 * n_nodes + 6))):
        name = draw(st.sampled_from(["A", "B", "K"]))
        if draw(st.booleans()):
            jobs.append(train(f"t{i:02d}", name, gpus=draw(st.integers(1, 2)), prio=draw(st.integers(0, 1)), t=i))
        else:
            jobs.append(train(f"t{i:02d}", name, milli=draw(st.sampled_from([250, 500, 750])),
                              prio=draw(st.integers(0, 1)), t=i))
    first = snap(nodes, projects, jobs, now=0.0, min_runtime_s=draw(st.sampled_from([0.0, 60.0])))
    state = apply(first, schedule(first))
    state = dataclasses.replace(state, workloads=tuple(w for w in state.workloads if w.running))  # training only
    if draw(st.booleans()):
        kernel = build("k", "K", milli=draw(st.sampled_from([250, 500, 750])), t=5.0)
    else:
        kernel = build("k", "K", gpus=draw(st.integers(1, 4)), t=5.0)
    now = draw(st.sampled_from([10.0, 100.0]))  # young (within the minimum run time) or not
    return dataclasses.replace(state, workloads=state.workloads + (kernel,), now=now), "k"


def _free(s: Snapshot, skip: set[str]) -> dict[str, int]:
    free = {g.id: g.capacity_milli for n in s.nodes for g in n.gpus}
    for w in s.workloads:
        if w.assignment is not None and w.id not in skip:
            for gid, m in w.assignment.gpus:
                free[gid] -= m
    return free


@settings(max_examples=80, deadline=None)
@given(shared_full_worlds())
def test_kernel_within_quota_on_nodes_full_of_training_always_starts(world: tuple[Snapshot, str]) -> None:
    s, kid = world
    d = schedule(s)
    assert _ids(d.starts) == [kid], d.waits
    by_id = {w.id: w for w in s.workloads}
    assert all(by_id[p.workload_id].kind is Kind.TRAIN for p in d.preempts)
    assert all(p.reason and "notebook kernel k" in p.reason for p in d.preempts)
    after = apply(s, d)
    assert violations(after) == []
    # as few as needed: every victim was on the kernel's node, and without any one of them it would not fit
    (start,) = d.starts
    paused = {p.workload_id for p in d.preempts}
    assert all(by_id[v].assignment.node == start.assignment.node for v in paused)  # type: ignore[union-attr]
    for v in paused:
        free = _free(after, skip=set())
        for gid, m in by_id[v].assignment.gpus:  # type: ignore[union-attr]
            free[gid] -= m  # v back in place...
        for gid, m in start.assignment.gpus:
            free[gid] += m  # ...and the kernel not seated: is there room for it anyway?
        req = by_id[kid].request
        node_gpus = [g.id for n in s.nodes if n.name == start.assignment.node for g in n.gpus]
        if req.gpus:
            assert sum(1 for g in node_gpus if free[g] >= 1000) < req.gpus, f"{v} was not needed"
        else:
            assert max(free[g] for g in node_gpus) < req.gpu_milli, f"{v} was not needed"
    # and the next cycle does not flap: nothing more is paused for a kernel, and the kernel keeps its GPU
    # (a paused job may still pause a lower-priority job of its own project: the priority rule)
    d2 = schedule(dataclasses.replace(after, now=s.now + 1))
    assert not [p for p in d2.preempts if "kernel" in p.reason]
    assert kid in running_ids(apply(after, d2))
    assert violations(apply(after, d2)) == []
