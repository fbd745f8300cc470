"""What the engine's cycle object holds, declared once for the mixins that share it.

The cycle (:class:`gpupool.policy.engine._Cycle`) is built from mixins, one
job each: reclaim, build claims, multi-node gangs and their reclaim. They
read and change the same working state (capacity, use per project, the
decisions so far). Declaring that state here, once, lets each mixin be
type-checked on its own without repeating the list; the engine sets every
attribute in its ``__init__``. Annotations only: nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.policy.capacity import Capacity
    from gpupool.policy.model import Assignment, PolicyConfig, Project, Reject, Request, Wait, Workload
    from gpupool.policy.queue import FairQueue


class CycleState:
    """The shared working state of one cycle (set by the engine's ``_Cycle.__init__``)."""

    if TYPE_CHECKING:
        cap: Capacity
        cfg: PolicyConfig
        now: float
        projects: dict[str, Project]
        pending: list[Workload]
        running: list[Workload]
        pending_replicas: dict[str, list[Workload]]  # gang id -> its pending replicas (from sort_pending)
        req_of: dict[str, Request]
        usage: dict[str, int]  # training milli-GPU in use, per project
        recent: dict[str, float]  # recent training use, per project
        shares: dict[str, float]
        milli: dict[str, int]  # running or started workload id -> milli-GPU it holds
        build_used: dict[str, int]
        train_running: dict[str, list[Workload]]
        train_capacity: int
        train_nodes: set[str]
        over_at_start: set[str]
        started: list
        preempted: dict[str, str]  # workload id -> reason, in decision order
        waits: list[Wait]
        rejects: list[Reject]
        touched: set[str]
        queue: FairQueue | None
        reserved: dict[str, str]  # node -> id of the starving job holding it
        n_reservers: int
        running_gangs: bool

        def start(self, w: Workload, req: Request, a: Assignment, note: str = "") -> None: ...
        def estimate(self, pool: str, req: Request) -> int: ...
        def fits_empty(self, pool: str, req: Request) -> bool: ...
