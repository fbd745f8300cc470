"""An elastic pool (a cluster whose nodes come and go): work no node can hold now waits, never refused.

On one machine a request no node could ever hold is refused at once (waiting
would be forever). On Kubernetes the same request may fit once a node joins
or comes back from a drain: refusing it there would lose a paused job, or a
gang whose node left for a minute. These tests tell the two apart.
"""

from __future__ import annotations

import dataclasses

from gpupool.policy import Snapshot, schedule
from tests.test_policy_helpers import build, gang, node, project, snap, train


def elastic(s: Snapshot) -> Snapshot:
    """The same snapshot on a pool whose nodes come and go."""
    return dataclasses.replace(s, config=dataclasses.replace(s.config, elastic_pool=True))


def test_a_job_too_big_for_every_node_is_refused_on_a_fixed_machine():
    s = snap([node("a", gpus=4)], [project("p", guarantee=4)], [train("big", "p", gpus=8)])
    d = schedule(s)
    assert [r.workload_id for r in d.rejects] == ["big"]
    assert "can ever hold" in d.rejects[0].reason


def test_the_same_job_waits_on_an_elastic_pool_and_starts_when_a_big_node_joins():
    s = elastic(snap([node("a", gpus=4)], [project("p", guarantee=4)], [train("big", "p", gpus=8)]))
    d = schedule(s)
    assert d.rejects == ()
    (w,) = d.waits
    assert w.workload_id == "big"
    assert "no node of the train pool can hold 8 whole GPUs on one node now" in w.reason
    assert "waits for such a node to join the pool" in w.reason
    grown = dataclasses.replace(s, nodes=s.nodes + (node("b", gpus=8),))
    d2 = schedule(grown)
    assert [(x.workload_id, x.assignment.node) for x in d2.starts] == [("big", "b")]


def test_a_gang_whose_nodes_left_waits_on_an_elastic_pool_and_restarts_whole_when_they_return():
    # 2 x 4 GPUs; only one 4-GPU node is left in the pool (the other was drained)
    g = gang("g", "p", replicas=2, gpus=4)
    s = snap([node("a", gpus=4)], [project("p", guarantee=8)], g)
    fixed = schedule(s)
    assert {r.workload_id for r in fixed.rejects} == {w.id for w in g}
    d = schedule(elastic(s))
    assert d.rejects == () and d.starts == ()
    assert {w.workload_id for w in d.waits} == {w.id for w in g}
    assert all("waits for nodes to join the pool" in w.reason for w in d.waits)
    back = elastic(snap([node("a", gpus=4), node("b", gpus=4)], [project("p", guarantee=8)], g))
    d2 = schedule(back)
    assert sorted(x.assignment.node for x in d2.starts) == ["a", "b"]


def test_an_elastic_pool_still_refuses_what_no_pool_could_fix():
    # over the project's own training limit, or a project that does not exist: no node joining helps
    s = elastic(snap([node("a", gpus=8)], [project("p", limit=2)],
                     [train("over", "p", gpus=4), train("orphan", "nope", gpus=1)]
                     + gang("g", "p", replicas=2, gpus=2)))
    d = schedule(s)
    assert {r.workload_id for r in d.rejects} == {"over", "orphan", "g-0", "g-1"}
    assert not d.starts and not d.waits


def test_a_build_share_no_build_node_can_hold_waits_on_an_elastic_pool():
    s = snap([node("a", gpus=2, pools=frozenset({"build"}), gpu_mem=16_384)], [project("p", build=2)],
             [build("k", "p", mem_mib=40_000)])
    assert [r.workload_id for r in schedule(s).rejects] == ["k"]
    d = schedule(elastic(s))
    assert d.rejects == () and [w.workload_id for w in d.waits] == ["k"]
