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
