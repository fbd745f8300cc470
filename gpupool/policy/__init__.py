"""Pure policy core: a :class:`Snapshot` in, :class:`Decisions` out.

Nothing in this package does I/O (tests/test_policy_purity.py checks the
imports), so it runs the same in the service, in the Jupyter extension, in the
Kubernetes backend and in the benchmarks.
"""

from gpupool.policy.cache import PolicyCache
from gpupool.policy.model import (
    BUILD_POOL,
    MILLI,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Gpu,
    Kind,
    Node,
    PolicyConfig,
    Preempt,
    Project,
    Reject,
    Request,
    Snapshot,
    Start,
    Wait,
    Workload,
)
from gpupool.policy.node_rules import Expr, NodeRules, Taint, Toleration

__all__ = [
    "BUILD_POOL", "MILLI", "TRAIN_POOL", "Assignment", "Decisions", "Expr", "Gpu", "Kind",
    "Node", "NodeRules", "PolicyCache", "PolicyConfig", "Preempt", "Project", "Reject", "Request", "Snapshot",
    "Start", "Taint", "Toleration", "Wait", "Workload", "schedule",
]


def schedule(snapshot: Snapshot, cache: PolicyCache | None = None) -> Decisions:
    """Decide what starts where, what is paused and why, for one cycle.

    ``cache``: a :class:`PolicyCache` the caller keeps from cycle to cycle, so
    a cycle over nearly the same pool and queue starts from the last one's
    work; None starts from nothing. The decisions are the same either way.
    """
    from gpupool.policy.engine import schedule as _schedule

    return _schedule(snapshot, cache)
