"""The service's first-fit fallback policy (used only for a cycle where the engine fails)."""

from __future__ import annotations

from gpupool.policy.model import TRAIN_POOL, Gpu, Kind, Node, Project, Request, Snapshot, Workload
from gpupool.service import fallback_policy


def test_fallback_never_starts_whole_gpu_work_on_a_gpu_of_capacity_zero() -> None:
    """A GPU whose share is withheld (capacity 0) looks unused, but a whole-GPU job must take the other one."""
    node = Node("n0", 64_000, 262_144, (Gpu("n0-g0", 0, "H100", 81_920, "", 0), Gpu("n0-g1", 1, "H100", 81_920)),
                frozenset({TRAIN_POOL}))
    jobs = (Workload("a", "p", Kind.TRAIN, Request(gpus=1), submitted_at=1.0),
            Workload("b", "p", Kind.TRAIN, Request(gpus=1), submitted_at=2.0))
    d = fallback_policy.schedule(Snapshot((node,), (Project("p", train_guarantee_milli=2000),), jobs, now=10.0))
    assert [(s.workload_id, s.assignment.gpus) for s in d.starts] == [("a", (("n0-g1", 1000),))]
    assert [w.workload_id for w in d.waits] == ["b"]


def test_fallback_honours_node_selectors_and_taints() -> None:
    """Even the fallback puts a job only where its placement rules allow (issue 24, item 2)."""
    from gpupool.policy.node_rules import NodeRules, Taint

    a = Node("a", 64_000, 262_144, (Gpu("a-g0", 0, "H100", 81_920),), frozenset({TRAIN_POOL}),
             labels=(("gpu", "a100"),))
    b = Node("b", 64_000, 262_144, (Gpu("b-g0", 0, "H100", 81_920),), frozenset({TRAIN_POOL}),
             labels=(("gpu", "h100"),))
    c = Node("c", 64_000, 262_144, (Gpu("c-g0", 0, "H100", 81_920),), frozenset({TRAIN_POOL}),
             taints=(Taint("dedicated", "inference"),))
    jobs = (Workload("sel", "p", Kind.TRAIN, Request(gpus=1, rules=NodeRules(selector=(("gpu", "h100"),))),
                     submitted_at=1.0),
            Workload("x", "p", Kind.TRAIN, Request(gpus=1), submitted_at=2.0),
            Workload("y", "p", Kind.TRAIN, Request(gpus=1), submitted_at=3.0))
    d = fallback_policy.schedule(Snapshot((a, b, c), (Project("p", train_guarantee_milli=3000),), jobs, now=10.0))
    assert [(s.workload_id, s.assignment.node) for s in d.starts] == [("sel", "b"), ("x", "a")]
    assert [w.workload_id for w in d.waits] == ["y"]  # c is tainted: nothing without a toleration goes there
