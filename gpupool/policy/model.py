"""The policy engine's snapshot and decision types.

Everything the engine knows arrives in one immutable :class:`Snapshot` and
everything it decides leaves in one :class:`Decisions`. Keeping both as plain
frozen dataclasses (no ORM rows, no sockets) is what lets the service, the
Jupyter extension, the Kubernetes backend and the benchmarks all drive the
same engine, and what makes its output reproducible for a given input.

GPU amounts are integers in milli-GPU (1000 = one whole GPU) so that sums
never drift the way floats do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType

from gpupool.policy.node_rules import NodeRules, Taint

MILLI = 1000
"""Milli-GPU in one whole GPU."""

LATER = MappingProxyType({"added_later": True})
"""Metadata of fields added after tests/golden was recorded: its input text leaves them out while at their default."""

BUILD_POOL = "build"
TRAIN_POOL = "train"


class Kind(str, enum.Enum):
    """What a workload is for; decides its pool and its quota rules."""

    BUILD = "build"  # interactive kernel: fixed quota, never paused
    TRAIN = "train"  # batch job: guaranteed quota, may be paused when over it


@dataclass(frozen=True)
class Gpu:
    """One physical GPU (or a simulated one)."""

    id: str  # UUID on real hardware, e.g. "GPU-5f1c..."; any unique string when simulated
    index: int  # index on its node (CUDA ordinal)
    model: str  # e.g. "A100-80GB", "V100M32"
    memory_mib: int
    topology_group: str = ""  # GPUs sharing a group talk fast (NVLink / same PCIe switch)
    capacity_milli: int = MILLI  # share the pool may hand out on this GPU (normally 1000)


@dataclass(frozen=True)
class Node:
    """A machine: CPU, memory, GPUs, and the node pools it serves."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    pools: frozenset[str] = frozenset({BUILD_POOL, TRAIN_POOL})
    # Node group (a rack, a switch): a gang's replicas go within one group when they can, since
    # traffic between replicas is cheaper there. "" = no group known (all such nodes count as one).
    group: str = ""
    # Node labels, sorted (key, value) pairs, and taints: what placement rules read (node_rules.py).
    # Both empty (the local backend) leave every node open to every workload.
    labels: tuple[tuple[str, str], ...] = field(default=(), metadata=LATER)
    taints: tuple[Taint, ...] = field(default=(), metadata=LATER)


@dataclass(frozen=True)
class Project:
    """A team or user with quotas. Quotas are in milli-GPU."""

    name: str
    build_quota_milli: int = 0  # fixed quota for build work (1.5 GPUs -> 1500)
    train_guarantee_milli: int = 0  # guaranteed training quota
    train_limit_milli: int | None = None  # max training use; None = no limit
    weight: float = 1.0  # share of idle capacity beyond guarantees
    # Recent training use, as the average milli-GPU held lately: the decayed milli-GPU-seconds
    # divided by (half-life / ln 2), so holding m all along gives m. Orders who gets idle GPUs
    # beyond guarantees and whose over-quota jobs are paused first (docs/policy.md, "Fair share
    # over time"). 0 for every project (no history kept) gives the decisions without history.
    recent_milli: float = 0.0


@dataclass(frozen=True)
class Request:
    """What a workload asks for.

    Exactly one of ``gpus`` (whole GPUs), ``gpu_milli`` (a fraction of one GPU,
    0 < m < 1000) or ``gpu_memory_mib`` (memory on one GPU, turned into the
    fraction of the GPU it lands on) is set, or none for a CPU-only workload.
    """

    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()  # empty = any model
    cpu_milli: int = 0
    memory_mib: int = 0
    # Where it may run: nodeSelector, node affinity, tolerations (node_rules.py); None = no rules.
    # Part of the request, so every memo keyed by request tells two rule sets apart.
    rules: NodeRules | None = field(default=None, metadata=LATER)


@dataclass(frozen=True)
class Assignment:
    """Where a workload runs: a node and, per GPU, the milli-GPU it holds."""

    node: str
    gpus: tuple[tuple[str, int], ...] = ()  # ((gpu id, milli), ...)

    @property
    def total_milli(self) -> int:
        gpus = self.gpus
        if len(gpus) == 1:  # the common case, read for every running job every cycle
            return gpus[0][1]
        return sum(m for _, m in gpus)


@dataclass(frozen=True)
class Workload:
    """A build kernel or a training job, pending or running.

    A paused job is simply pending again (``assignment is None``) with
    ``attempts > 0``; the engine treats it like any pending job.

    A multi-node gang (distributed training: N replicas x G GPUs) is N
    workloads sharing ``gang`` (the gang's id) and ``gang_size`` (N), one per
    replica, each with its own single-node assignment. The engine starts all
    of them in one cycle or none, and pauses them together
    (:mod:`gpupool.policy.gangs`, docs/policy.md "Multi-node gangs").
    Keeping one assignment per replica leaves capacity accounting, the held
    count and the service's per-job bookkeeping as they are.
    """

    id: str
    project: str
    kind: Kind
    request: Request
    priority: int = 0  # higher runs first
    submitted_at: float = 0.0  # seconds (any epoch, consistent within a snapshot)
    assignment: Assignment | None = None  # set while running
    started_at: float | None = None  # when the current run began
    attempts: int = 0
    paused_at: float | None = None  # when it was last paused (anti-flapping)
    gang: str = ""  # id of the multi-node gang this replica belongs to; "" = not a gang
    gang_size: int = 0  # how many replicas the gang has (all start together or none)

    @property
    def running(self) -> bool:
        return self.assignment is not None


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the policy. Defaults are what a fresh install gets."""

    min_runtime_s: float = 60.0  # a job younger than this is not paused by reclaim
    resume_backoff_s: float = 30.0  # a paused job is not restarted sooner than this unless room is plain
    starvation_s: float = 300.0  # see docs/policy.md: head-of-line reservation rule
    placement: str = "default"  # placement policy name (see gpupool.policy.placement)
    max_reservations: int = 1  # at most this many starving gang jobs hold a node reservation per cycle
    # The pool's nodes come and go (a cluster): work no node can hold *now* waits for one to join instead of
    # being refused for good (a paused job, a gang whose node left, a model not up yet are never lost).
    elastic_pool: bool = False


@dataclass(frozen=True)
class Snapshot:
    """The whole state the engine needs, taken at one instant."""

    nodes: tuple[Node, ...]
    projects: tuple[Project, ...]
    workloads: tuple[Workload, ...]
    now: float = 0.0
    config: PolicyConfig = field(default_factory=PolicyConfig)


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)  # (slots: a cycle makes one per pending job)
class Start:
    """Start (or resume) a pending workload at ``assignment``."""

    workload_id: str
    assignment: Assignment
    preemptible: bool  # True when the job runs beyond its project's guarantee
    reason: str


@dataclass(frozen=True, slots=True)  # (slots: a cycle makes one per pending job)
class Preempt:
    """Pause a running training job (checkpoint signal, requeue)."""

    workload_id: str
    reason: str


@dataclass(frozen=True, slots=True)  # (slots: a cycle makes one per pending job)
class Reject:
    """Refuse a build workload for good (over its project's fixed quota)."""

    workload_id: str
    reason: str


class Wait(tuple[str, str]):
    """Leave a workload pending, and say why: ``Wait(workload_id, reason)``, read by name.

    Immutable like the other decisions, but a tuple rather than a frozen
    dataclass: a cycle makes one per pending job (18,000 at 10,000 queued jobs
    with gangs), and the engine's hot loops build them with
    ``tuple.__new__(Wait, (workload_id, reason))``, in C, three times faster
    than a frozen dataclass sets its fields. Its ``repr`` is the dataclass form; it equals only Waits (and
    plain tuples) with the same fields.
    """

    __slots__ = ()

    def __new__(cls, workload_id: str, reason: str) -> Wait:
        return tuple.__new__(cls, (workload_id, reason))

    def __getnewargs__(self) -> tuple[str, str]:  # (pickle and copy call __new__ with these)
        return (self[0], self[1])

    @property
    def workload_id(self) -> str:
        return self[0]

    @property
    def reason(self) -> str:
        return self[1]

    def __repr__(self) -> str:
        return f"Wait(workload_id={self[0]!r}, reason={self[1]!r})"


@dataclass(frozen=True)
class Decisions:
    """The engine's output for one cycle. Lists are in a deterministic order."""

    starts: tuple[Start, ...] = ()
    preempts: tuple[Preempt, ...] = ()
    rejects: tuple[Reject, ...] = ()
    waits: tuple[Wait, ...] = ()
    preemptible: tuple[str, ...] = ()  # running jobs now over their project's guarantee
