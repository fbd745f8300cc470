"""The classic scheduling stories, told cycle by cycle.

Each test builds a small pool, runs the engine, applies its decisions the way
the service does (``test_policy_helpers.apply``) and checks what a user would
see: which jobs run, which are paused, and the reasons they are given.
"""

from __future__ import annotations

import dataclasses

from test_policy_helpers import (
    BUILD_ONLY,
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
    usage,
    violations,
)

from gpupool.policy import Kind, schedule


def _by_id(items):
    return {x.workload_id: x for x in items}


# ------------------------------------------------------------------ quota reclaim


def test_two_projects_reclaim_and_resume() -> None:
    """A runs 4 jobs on 4 GPUs; B (2 guaranteed) submits 2: two of A's pause, B's run; B ends, A resumes."""
    s = snap([node("n1", 4)], [project("A", 2), project("B", 2)],
             [train(f"a{i}", "A", t=i) for i in range(4)], now=0)
    s, d = cycle(s, advance=0)
    assert running_ids(s, "A") == {"a0", "a1", "a2", "a3"}
    assert set(d.preemptible) == set()  # flags are about running jobs; these just started
    assert sorted(st.workload_id for st in d.starts if st.preemptible) == ["a2", "a3"]

    s, d = cycle(s, advance=10)
    assert sorted(d.preemptible) == ["a2", "a3"]

    s = submit(s, train("b0", "B", t=20), train("b1", "B", t=21))
    s, d = cycle(s, advance=10)
    paused = sorted(p.workload_id for p in d.preempts)
    assert len(paused) == 2 and set(paused) <= {"a2", "a3"}
    assert sorted(st.workload_id for st in d.starts) == ["b0", "b1"]
    assert all(not st.preemptible for st in d.starts)
    reason = d.preempts[0].reason
    assert "project B" in reason and "project A" in reason and "guarantee" in reason
    assert running_ids(s) == {"a0", "a1", "b0", "b1"}
    assert violations(s) == []

    # nothing changed: no flapping
    s, d = cycle(s, advance=1)
    assert d.starts == () and d.preempts == ()
    assert {w.workload_id for w in d.waits} == {"a2", "a3"}

    s = finish(s, "b0", "b1")
    s, d = cycle(s, advance=5)
    assert sorted(st.workload_id for st in d.starts) == ["a2", "a3"]
    assert running_ids(s) == {"a0", "a1", "a2", "a3"}


def test_reclaim_never_pushes_a_project_below_its_guarantee() -> None:
    s = snap([node("n1", 4)], [project("A", 3), project("B", 2)],
             [train(f"a{i}", "A", t=i) for i in range(4)], now=0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("b0", "B", t=5), train("b1", "B", t=6))
    s, d = cycle(s, advance=100)
    assert len(d.preempts) == 1  # A keeps its 3 guaranteed GPUs
    assert usage(s, "A") == 3000 and usage(s, "B") == 1000
    waits = _by_id(d.waits)
    assert "b1" in waits


def test_min_runtime_protects_a_job_that_just_started() -> None:
    s = snap([node("n1", 2)], [project("A", 1), project("B", 1)],
             [train("a0", "A"), train("a1", "A", t=1)], now=0, min_runtime_s=60.0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("b0", "B", t=5))
    s, d = cycle(s, advance=10)  # a1 has run 10 s < 60 s
    assert d.preempts == ()
    assert "minimum run time" in _by_id(d.waits)["b0"].reason
    s, d = cycle(s, advance=60)
    assert [p.workload_id for p in d.preempts] == ["a1"]
    assert [st.workload_id for st in d.starts] == ["b0"]


def test_victims_go_lowest_priority_then_least_run_time_then_no_start_time_last() -> None:
    """B claims its guarantee from A one job at a time: A's jobs are paused in the documented order."""
    a = [
        on(train("a1", "A"), "n1", 0, started=100.0),
        on(train("a2", "A"), "n1", 1, started=200.0),
        dataclasses.replace(on(train("a3", "A"), "n1", 2), started_at=None),  # no start time: the longest run
        on(train("a4", "A", prio=1), "n1", 3, started=300.0),  # higher priority: fills A's guarantee
    ]
    s = snap([node("n1", 4)], [project("A", 1), project("B", 3)],
             a + [train(f"b{i}", "B", t=500.0 + i) for i in range(3)], now=1000.0)
    d = schedule(s)
    assert [p.workload_id for p in d.preempts] == ["a2", "a1", "a3"]
    assert sorted(st.workload_id for st in d.starts) == ["b0", "b1", "b2"]
    assert running_ids(apply(s, d), "A") == {"a4"}
    # the same with every start time known: a3 started first, so it still goes last
    a[2] = on(train("a3", "A"), "n1", 2, started=50.0)
    d = schedule(dataclasses.replace(s, workloads=tuple(a) + s.workloads[4:]))
    assert [p.workload_id for p in d.preempts] == ["a2", "a1", "a3"]


def test_a_gang_that_no_pause_can_seat_is_told_so_not_that_nobody_is_over_quota() -> None:
    """X runs above its guarantee, but only on a node with too few cores for Y's gang."""
    small, big = node("a", 2, cpu=4000), node("b", 2, cpu=16_000)
    work = [on(train("x1", "X"), "a", 0), on(train("x2", "X"), "a", 1),
            on(train("z1", "Z"), "b", 0), on(train("z2", "Z"), "b", 1),
            train("y1", "Y", prio=1, t=10), train("y2", "Y", gpus=2, cpu=8000, t=10)]
    d = schedule(snap([small, big], [project("X"), project("Y", 3), project("Z", 2)], work, now=100.0))
    assert [p.workload_id for p in d.preempts] == ["x1"]  # for y1, which fits on a
    (wait,) = [w for w in d.waits if w.workload_id == "y2"]
    assert "pausing jobs above their guarantee would not free a node that fits it" in wait.reason
    assert "no other project runs above its guarantee" not in wait.reason


# ------------------------------------------------------------------ priority


def test_priority_preemption_within_a_project() -> None:
    s = snap([node("n1", 2)], [project("A", 2)], [train("lo0", "A")], now=0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("lo1", "A", t=1))
    s, _ = cycle(s, advance=10)
    s = submit(s, train("hi", "A", prio=5, t=10))
    s, d = cycle(s, advance=100)
    assert [p.workload_id for p in d.preempts] == ["lo1"]  # least run time among equals
    assert "higher-priority job hi" in d.preempts[0].reason
    assert [st.workload_id for st in d.starts] == ["hi"]
    # the paused low-priority job does not push back
    s, d = cycle(s, advance=100)
    assert d.preempts == () and d.starts == ()


def test_lower_priority_job_of_another_project_is_not_a_priority_victim() -> None:
    """Priority preemption stays inside a project; across projects only guarantees reclaim."""
    s = snap([node("n1", 2)], [project("A", 1), project("B", 1)],
             [train("a0", "A"), train("b0", "B", t=1)], now=0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("a-hi", "A", prio=9, t=10))
    s, d = cycle(s, advance=100)
    assert [p.workload_id for p in d.preempts] == ["a0"]  # its own lower-priority job, not B's
    assert "b0" in running_ids(s)


# ------------------------------------------------------------------ build quota


def test_build_over_quota_is_rejected_naming_project_quota_and_holders() -> None:
    s = snap([node("b1", 2, model="T4", pools=BUILD_ONLY, gpu_mem=16_384)], [project("vision", build=0.5)],
             [build("k1", "vision", milli=250, t=0), build("k2", "vision", milli=250, t=1),
              build("k3", "vision", milli=250, t=2)])
    d = schedule(s)
    assert [st.workload_id for st in d.starts] == ["k1", "k2"]
    assert all(not st.preemptible for st in d.starts)
    (rej,) = d.rejects
    assert rej.workload_id == "k3"
    assert "vision" in rej.reason and "0.5 GPUs" in rej.reason and "k1" in rej.reason and "k2" in rej.reason


def test_build_within_quota_but_pool_full_waits() -> None:
    s = snap([node("b1", 1, pools=BUILD_ONLY)], [project("A", build=1), project("B", build=1)],
             [build("ka", "A", gpus=1, t=0), build("kb", "B", gpus=1, t=1)])
    d = schedule(s)
    assert [st.workload_id for st in d.starts] == ["ka"]
    (w,) = d.waits
    assert w.workload_id == "kb" and "build quota" in w.reason and "no room" in w.reason


def test_build_work_is_never_paused() -> None:
    shared = node("n1", 2, pools=frozenset({"build", "train"}))
    s = snap([shared], [project("A", 0, build=1), project("B", 2)], [build("ka", "A", gpus=1)], now=0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("b0", "B", t=1), train("b1", "B", t=2))
    s, d = cycle(s, advance=100)
    assert d.preempts == ()
    assert "ka" in running_ids(s)
    assert [st.workload_id for st in d.starts] == ["b0"]


def test_build_memory_request_becomes_a_fraction_of_its_gpu() -> None:
    s = snap([node("b1", 1, pools=BUILD_ONLY, gpu_mem=40_000)], [project("A", build=1)],
             [build("k", "A", mem_mib=10_000)])
    (st,) = schedule(s).starts
    assert st.assignment.gpus[0][1] == 250


# ------------------------------------------------------------------ limits, weights


def test_training_limit_is_respected() -> None:
    s = snap([node("n1", 8)], [project("A", 1, limit=3)], [train(f"a{i}", "A", t=i) for i in range(5)])
    d = schedule(s)
    assert len(d.starts) == 3
    waits = _by_id(d.waits)
    assert set(waits) == {"a3", "a4"} and all("limit" in w.reason for w in waits.values())


def test_job_larger_than_limit_is_rejected() -> None:
    s = snap([node("n1", 8)], [project("A", 1, limit=2)], [train("big", "A", gpus=4)])
    (rej,) = schedule(s).rejects
    assert "limit" in rej.reason


def test_idle_capacity_is_shared_by_weight() -> None:
    s = snap([node("n1", 8)], [project("A", 0, weight=3), project("B", 0, weight=1)],
             [train(f"a{i}", "A", t=i) for i in range(10)] + [train(f"b{i}", "B", t=i) for i in range(10)])
    d = schedule(s)
    started = [st.workload_id for st in d.starts]
    assert sum(1 for x in started if x.startswith("a")) == 6
    assert sum(1 for x in started if x.startswith("b")) == 2
    assert all(st.preemptible for st in d.starts)


def test_project_furthest_below_fair_share_goes_first() -> None:
    s = snap([node("n1", 4)], [project("A", 0), project("B", 0)],
             [train("a0", "A", t=0), train("a1", "A", t=1), train("a2", "A", t=2),
              train("b0", "B", t=50), train("b1", "B", t=51), train("b2", "B", t=52)])
    d = schedule(s)
    started = [st.workload_id for st in d.starts]
    assert sorted(started) == ["a0", "a1", "b0", "b1"]


# ------------------------------------------------------------------ gang and starvation


def test_gang_job_gets_all_gpus_on_one_node_or_waits() -> None:
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 8)],
             [train("x1", "A", gpus=3), train("x2", "A", gpus=3, t=1), train("big", "A", gpus=4, t=2)])
    d = schedule(s)
    started = {st.workload_id: st.assignment for st in d.starts}
    assert set(started) == {"x1", "x2"}
    for a in started.values():
        assert len(a.gpus) == 3
    assert "big" in _by_id(d.waits)


def test_starving_gang_job_reserves_the_closest_node() -> None:
    """A 4-GPU job waits past starvation_s: the node closest to fitting takes no new work until it fits."""
    nodes = [node("n1", 4), node("n2", 4)]
    running = [
        on(train("r1", "A", t=0), "n1", 0, started=0),
        on(train("r2", "A", gpus=2, t=0), "n2", 0, 1, started=0),
    ]
    s = snap(nodes, [project("A", 8)], running, now=0, starvation_s=300.0)
    s = submit(s, train("big", "A", gpus=4, t=10))
    s = submit(s, *[train(f"s{i}", "A", t=20 + i) for i in range(8)])

    # before the starvation time: small jobs backfill around the big one
    s0, d0 = cycle(s, advance=50)
    assert "big" in _by_id(d0.waits)
    assert "reserved" not in _by_id(d0.waits)["big"].reason
    assert len(d0.starts) == 5

    # after: the node closest to fitting (n1: 3 of 4 free) is reserved; small jobs go elsewhere
    s1, d1 = cycle(s, advance=400)
    reason = _by_id(d1.waits)["big"].reason
    assert "node n1" in reason and "reserved" in reason
    assert [st.assignment.node for st in d1.starts] == ["n2", "n2"]
    assert "reserved" in _by_id(d1.waits)["s2"].reason
    # when the reserved node's job ends, the big job gets it before any small one
    s2, d2 = cycle(finish(s1, "r1"), advance=1)
    assert [st.workload_id for st in d2.starts] == ["big"]
    assert d2.starts[0].assignment.node == "n1"
    assert violations(s2) == []


def test_starvation_rule_only_reserves_up_to_the_configured_count() -> None:
    nodes = [node(f"n{i}", 4) for i in range(3)]
    running = [on(train(f"r{i}", "A", t=0), f"n{i}", 0, started=0) for i in range(3)]
    ws = [train(f"big{i}", "A", gpus=4, t=i) for i in range(3)]
    s = snap(nodes, [project("A", 12)], running + ws, now=1000, starvation_s=300.0, max_reservations=2)
    d = schedule(s)
    waits = _by_id(d.waits)
    assert sum("is reserved for it" in waits[f"big{i}"].reason for i in range(3)) == 2


def test_impossible_request_is_rejected() -> None:
    s = snap([node("n1", 4)], [project("A", 8)], [train("huge", "A", gpus=16)])
    (rej,) = schedule(s).rejects
    assert rej.workload_id == "huge" and "can ever hold 16 whole GPUs" in rej.reason


def test_unknown_project_is_rejected() -> None:
    s = snap([node("n1", 4)], [project("A", 8)], [train("x", "nope")])
    (rej,) = schedule(s).rejects
    assert "nope" in rej.reason


def test_paused_job_backs_off_on_idle_capacity() -> None:
    """A job paused for over-quota use is not restarted on idle GPUs within resume_backoff_s."""
    s = snap([node("n1", 2)], [project("A", 1), project("B", 1)],
             [train("a0", "A"), train("a1", "A", t=1)], now=0, resume_backoff_s=30.0)
    s, _ = cycle(s, advance=0)
    s = submit(s, train("b0", "B", t=2))
    s, d = cycle(s, advance=100)
    assert [p.workload_id for p in d.preempts] == ["a1"]
    # the claimant ends right away: the GPU is idle, but a1 was paused 1 s ago
    s = finish(s, "b0")
    s, d = cycle(s, advance=1)
    assert d.starts == ()
    assert "paused" in _by_id(d.waits)["a1"].reason
    s, d = cycle(s, advance=40)
    assert [st.workload_id for st in d.starts] == ["a1"]


def test_decisions_are_deterministic_and_order_free() -> None:
    ws = [train(f"j{i}", "AB"[i % 2], gpus=1 + i % 3, t=i % 5, prio=i % 2) for i in range(30)]
    s = snap([node(f"n{i}", 4) for i in range(4)], [project("A", 4), project("B", 4)], ws)
    d1 = schedule(s)
    d2 = schedule(dataclasses.replace(s, workloads=tuple(reversed(ws))))
    assert d1 == d2
    assert all(w.kind is Kind.TRAIN for w in s.workloads)


def _stream(starvation_s: float, cycles: int = 40) -> int | None:
    """A 4-GPU job amid a stream of 1-GPU jobs (2 new per second, each runs 3 s) on 2 x 4 GPUs.

    Returns the cycle in which the big job started, or None.
    """
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 8)], [train("big", "A", gpus=4, t=0)],
             now=0, starvation_s=starvation_s)
    s = submit(s, *[on(train(f"pre{i}", "A", t=0), f"n{1 + i % 2}", i // 2, started=0) for i in range(3)])
    serial = 0
    for k in range(cycles):
        done = [w.id for w in s.workloads if w.running and w.id != "big" and w.started_at + 3 <= s.now]
        s = finish(s, *done)
        s = submit(s, *[train(f"s{serial + i}", "A", t=s.now + 0.5) for i in range(2)])
        serial += 2
        s, d = cycle(s, advance=1)
        assert violations(s) == []
        if any(st.workload_id == "big" for st in d.starts):
            return k
    return None


def test_starvation_rule_lets_a_big_job_through_a_stream_of_small_ones() -> None:
    assert _stream(starvation_s=1e9) is None  # without the rule, backfill starves it
    started = _stream(starvation_s=5.0)
    assert started is not None and started <= 12


def test_paused_job_within_its_guarantee_resumes_without_backoff() -> None:
    s = snap([node("n1", 2)], [project("A", 1), project("B", 1)],
             [on(train("a0", "A"), "n1", 0, started=0), on(train("a1", "A", t=1), "n1", 1, started=10)],
             now=100, resume_backoff_s=30.0)
    s = submit(s, train("b0", "B", t=50))
    s, d = cycle(s, advance=1)
    assert [p.workload_id for p in d.preempts] == ["a1"]
    s = finish(s, "a0")
    s, d = cycle(s, advance=1)  # a1 paused 1 s ago, but now within A's guarantee: nothing can pause it again
    assert [st.workload_id for st in d.starts] == ["a1"]
    assert not d.starts[0].preemptible


def test_reclaim_frees_one_node_for_a_gang_job() -> None:
    nodes = [node("n1", 2), node("n2", 2)]
    running = [on(train(f"a{i}", "A", t=i), f"n{1 + i // 2}", i % 2, started=float(i)) for i in range(4)]
    s = snap(nodes, [project("A", 0), project("B", 2)], running + [train("gang", "B", gpus=2, t=10)], now=500)
    d = schedule(s)
    paused = [p.workload_id for p in d.preempts]
    assert len(paused) == 2
    nodes_of = {w.id: w.assignment.node for w in running}
    assert len({nodes_of[i] for i in paused}) == 1  # both on the same node
    (st,) = d.starts
    assert st.workload_id == "gang" and st.assignment.node == nodes_of[paused[0]]
    assert "freed by pausing" in st.reason


def test_victims_come_from_the_project_most_above_its_fair_share() -> None:
    running = [on(train(f"z{i}", "Z", t=i), "n1", i, started=0) for i in range(3)]
    running.append(on(train("a0", "A", t=0), "n1", 3, started=0))
    s = snap([node("n1", 4)], [project("A", 0), project("B", 1), project("Z", 0)],
             running + [train("b0", "B", t=5)], now=500)
    d = schedule(s)
    (p,) = d.preempts
    assert p.workload_id.startswith("z")  # Z runs 3 against a fair share of 2; A runs 1 against 1
    assert "project Z used 3 GPUs" in p.reason
    assert [st.workload_id for st in d.starts] == ["b0"]


def test_cpu_only_job_does_not_reclaim_gpus_of_other_projects() -> None:
    s = snap([node("n1", 1, cpu=4_000)], [project("A", 0), project("B", 1)],
             [on(train("a0", "A", cpu=4_000), "n1", 0, started=0), train("b-cpu", "B", gpus=0, cpu=2_000, t=5)],
             now=500)
    d = schedule(s)
    assert d.preempts == () and [w.workload_id for w in d.waits] == ["b-cpu"]


def test_empty_and_odd_snapshots() -> None:
    assert schedule(snap([], [], [])) == schedule(snap([], [], []))
    # a running job on a node that left the inventory still counts for its project, and is never a victim
    ghost = on(train("ghost", "A"), "gone", 0, started=0)
    s = snap([node("n1", 1)], [project("A", 0), project("B", 1)], [ghost, train("b0", "B", t=1)], now=500)
    d = schedule(s)
    assert [st.workload_id for st in d.starts] == ["b0"] and d.preempts == ()
    assert d.preemptible == ("ghost",)
    # no train pool at all: training is rejected as impossible, build still works
    s = snap([node("b1", 1, pools=BUILD_ONLY)], [project("A", 1, build=1)],
             [train("t", "A"), build("k", "A", milli=500)])
    d = schedule(s)
    assert [r.workload_id for r in d.rejects] == ["t"] and [st.workload_id for st in d.starts] == ["k"]


def test_malformed_request_is_rejected_not_crashing() -> None:
    from gpupool.policy import Request, Workload

    bad = Workload("bad", "A", Kind.TRAIN, Request(gpus=1, gpu_milli=500))
    s = snap([node("n1", 2)], [project("A", 2)], [bad, train("ok", "A")])
    d = schedule(s)
    assert [r.workload_id for r in d.rejects] == ["bad"] and [st.workload_id for st in d.starts] == ["ok"]


# ------------------------------------------------------------------ a job that crosses the guarantee


def _crossing_world(z_guarantee: float, min_runtime_s: float = 60.0):
    """E (guarantee 22) runs 16 GPUs as two 8-GPU gangs; Z fills the other two nodes with 16 one-GPU jobs."""
    nodes = [node(f"n{i}", 8) for i in range(1, 5)]
    running = [on(train("e-a", "E", gpus=8), "n1", *range(8)), on(train("e-b", "E", gpus=8), "n2", *range(8))]
    running += [on(train(f"z{i:02d}", "Z", t=i), f"n{3 + i // 8}", i % 8, started=float(i)) for i in range(16)]
    return snap(nodes, [project("E", 22), project("Z", z_guarantee)], running, now=1000,
                min_runtime_s=min_runtime_s, resume_backoff_s=30.0)


def test_project_below_its_guarantee_starts_a_gang_that_takes_it_past_the_guarantee() -> None:
    """The 22/16/8 story: E is 6 GPUs short of its guarantee and its next job needs 8.

    E claims its guarantee with that job: one node of Z's over-guarantee jobs is
    paused (Z keeps its 8), the gang starts, and it is not preemptible: pausing
    it would take E back below its guarantee. Nothing flaps afterwards.
    """
    s = submit(_crossing_world(z_guarantee=8), train("e-c", "E", gpus=8, t=900))
    s, d = cycle(s, advance=0)
    assert len(d.preempts) == 8 and {p.workload_id[0] for p in d.preempts} == {"z"}
    (st,) = d.starts
    assert st.workload_id == "e-c" and not st.preemptible
    assert "not preemptible" in st.reason and "22 GPUs" in st.reason
    assert usage(s, "E") == 24_000 and usage(s, "Z") == 8_000
    assert violations(s) == []
    # the next cycles, well past the minimum run time and the resume backoff: nothing moves
    for _ in range(5):
        s, d = cycle(s, advance=100)
        assert d.starts == () and d.preempts == ()
        assert "e-c" not in d.preemptible
        assert usage(s, "E") == 24_000 and usage(s, "Z") == 8_000


def test_crossing_job_never_pushes_another_project_below_its_guarantee() -> None:
    """Z runs 16 against a guarantee of 10: freeing a whole node would leave Z at 8, so E's gang waits."""
    s = submit(_crossing_world(z_guarantee=10), train("e-c", "E", gpus=8, t=900))
    s, d = cycle(s, advance=0)
    assert d.preempts == () and d.starts == ()
    (w,) = d.waits
    assert "would not free a node" in w.reason
    assert usage(s, "Z") == 16_000


def test_crossing_job_on_idle_gpus_is_protected_from_other_claimants() -> None:
    """E starts its crossing gang on an idle node; B, below its own guarantee, cannot pause it later."""
    nodes = [node("n1", 8), node("n2", 8), node("n3", 8)]
    running = [on(train("e-a", "E", gpus=8), "n1", *range(8)), on(train("e-b", "E", gpus=8), "n2", *range(8))]
    s = snap(nodes, [project("E", 22), project("B", 2)], running + [train("e-c", "E", gpus=8, t=5)], now=1000)
    s, d = cycle(s, advance=0)
    (st,) = d.starts
    assert st.workload_id == "e-c" and not st.preemptible
    s = submit(s, train("b0", "B", t=1100))
    s, d = cycle(s, advance=500)
    assert d.preempts == () and d.starts == ()
    assert d.preemptible == ()  # E runs 24 of 22, but every one of its jobs holds part of the guarantee
    (w,) = d.waits
    assert w.workload_id == "b0"


def test_only_jobs_wholly_beyond_the_guarantee_are_preemptible() -> None:
    """E (guarantee 22) runs 16 + 8 + two more one-GPU jobs: only the one-GPU jobs are flagged."""
    nodes = [node(f"n{i}", 8) for i in range(1, 5)]
    running = [on(train("e-a", "E", gpus=8), "n1", *range(8), started=0),
               on(train("e-b", "E", gpus=8), "n2", *range(8), started=1),
               on(train("e-c", "E", gpus=8), "n3", *range(8), started=2),
               on(train("e-d", "E", t=3), "n4", 0, started=3),
               on(train("e-e", "E", t=4), "n4", 1, started=4)]
    running += [on(train(f"z{i}", "Z", t=i), "n4", 2 + i, started=0) for i in range(6)]  # Z within its guarantee
    projects = [project("E", 22), project("B", 3), project("Z", 6)]
    assert sorted(schedule(snap(nodes, projects, running, now=1000)).preemptible) == ["e-d", "e-e"]
    s = snap(nodes, projects, running + [train("b0", "B", gpus=2, t=10)], now=1000)
    d = schedule(s)
    # pausing both one-GPU jobs takes E to 24, still at least its guarantee
    assert sorted(p.workload_id for p in d.preempts) == ["e-d", "e-e"]
    assert [st.workload_id for st in d.starts] == ["b0"]


def test_gang_that_no_pause_can_seat_waits_with_the_reason() -> None:
    """A's over-guarantee jobs are one per node beside C's guaranteed ones: no node can be freed for B's pair."""
    nodes = [node(f"n{i}", 2) for i in range(3)]
    running = [on(train(f"a{i}", "A", t=i), f"n{i}", 0, started=0) for i in range(3)]
    running += [on(train(f"c{i}", "C", t=i), f"n{i}", 1, started=0) for i in range(3)]
    s = snap(nodes, [project("A", 0), project("B", 2), project("C", 3)], running + [train("pair", "B", gpus=2, t=450)],
             now=500)
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    (w,) = d.waits
    assert "would not free a node that fits it" in w.reason
    # one more A job on n0 in place of c0 makes the pair possible: both A jobs on n0 are paused
    running = [w for w in running if w.id != "c0"] + [on(train("a9", "A", t=9), "n0", 1, started=0)]
    d = schedule(snap(nodes, [project("A", 0), project("B", 2), project("C", 2)],
                      running + [train("pair", "B", gpus=2, t=450)], now=500))
    assert sorted(p.workload_id for p in d.preempts) == ["a0", "a9"]
    assert [st.workload_id for st in d.starts] == ["pair"]
