"""Snapshots whose inventory and running work disagree: the engine decides, it does not fail.

Such snapshots happen for real: after a restart with another GPU split
between the build and train pools, or a node gone from the inventory while
its jobs are still recorded as running. In the service an engine error falls
back to a plain first-fit cycle, so each of these used to be handled and
must stay so.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_policy_helpers import BUILD_ONLY, TRAIN_ONLY, node

from gpupool.policy import (
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
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL
from gpupool.policy.placement import FreeState

BOTH = frozenset({BUILD_POOL, TRAIN_POOL})
CFG = PolicyConfig(min_runtime_s=0, resume_backoff_s=0, starvation_s=10)


def running(wid: str, project: str, request: Request, node: str, *held: tuple[str, int]) -> Workload:
    return Workload(wid, project, Kind.TRAIN, request, assignment=Assignment(node, held), started_at=0.0)


def test_a_job_on_a_node_gone_from_the_inventory_is_nobodys_victim() -> None:
    ghost = running("ghost", "hog", Request(gpus=1), "gone", ("gone-g0", 1000))
    hog = running("hog1", "hog", Request(gpus=1), "n1", ("n1-g0", 1000))
    for size in (1, 2):  # a one-GPU claimant and a gang
        nodes = (node("n1", size, pools=BOTH),)
        claim = Workload("c", "poor", Kind.TRAIN, Request(gpus=size), submitted_at=100.0)
        d = schedule(Snapshot(nodes, (Project("hog"), Project("poor", train_guarantee_milli=size * 1000)),
                              (ghost, hog, claim), now=200.0, config=CFG))
        assert [p.workload_id for p in d.preempts] == ["hog1"]
        assert [(s.workload_id, s.assignment.node) for s in d.starts] == [("c", "n1")]


def test_a_gpu_recorded_on_the_other_pools_node_holds_nothing_there() -> None:
    """A kernel recorded on the build node holding a GPU that is now the train node's (a changed split)."""
    nodes = (Node("h-build", 64_000, 262_144, (Gpu("G0", 0, "A100", 81_920),), BUILD_ONLY),
             Node("h", 64_000, 262_144, (Gpu("G1", 1, "A100", 81_920),), TRAIN_ONLY))
    stale = Workload("k1", "p", Kind.BUILD, Request(gpus=1), assignment=Assignment("h-build", (("G1", 1000),)),
                     started_at=0.0)
    projects = (Project("p", build_quota_milli=1000),)
    assert schedule(Snapshot(nodes, projects, (stale,), now=50.0, config=CFG)).starts == ()
    d = schedule(Snapshot(nodes, projects, (stale, Workload("t1", "p", Kind.TRAIN, Request(gpus=1))), now=50.0,
                          config=CFG))
    assert [(s.workload_id, s.assignment.gpus) for s in d.starts] == [("t1", (("G1", 1000),))]


def test_one_gpu_id_on_a_build_only_and_a_train_only_node() -> None:
    nodes = (Node("nb", 64_000, 262_144, (Gpu("gpu0", 0, "A100", 81_920),), BUILD_ONLY),
             Node("nt", 64_000, 262_144, (Gpu("gpu0", 0, "A100", 81_920),), TRAIN_ONLY))
    d = schedule(Snapshot(nodes, (Project("p", build_quota_milli=1000, train_guarantee_milli=1000),),
                          (Workload("t1", "p", Kind.TRAIN, Request(gpus=1)),), now=1.0, config=CFG))
    assert [(s.workload_id, s.assignment.node) for s in d.starts] == [("t1", "nt")]


def test_the_same_running_job_listed_twice_holds_twice() -> None:
    nodes = (node("n1", 1, pools=BOTH),)
    r = running("r1", "p", Request(gpu_milli=600), "n1", ("n1-g0", 600))
    d = schedule(Snapshot(nodes, (Project("p", train_guarantee_milli=1000),),
                          (r, r, Workload("x1", "p", Kind.TRAIN, Request(gpu_milli=300))), now=50.0, config=CFG))
    assert d.starts == () and [w.workload_id for w in d.waits] == ["x1"]


def test_a_starving_fraction_reserves_the_node_with_the_most_free_share_overfull_gpus_counted() -> None:
    """Node a: one GPU 200 milli over-full and one of capacity 0; node b: one GPU 100 over-full."""
    nodes = (Node("a", 64_000, 262_144, (Gpu("a-g0", 0, "A100", 81_920), Gpu("a-g1", 1, "A100", 81_920, "", 0)),
                  TRAIN_ONLY),
             node("b", 1))
    work = (running("ra", "other", Request(gpu_milli=900), "a", ("a-g0", 1200)),
            running("rb", "other", Request(gpu_milli=900), "b", ("b-g0", 1100)),
            Workload("starving", "p", Kind.TRAIN, Request(gpu_milli=500)))
    d = schedule(Snapshot(nodes, (Project("p"), Project("other")), work, now=1000.0, config=CFG))
    assert "node a (" in d.waits[0].reason and "reserved" in d.waits[0].reason


def test_a_gpu_that_reports_no_memory_never_takes_a_memory_request() -> None:
    nodes = (Node("a", 64_000, 262_144, (Gpu("a-g0", 0, "X", 0),), TRAIN_ONLY),
             node("b", 1))
    state = FreeState.from_nodes(nodes, [])
    assert state.find(Request(gpu_memory_mib=1)).node == "b"  # type: ignore[union-attr]
    busy_b = FreeState.from_nodes(nodes, [running("rb", "o", Request(gpus=1), "b", ("b-g0", 1000))])
    assert busy_b.find(Request(gpu_memory_mib=1)) is None
    assert busy_b.closest(Request(gpu_memory_mib=1)) == "b"  # the starvation rule waits for b, never a


@pytest.mark.parametrize("policy", ["default", "fgd"])
@pytest.mark.parametrize("memory", [(81_920, 81_920, 81_920), (81_920, 40_960, 40_960)])
def test_a_fraction_bound_to_a_model_finds_its_gpu_on_a_mixed_node(policy: str, memory: tuple[int, ...]) -> None:
    """One machine with an A100 first and an H100 after (the first untouched GPU is not the one it may use)."""
    node = Node("n1", 64_000, 262_144, tuple(Gpu(f"n1-g{i}", i, model, mem) for i, (model, mem)
                                             in enumerate(zip(("A100", "H100", "A100"), memory, strict=True))), BOTH)
    state = FreeState.from_nodes([node], [], policy=policy)
    a = state.find(Request(gpu_milli=500, gpu_models=frozenset({"H100"})))
    assert a is not None and a.gpus == (("n1-g1", 500),)
    d = schedule(Snapshot((node,), (Project("p", train_guarantee_milli=1000),),
                          (Workload("w", "p", Kind.TRAIN, Request(gpu_milli=500, gpu_models=frozenset({"H100"}))),),
                          now=1.0, config=dataclasses.replace(CFG, placement=policy)))
    assert [(s.workload_id, s.assignment.gpus) for s in d.starts] == [("w", (("n1-g1", 500),))]


def test_work_left_on_a_gpu_of_capacity_zero_breaks_no_placement() -> None:
    """Held share beyond a GPU's capacity makes the pool's free share negative; the scorer's weights stay finite."""
    node = Node("n0", 64_000, 262_144, (Gpu("n0-g0", 0, "H100", 40_960, "", 0), Gpu("n0-g1", 1, "H100", 81_920)),
                TRAIN_ONLY)
    held = (running("a", "p", Request(gpu_milli=700), "n0", ("n0-g0", 700)),
            running("b", "p", Request(gpu_milli=500), "n0", ("n0-g1", 500)))
    d = schedule(Snapshot((node,), (Project("p", train_guarantee_milli=2000),),
                          held + (Workload("c", "p", Kind.TRAIN, Request(gpu_milli=400)),), now=100.0, config=CFG))
    assert [(s.workload_id, s.assignment.gpus) for s in d.starts] == [("c", (("n0-g1", 400),))]


@pytest.mark.parametrize("policy", ["default", "fgd", "bestfit", "firstfit"])
def test_a_gpu_of_capacity_zero_never_takes_whole_gpu_work(policy: str) -> None:
    """A GPU whose share is withheld (capacity 0) is free of work, yet no whole-GPU job may start on it."""
    cfg = dataclasses.replace(CFG, placement=policy)
    withheld = Gpu("n0-g0", 0, "H100", 81_920, "", 0)
    jobs = (Workload("a", "p", Kind.TRAIN, Request(gpus=1)), Workload("b", "p", Kind.TRAIN, Request(gpus=1)))
    only = (Node("n0", 64_000, 262_144, (withheld,), TRAIN_ONLY),)
    d = schedule(Snapshot(only, (Project("p", train_guarantee_milli=2000),), jobs, now=100.0, config=cfg))
    assert d.starts == ()
    assert {r.workload_id for r in d.rejects} == {"a", "b"}  # no node can ever hold one
    mixed = (Node("n0", 64_000, 262_144, (withheld, Gpu("n0-g1", 1, "H100", 81_920)), TRAIN_ONLY),)
    d = schedule(Snapshot(mixed, (Project("p", train_guarantee_milli=2000),), jobs, now=100.0, config=cfg))
    assert [(s.workload_id, s.assignment.gpus) for s in d.starts] == [("a", (("n0-g1", 1000),))]
    state = FreeState.from_nodes(mixed, [], policy=policy)
    assert state.find(Request(gpus=2)) is None
