"""Multi-node gangs (issue 12, policy core): stories a user of distributed training would recognise.

A gang is N replicas x G GPUs (``test_policy_helpers.gang``); the engine
starts every replica in one cycle or none, pauses them together, counts all
of them against quotas, keeps them on few nodes of one rack, and does not let
a stream of small jobs starve a big gang (docs/policy.md, "Multi-node gangs").
"""

from __future__ import annotations

import dataclasses

import numpy as np
from test_policy_helpers import (
    BUILD_ONLY,
    apply,
    build,
    cycle,
    finish,
    gang,
    node,
    on,
    partial_gangs,
    project,
    running_ids,
    snap,
    submit,
    train,
    usage,
    violations,
)

from gpupool.policy import TRAIN_POOL, schedule
from gpupool.policy.gang_nodes import choose_nodes


def _by_id(items):
    return {x.workload_id: x for x in items}


def _run(ws, nodes_by_name):
    """Place running replicas: ``ws`` with a node each, whole GPUs from slot 0 up per node."""
    used: dict[str, int] = {}
    out = []
    for w, n in zip(ws, nodes_by_name, strict=True):
        first = used.get(n, 0)
        used[n] = first + w.request.gpus
        out.append(on(w, n, *range(first, first + w.request.gpus), started=0))
    return out


# ------------------------------------------------------------------ start together or not at all


def test_two_by_eight_starts_together_on_two_free_nodes() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)], gang("g", "A", 2, 8))
    d = schedule(s)
    starts = _by_id(d.starts)
    assert set(starts) == {"g-0", "g-1"} and d.waits == ()
    assert {starts[i].assignment.node for i in starts} == {"n1", "n2"}
    assert all(len(st.assignment.gpus) == 8 for st in starts.values())
    assert all("all started together on n1, n2" in st.reason for st in starts.values())
    after = apply(s, d)
    assert violations(after) == [] and usage(after, "A") == 16_000


def test_with_one_node_busy_neither_replica_starts_and_the_reason_says_why() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)],
             [on(train("busy", "A"), "n2", 0)] + gang("g", "A", 2, 8), starvation_s=1e9)
    d = schedule(s)
    assert d.starts == () and d.preempts == ()
    waits = _by_id(d.waits)
    assert waits["g-0"].reason == waits["g-1"].reason
    reason = waits["g-0"].reason
    assert "gang g of 2 × 8 GPUs" in reason
    assert "only 1 node has room for a replica" in reason
    assert "all replicas start together or none" in reason
    assert violations(apply(s, d)) == []


def test_no_partial_hold_smaller_jobs_use_the_room_a_waiting_gang_cannot() -> None:
    """The gang does not fit: nothing is held for it, the one-GPU jobs behind it start."""
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 24)],
             [on(train("busy", "A"), "n2", 0)] + gang("g", "A", 2, 8, t=0)
             + [train(f"s{i}", "A", t=10 + i) for i in range(3)], starvation_s=1e9)
    d = schedule(s)
    assert sorted(st.workload_id for st in d.starts) == ["s0", "s1", "s2"]
    assert {"g-0", "g-1"} <= set(_by_id(d.waits))


def test_replicas_pack_onto_one_node_before_spreading() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)],
             [on(train("busy", "A", gpus=2), "n2", 0, 1)] + gang("g", "A", 4, 2))
    d = schedule(s)
    assert {st.assignment.node for st in d.starts} == {"n1"} and len(d.starts) == 4
    assert violations(apply(s, d)) == []


def test_replicas_stay_within_one_rack_when_one_can_hold_them() -> None:
    """Racks r1 (n1, n2) and r2 (n3, n4); n1 is busy: the gang goes to r2, not across n2 and r2."""
    nodes = [node("n1", 8, rack="r1"), node("n2", 8, rack="r1"), node("n3", 8, rack="r2"), node("n4", 8, rack="r2")]
    s = snap(nodes, [project("A", 32)], [on(train("busy", "A"), "n1", 0)] + gang("g", "A", 2, 8))
    d = schedule(s)
    assert sorted(st.assignment.node for st in d.starts) == ["n3", "n4"]


def test_choose_nodes_fewest_nodes_then_best_fit_then_one_group() -> None:
    room = np.array([2, 2, 1, 3])
    whole = np.array([4, 4, 2, 6])
    one = np.zeros(4, dtype=np.int64)
    # 3 replicas: node 3 alone holds them
    assert choose_nodes(room, 3, one, whole) == [(3, 3)]
    # 4: the roomiest node, then the smallest that holds the rest (best fit)
    assert choose_nodes(room, 4, one, whole) == [(3, 3), (2, 1)]
    # too many: None
    assert choose_nodes(room, 9, one, whole) is None
    # groups {0,1} and {2,3}: 4 replicas fit in either; group 0 leaves no room spare... both need 2 nodes:
    # group 0 has 4 room (0 spare), group 1 has 4 (0 spare): the lower group id wins
    groups = np.array([0, 0, 1, 1])
    assert sorted(choose_nodes(room, 4, groups, whole)) == [(0, 2), (1, 2)]
    # 6 replicas: no group holds them; the roomiest group is filled first, then the other
    picks = choose_nodes(room, 6, groups, whole)
    assert sum(n for _, n in picks) == 6 and {i for i, _ in picks} >= {0, 1}


# ------------------------------------------------------------------ a gang never runs partly


def test_partly_running_gang_is_paused_and_restarts_whole() -> None:
    g = gang("g", "A", 2, 4)
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 8)], _run(g[:1], ["n1"]) + g[1:])
    assert partial_gangs(s) == ["g"]
    s, d = cycle(s)
    assert [p.workload_id for p in d.preempts] == ["g-0"] and "restarts whole" in d.preempts[0].reason
    assert "restart together" in _by_id(d.waits)["g-1"].reason and d.starts == ()
    assert partial_gangs(s) == []
    s, d = cycle(s)
    assert sorted(st.workload_id for st in d.starts) == ["g-0", "g-1"]
    assert violations(s) == []


def test_gang_with_replicas_missing_from_the_snapshot_waits() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)], gang("g", "A", 1, 8, size=2))
    d = schedule(s)
    assert d.starts == ()
    assert "only 1 of its 2 replicas are known" in _by_id(d.waits)["g-0"].reason


def test_running_replicas_of_an_ending_gang_are_left_alone() -> None:
    """Replicas exit one by one at the end of a job: the rest keep running."""
    g = gang("g", "A", 2, 4)
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 8)], _run(g, ["n1", "n2"]))
    d = schedule(finish(s, "g-1"))
    assert d.preempts == ()


def test_malformed_gangs_are_rejected_whole() -> None:
    fraction = [dataclasses.replace(train(f"f-{k}", "A", milli=500), gang="f", gang_size=2) for k in range(2)]
    mixed = gang("m", "A", 2, 2)
    mixed[1] = dataclasses.replace(mixed[1], request=dataclasses.replace(mixed[1].request, gpus=4))
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)], fraction + mixed)
    d = schedule(s)
    rejects = _by_id(d.rejects)
    assert set(rejects) == {"f-0", "f-1", "m-0", "m-1"}
    assert "whole GPUs" in rejects["f-0"].reason and "disagree" in rejects["m-0"].reason


def test_a_gang_the_pool_can_never_hold_is_rejected() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 32)], gang("g", "A", 3, 8))
    rejects = _by_id(schedule(s).rejects)
    assert set(rejects) == {"g-0", "g-1", "g-2"}
    assert "at most 2 replicas" in rejects["g-0"].reason


# ------------------------------------------------------------------ quotas count every replica


def test_limit_counts_every_replica() -> None:
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 0, limit=8)], gang("g", "A", 2, 8))
    rejects = _by_id(schedule(s).rejects)
    assert "16 GPUs in all" in rejects["g-0"].reason and "limit of 8 GPUs" in rejects["g-1"].reason
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 0, limit=12)],
             [on(train("r", "A", gpus=8), "n1", *range(8))] + gang("g", "A", 2, 4))
    d = schedule(s)
    assert d.starts == () and "training limit" in _by_id(d.waits)["g-0"].reason


def test_a_gang_is_flagged_preemptible_whole_or_not_at_all() -> None:
    """Guarantee 4: a 2 x 4 gang crossing it is protected whole; once the project is at its guarantee,
    a second gang runs preemptible whole."""
    nodes = [node(f"n{i}", 4) for i in range(4)]
    s = snap(nodes, [project("A", 4)], gang("g", "A", 2, 4))
    d = schedule(s)
    assert [st.preemptible for st in d.starts] == [False, False]
    s = apply(s, d)
    s = submit(s, *gang("h", "A", 2, 4, t=5))
    s, d = cycle(s, advance=100)
    assert [st.preemptible for st in d.starts] == [True, True]
    s, d = cycle(s, advance=1)
    assert sorted(d.preemptible) == ["h-0", "h-1"]


def test_gang_waits_for_idle_gpus_beyond_its_guarantee_and_fair_share_counts_all_replicas() -> None:
    nodes = [node(f"n{i}", 4) for i in range(4)]
    s = snap(nodes, [project("A", 8), project("B", 8)],
             gang("a", "A", 3, 4) + [train(f"b{i}", "B", gpus=4, t=i) for i in range(2)])
    d = schedule(s)
    # A's gang is 12 GPUs (over its 8 guarantee, but A is below it: it claims it, non-preemptible);
    # B's two 4-GPU jobs take the last node... only one node is left: one B job waits
    started = sorted(st.workload_id for st in d.starts)
    assert started[:3] == ["a-0", "a-1", "a-2"]
    after = apply(s, d)
    assert usage(after, "A") == 12_000 and violations(after) == []


# ------------------------------------------------------------------ reclaim


def test_guaranteed_project_reclaims_a_whole_over_quota_gang() -> None:
    """A (no guarantee) runs a 2 x 4 gang on idle GPUs; B (4 guaranteed) asks 4 GPUs: the whole gang pauses."""
    g = gang("g", "A", 2, 4)
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 0), project("B", 4)], _run(g, ["n1", "n2"]), now=500)
    s = submit(s, train("b0", "B", gpus=4, t=400))
    s, d = cycle(s)
    assert sorted(p.workload_id for p in d.preempts) == ["g-0", "g-1"]
    assert all("gang g (all 2 replicas)" in p.reason and "project B" in p.reason for p in d.preempts)
    assert [st.workload_id for st in d.starts] == ["b0"]
    assert violations(s) == [] and running_ids(s) == {"b0"}
    # nothing changed: the gang waits whole, nothing flaps
    s, d = cycle(s, advance=1)
    assert d.starts == () and d.preempts == ()
    assert _by_id(d.waits)["g-0"].reason == _by_id(d.waits)["g-1"].reason


def test_gang_claimant_reclaims_room_for_every_replica_on_several_nodes() -> None:
    """B (8 guaranteed) submits a 2 x 4 gang; A runs one-GPU jobs over its guarantee on both nodes."""
    running = [on(train(f"a{i}", "A", t=0), f"n{1 + i % 2}", i // 2, started=0) for i in range(8)]
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 0), project("B", 8)], running, now=500)
    s = submit(s, *gang("g", "B", 2, 4, t=400))
    s, d = cycle(s)
    assert len(d.preempts) == 8
    assert sorted(st.workload_id for st in d.starts) == ["g-0", "g-1"]
    assert {st.assignment.node for st in d.starts} == {"n1", "n2"}
    assert violations(s) == []


def test_gang_claimant_pauses_nothing_when_it_cannot_find_room_for_all_replicas() -> None:
    """A keeps its 4-GPU guarantee on n2: pausing A's spare job on n1 would seat one replica of two."""
    running = [on(train("a0", "A", gpus=4), "n1", 0, 1, 2, 3, started=0),
               on(train("a1", "A", gpus=4), "n2", 0, 1, 2, 3, started=10)]
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 4), project("B", 8)], running, now=500,
             starvation_s=1e9)
    s = submit(s, *gang("g", "B", 2, 4, t=400))
    d = schedule(s)
    assert d.preempts == () and d.starts == ()
    assert "all replicas start together or none" in _by_id(d.waits)["g-0"].reason


def test_a_single_job_reclaims_a_gang_only_whole_and_only_if_the_floor_holds() -> None:
    """A has guarantee 4 and runs a 2 x 4 gang (8): pausing it would take A to 0, below its guarantee."""
    g = gang("g", "A", 2, 4)
    s = snap([node("n1", 4), node("n2", 4)], [project("A", 4), project("B", 4)], _run(g, ["n1", "n2"]),
             now=500, starvation_s=1e9)
    s = submit(s, train("b0", "B", gpus=4, t=400))
    d = schedule(s)
    assert d.preempts == () and d.starts == ()


def test_higher_priority_single_job_of_the_same_project_pauses_the_whole_gang() -> None:
    g = gang("g", "A", 2, 2, prio=0)
    s = snap([node("n1", 2), node("n2", 2)], [project("A", 0)], _run(g, ["n1", "n2"]), now=500)
    s = submit(s, train("hi", "A", gpus=2, prio=5, t=400))
    s, d = cycle(s)
    assert sorted(p.workload_id for p in d.preempts) == ["g-0", "g-1"]
    assert "higher-priority" in d.preempts[0].reason and [st.workload_id for st in d.starts] == ["hi"]
    assert violations(s) == []


def test_a_kernel_never_pauses_a_gang_replica() -> None:
    both = frozenset({"build", TRAIN_POOL})
    g = gang("g", "A", 2, 2)
    s = snap([node("n1", 2, pools=both), node("n2", 2, pools=both)], [project("A", 0, build=1)],
             _run(g, ["n1", "n2"]), now=500)
    s = submit(s, build("k", "A", milli=500))
    d = schedule(s)
    assert d.preempts == () and "k" in _by_id(d.waits)
    assert BUILD_ONLY  # (imported for symmetry with the other scenario files)


# ------------------------------------------------------------------ starvation


def _gang_stream(starvation_s: float, cycles: int = 60) -> int | None:
    """A 2 x 4 gang amid a stream of one-GPU jobs (2 new per second, each runs 3 s) on 3 x 4 GPUs.

    Returns the cycle in which the gang started, or None.
    """
    nodes = [node(f"n{i}", 4) for i in range(1, 4)]
    s = snap(nodes, [project("A", 12)], gang("big", "A", 2, 4, t=0), now=0, starvation_s=starvation_s)
    s = submit(s, *[on(train(f"pre{i}", "A", t=0), f"n{1 + i % 3}", i // 3, started=0) for i in range(4)])
    serial = 0
    for k in range(cycles):
        done = [w.id for w in s.workloads if w.running and not w.gang and w.started_at + 3 <= s.now]
        s = finish(s, *done)
        s = submit(s, *[train(f"s{serial + i}", "A", t=s.now + 0.5) for i in range(2)])
        serial += 2
        s, d = cycle(s, advance=1)
        assert violations(s) == []
        started = {st.workload_id for st in d.starts}
        assert not started & {"big-0", "big-1"} or started >= {"big-0", "big-1"}
        if "big-0" in started:
            return k
    return None


def test_a_big_gang_is_not_starved_forever_by_a_stream_of_one_gpu_jobs() -> None:
    assert _gang_stream(starvation_s=1e9) is None  # without the rule, backfill starves it
    started = _gang_stream(starvation_s=5.0)
    # bounded: it starts within starvation_s plus the run time of the jobs on its reserved nodes (3 s)
    assert started is not None and started <= 5 + 3 + 2


def test_starving_gang_reserves_nodes_for_all_replicas_as_one_reservation() -> None:
    nodes = [node(f"n{i}", 4) for i in range(1, 5)]
    running = [on(train(f"r{i}", "A", t=0), f"n{i}", 0, started=0) for i in range(1, 5)]
    s = snap(nodes, [project("A", 16)], running + gang("g", "A", 2, 4, t=0)
             + [train("late", "A", gpus=4, t=50)], now=1000, starvation_s=300.0)
    d = schedule(s)
    reason = _by_id(d.waits)["g-0"].reason
    assert "nodes n1 (3 of 4 GPUs free), n2 (3 of 4 GPUs free) are reserved for it" in reason
    # one reservation (max_reservations=1): the later starving job reserves nothing
    assert "is reserved for it" not in _by_id(d.waits)["late"].reason
    assert "reserved for starving jobs" in _by_id(d.waits)["late"].reason


def test_a_gang_spans_racks_only_when_no_rack_can_hold_it() -> None:
    nodes = [node("n1", 8, rack="r1"), node("n2", 8, rack="r1"), node("n3", 8, rack="r2")]
    s = snap(nodes, [project("A", 24)], gang("g", "A", 3, 8))
    d = schedule(s)
    assert sorted(st.assignment.node for st in d.starts) == ["n1", "n2", "n3"]


def test_replicas_respect_models_and_cpu_per_node() -> None:
    """Two A100 replicas of 4 GPUs and 40 CPUs: one per A100 node (CPU), none on the T4 node."""
    nodes = [node("t1", 8, model="T4"), node("a1", 8), node("a2", 8)]
    g = [dataclasses.replace(w, request=dataclasses.replace(w.request, gpu_models=frozenset({"A100"})))
         for w in gang("g", "A", 2, 4, cpu=40_000)]
    s = snap(nodes, [project("A", 24)], g)
    d = schedule(s)
    assert sorted(st.assignment.node for st in d.starts) == ["a1", "a2"]
    assert violations(apply(s, d)) == []


def test_gangs_like_one_that_waited_get_its_reason_under_their_own_name() -> None:
    """The verdict memo: a larger gang of the same replicas waits for the same reason, named as itself."""
    s = snap([node("n1", 8), node("n2", 8), node("n3", 8)], [project("A", 40)],
             [on(train("busy", "A"), "n2", 0), on(train("busy2", "A"), "n3", 0)]
             + gang("g", "A", 2, 8, t=0) + gang("h", "A", 3, 8, t=1), starvation_s=1e9)
    waits = _by_id(schedule(s).waits)
    assert waits["g-0"].reason.startswith("gang g of 2 × 8 GPUs: only 1 node has room for a replica")
    assert waits["h-2"].reason.startswith("gang h of 3 × 8 GPUs: only 1 node has room for a replica")
    assert waits["g-0"].reason.split(":", 1)[1] == waits["h-0"].reason.split(":", 1)[1]


def test_replicas_of_an_unknown_project_or_a_bad_request_are_each_refused_with_the_reason() -> None:
    """A gang is read once when its replicas agree, replica by replica when not: every replica gets its answer."""
    ghost = gang("x", "nobody", 3, 2)  # all replicas agree: read once
    bad = [dataclasses.replace(w, request=dataclasses.replace(w.request, cpu_milli=-1)) for w in gang("b", "A", 2, 2)]
    bad[1] = dataclasses.replace(bad[1], request=bad[0].request)  # one request object for both
    split = gang("s", "A", 2, 2)
    split[1] = dataclasses.replace(split[1], project="nobody")  # replicas disagree: read one by one
    s = snap([node("n1", 8), node("n2", 8)], [project("A", 16)], ghost + bad + split + gang("ok", "A", 2, 2))
    d = schedule(s)
    rejects = _by_id(d.rejects)
    assert {i for i in rejects if i.startswith("x-")} == {"x-0", "x-1", "x-2"}
    assert all("project 'nobody' does not exist" in rejects[f"x-{k}"].reason for k in range(3))
    assert all("cannot be negative" in rejects[f"b-{k}"].reason for k in range(2))
    assert "project 'nobody' does not exist" in rejects["s-1"].reason
    assert "gang s" in rejects["s-0"].reason  # refused because its peer is
    assert {st.workload_id for st in d.starts} == {"ok-0", "ok-1"}
