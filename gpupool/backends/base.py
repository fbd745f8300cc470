"""The seam between the service core and where jobs run: a backend (the pool) and its executor (attempts).

The core (gpupool/service/attempts.py) owns the job states and their
durability; an executor only runs attempts and reports how they ended, and a
backend says which nodes and GPUs there are. Two implement them:
:class:`gpupool.backends.local.backend.LocalBackend` (this machine; processes,
the embedded default) and :class:`gpupool.backends.kubernetes.backend.KubeBackend`
(a cluster's GPU nodes; one Pod per attempt). Keeping this small is what lets
one policy and one core run on a laptop and on a cluster alike. The service
imports this module alone of the backends; ``gpupool.app`` picks and builds
the backend (docs/design.md, "Backends and executors").

Three capabilities only some backends have, each a protocol the core checks
with ``isinstance``: :class:`AdoptsForeignPods` (work users made outside
gpupool that it queues as jobs: kubectl pods), :class:`HoldsOutsideWork`
(GPUs that work of another scheduler holds) and :class:`RunsKernelPods`
(a build share's kernel in a pod of its own).

Every method but :meth:`Executor.stop` is called on the asyncio loop and must
not block on the network: a remote executor answers from a cache kept current
by its own threads.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.policy.model import Node, Workload


@dataclass(frozen=True)
class ReplicaLaunch:
    """One replica of a multi-node gang's attempt (docs/design.md "Multi-node gangs").

    ``rank`` is 0..N-1; ``node`` the node it was placed on; ``gpu_env`` the
    GPU environment of its own GPUs (without the rendezvous variables: the
    executor adds those, since only it knows where rank 0 runs and which port
    is free); ``assignment`` its one-node wire assignment (node and GPUs).
    """

    rank: int
    node: str
    gpu_env: dict[str, str] = field(default_factory=dict)
    assignment: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Launch:
    """Everything an executor needs to start attempt ``attempt`` of a job (the core has committed it as running).

    ``gpu_env`` is :func:`gpupool.envbuilder.gpu_environment`'s output for
    the assignment; ``assignment`` is the Job's wire ``assignment`` (node and
    GPUs with their index), so a remote executor can place and re-map them.
    """

    job_id: str
    attempt: int
    command: list[str]
    workdir: str
    user: str
    project: str
    job_env: dict[str, str] = field(default_factory=dict)
    gpu_env: dict[str, str] = field(default_factory=dict)
    assignment: dict[str, Any] = field(default_factory=dict)
    image: str = ""  # a container executor's image ("" = its configured default); a local one ignores it
    # The job's node_selector / node_affinity / tolerations (wire form; {} = none): a container executor puts
    # them in its pods, so the node agrees with where the policy placed them. A local one ignores them.
    placement: dict[str, Any] = field(default_factory=dict)
    # A gang (replicas > 1): one entry per replica in rank order; empty for a
    # one-replica job, which uses gpu_env/assignment as before.
    replicas: tuple[ReplicaLaunch, ...] = ()


class AttemptHandle(Protocol):
    """A started attempt, as the core keeps it while it runs."""

    job_id: str
    attempt: int
    pid: int | None  # a local process id (stored, for re-adoption); None where there is no local process
    start_time: int


@dataclass(frozen=True)
class Recovered:
    """What recovery found for an attempt the store says is running.

    ``outcome``: ``"running"`` (``handle`` set: adopted), ``"gone"`` (it ended
    or vanished while nobody watched: ``exit_code`` when one is recorded),
    ``"not-started"`` (it provably never ran: the job goes back to the queue
    and the attempt is not counted).
    """

    outcome: str
    handle: Any = None
    exit_code: int | None = None


@dataclass(frozen=True)
class Interrupted:
    """Why an attempt that is no longer alive has no result of its own.

    ``kind``: ``"not-started"`` (e.g. the bind was refused: requeue, the
    attempt is not counted), ``"refused"`` (the cluster refused to create it,
    e.g. a ResourceQuota: ``reason`` is the cluster's message; requeued
    uncounted but held for a backoff, and failed after
    ``kube_refusals_before_failure`` refusals in a row), ``"lost"`` (it vanished with no exit status,
    e.g. its node was deleted: requeue to resume elsewhere, never a failure),
    ``"disrupted"`` (it ended because someone stopped it from outside before
    it finished: its pod deleted, evicted; the executor cannot tell who, the
    core can: with no stop intent of its own the job resumes from its
    checkpoint as for ``"lost"``, with ``reason``; with one, the exit status
    is read as for any stop) or ``"unstartable"`` (its container cannot be
    started, e.g. its image cannot be pulled: the job fails with ``reason``,
    since a retry would meet the same image, and its GPUs are freed).
    """

    kind: str
    reason: str


HandleT = TypeVar("HandleT", bound=AttemptHandle)


class Executor(Protocol, Generic[HandleT]):
    """Starts, watches and stops attempts; says how each ended.

    Generic in its handle: the core hands back only handles this executor made,
    so an executor's methods take its own handle type (a local process, a pod).
    """

    def launch(self, launch: Launch) -> HandleT:
        """Start the attempt (or begin to: a remote start may complete later; :meth:`interrupted` tells if it failed)."""
        ...

    def alive(self, handle: HandleT) -> bool:
        """Whether the attempt may still run (False once it ended, vanished or failed to start)."""
        ...

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        """The command's exit status (negative: killed by that signal), if one is recorded."""
        ...

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        """Whether the command ended before any stop reached it: then its status wins over the stop."""
        ...

    def interrupted(self, handle: HandleT) -> Interrupted | None:
        """For an attempt that is no longer alive: why it has no result of its own, or None (it ended)."""
        ...

    async def stop(self, handle: HandleT, grace_s: float) -> bool:
        """Ask the attempt to stop (the checkpoint signal), force it after ``grace_s``; True if it ended in time."""
        ...

    def release(self, handle: HandleT) -> None:
        """The attempt ended and is settled: free what it left behind (process group, finished pod)."""
        ...

    def recover(self, job_id: str, attempt: int, pid: int | None, pid_start: int | None) -> Recovered:
        """After a restart: find the attempt the store says is running."""
        ...

    def recovered(self, live: set[tuple[str, int]]) -> None:
        """Recovery is over and ``live`` are the attempts that run: anything else of ours may be cleaned up."""
        ...

    def log_path(self, job_id: str) -> Path:
        """The job's log file on this machine (what ``gpupool logs`` reads)."""
        ...

    def replica_log_path(self, job_id: str, replica: int) -> Path:
        """A multi-node gang's replica ``replica``'s own log (the job's log holds every replica's lines)."""
        ...

    def log_settled(self, job_id: str) -> bool:
        """Whether the log file already holds all the output of the job's ended attempts.

        A local process writes its log itself (always True); a pod's output is
        copied after its end, so a final job's log may still be growing.
        """
        ...

    def default_workdir(self, job_id: str) -> Path:
        """Where a job runs when its spec names no working directory."""
        ...


class Backend(Protocol):
    """What the core needs of where it runs jobs."""

    simulated: bool
    # Nodes come and go (a cluster): requests are not checked against the pool of the moment, and work no
    # node can hold now waits for one instead of being refused (PolicyConfig.elastic_pool).
    elastic: bool
    gpus: dict[str, GpuInfo]  # by GPU id
    nodes: tuple[Node, ...]  # the policy's view of the same GPUs

    @property
    def executor(self) -> Executor[Any]:
        """What runs the attempts of jobs on this backend's pool."""
        ...

    def sample(self) -> dict[str, GpuSample]:
        """Utilisation and memory now, per GPU id (empty where nothing is measured)."""
        ...

    def refresh(self) -> bool:
        """Apply the pool changes seen since the last call (on the core's loop); True if ``gpus``/``nodes`` changed."""
        ...

    def admit(self, user: str, workdir: str | None, submit_dir: str | None) -> str | None:
        """A training job of ``user`` is being submitted: refuse it now if it could never start here.

        Raises :class:`gpupool.wire.errors.Forbidden` (no account to run it
        as) or :class:`gpupool.wire.errors.InvalidRequest` (a folder its
        account cannot use), so the submit gets a 4xx that says what to do
        instead of a job that fails at start. Returns the working directory
        the job is stored with (None: the executor's default for the job).
        """
        ...

    def health(self) -> dict[str, Any]:
        """How the backend's own machinery is doing, for ``GET /status`` (e.g. an unreachable API server)."""
        ...

    def close(self) -> None:
        """Give back what the backend holds (NVML handles, watches)."""
        ...


# ---------------------------------------------------------------- optional capability: foreign work as jobs
class JobFacts(Protocol):
    """What an adopting backend reads of a job (the service's job record has these and more)."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def client_key(self) -> str | None: ...


class ForeignJobHost(Protocol):
    """What the core offers a backend that queues foreign work (:meth:`ForeignWork.sync`), on the core's loop."""

    def fingerprint(self) -> Hashable:
        """What queueing depends on besides the foreign work itself (the projects, the pool): a change re-checks it."""
        ...

    def waiting_job(self, job_id: str) -> JobFacts | None:
        """The job if it is live and waits (queued or paused), else None."""
        ...

    def is_live(self, job_id: str) -> bool:
        """Whether the job is queued, running or paused."""
        ...

    def job_for_key(self, client_key: str) -> str:
        """The id of the job (of any state) submitted with this ``client_key``, "" when none."""
        ...

    def queue(self, spec: dict[str, Any], user: str, reason: str, client_key: str) -> str:
        """Check ``spec`` (a wire JobSpec) as any submit is checked and queue it as ``user``'s job; its id.

        Raises :class:`gpupool.wire.errors.InvalidRequest` saying why it cannot be queued.
        """
        ...

    def cancel(self, job_id: str, reason: str) -> None:
        """End a waiting job ``cancelled`` with ``reason`` (its foreign work went away)."""
        ...

    def request_cycle(self) -> None:
        """Ask for a scheduling cycle soon (new jobs were queued)."""
        ...


class ForeignWork(Protocol):
    """Work users made outside gpupool for it to place (Kubernetes: pods naming ``schedulerName: gpupool``).

    The core keeps one job per piece of such work and owns the job's states;
    this side knows the work: which job stands for which, what to tell its
    author, and how to give it up. A job that stands for foreign work is never
    paused (gpupool could not recreate what it did not make): an eviction or a
    loss ends it ``cancelled``, and a user's pause is refused.
    """

    def stands_for(self, job: JobFacts) -> str | None:
        """The foreign work this job stands for, named for people (``namespace/name``), or None."""
        ...

    def track(self, job: JobFacts) -> None:
        """After a restart, before recovery: a live job found in the store; follow its work if it stands for some."""
        ...

    def sync(self, host: ForeignJobHost) -> None:
        """On the monitor's tick: queue new work as jobs, cancel waiting jobs whose work went away."""
        ...

    def on_new_work(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from any thread, cheaply, often) when new work may be waiting.

        The core then runs its monitor's tick (:meth:`sync`) at once rather than
        at its next poll: new work is queued and placed without waiting a poll
        period, as a scheduler watching its pods does.
        """
        ...

    def stopping(self, job: JobFacts, intent: str, reason: str) -> None:
        """The job is about to be stopped (``intent``: pause, preempt, cancel, shutdown, watchdog): tell its work why."""
        ...

    def rejected(self, job: JobFacts, reason: str) -> None:
        """The policy rejected the job: tell its work why (it stays unplaced)."""
        ...

    def cancelled(self, job: JobFacts, by: str, grace_s: float) -> None:
        """A user cancelled the job while its work was not running (or a build share): remove the work."""
        ...

    def evicted_reason(self, job: JobFacts) -> str:
        """The final reason of a job whose work was evicted (the job's reason says why)."""
        ...

    def lost_reason(self, job: JobFacts, reason: str) -> str:
        """The final reason of a job whose work was lost (``reason``: the executor's, or the restart's)."""
        ...

    def pause_refusal(self, job: JobFacts) -> str:
        """Why this job cannot be paused (the message of the 409)."""
        ...


@runtime_checkable
class AdoptsForeignPods(Protocol):
    """A backend whose users make work outside gpupool for it to place (the Kubernetes one: kubectl pods)."""

    foreign_pods: ForeignWork


# ---------------------------------------------------------------- optional capability: GPUs held by others
class OutsideHolding(Protocol):
    """GPUs that work outside gpupool is shown holding (another scheduler's pod)."""

    @property
    def gpu_ids(self) -> tuple[str, ...]: ...
    @property
    def holder(self) -> str:
        """Who holds them, for people (``namespace/name``)."""
        ...


class OutsideWork(Protocol):
    """Work of another scheduler on the pool's nodes: used capacity that no project owns."""

    @property
    def holdings(self) -> Sequence[OutsideHolding]: ...

    def workloads(self) -> tuple[Workload, ...]:
        """The holdings as running workloads of no project, for the policy's snapshot (placed around, never paused)."""
        ...


@runtime_checkable
class HoldsOutsideWork(Protocol):
    """A backend whose nodes also run other schedulers' work (the Kubernetes one: other schedulers' GPU pods)."""

    other_pods: OutsideWork


# ---------------------------------------------------------------- optional capability: kernels in pods
class KernelPods(Protocol):
    """Build shares whose kernel runs in a pod the backend makes (docs/design.md "Kernel pods").

    The request (``kernel_pod`` of the JobSpec) holds the kernel's HMAC key: the
    core never stores it, it hands it over here (:meth:`expect`) and forgets it.
    """

    def check(self, request: dict[str, Any]) -> None:
        """Refuse a request that could never run (``InvalidRequest``), before the share is stored."""
        ...

    def expect(self, job_id: str, user: str, request: dict[str, Any]) -> None:
        """The share ``job_id`` of ``user`` was stored with this request: keep it (in memory) until its launch."""
        ...

    def runs(self, job: JobFacts) -> bool:
        """Whether this build share's kernel runs (or is to run) in a pod of ours."""
        ...

    def launch(self, launch: Launch) -> Any:
        """Create and bind the share's kernel pod; a handle of the backend's executor (watched as any attempt).

        Raises ``RuntimeError`` when the request is no longer known (the scheduler restarted before the pod
        was made): the share then ends.
        """
        ...

    def describe(self, job_id: str) -> dict[str, Any] | None:
        """The share's pod as the Job shows it (name, ip, phase, ready, restarts, message); None when none."""
        ...

    def forget(self, job_id: str) -> None:
        """The share ended: drop what is still kept for it."""
        ...


@runtime_checkable
class RunsKernelPods(Protocol):
    """A backend that runs a build share's kernel in a pod of its own (the Kubernetes one)."""

    kernel_pods: KernelPods


def kernel_pods_of(backend: object) -> KernelPods | None:
    """The backend's :class:`KernelPods`, or None when it runs no kernel in a pod."""
    return backend.kernel_pods if isinstance(backend, RunsKernelPods) else None
