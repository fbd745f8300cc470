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

Every method but :meth:`Executor.stop` is called on the asyncio loop and must
not block on the network: a remote executor answers from a cache kept current
by its own threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.policy.model import Node


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
    e.g. its node was deleted: requeue to resume elsewhere, never a failure)
    or ``"unstartable"`` (its container cannot be started, e.g. its image
    cannot be pulled: the job fails with ``reason``, since a retry would
    meet the same image, and its GPUs are freed).
    """

    kind: str
    reason: str


class Executor(Protocol):
    """Starts, watches and stops attempts; says how each ended."""

    def launch(self, launch: Launch) -> AttemptHandle:
        """Start the attempt (or begin to: a remote start may complete later; :meth:`interrupted` tells if it failed)."""
        ...

    def alive(self, handle: AttemptHandle) -> bool:
        """Whether the attempt may still run (False once it ended, vanished or failed to start)."""
        ...

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        """The command's exit status (negative: killed by that signal), if one is recorded."""
        ...

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        """Whether the command ended before any stop reached it: then its status wins over the stop."""
        ...

    def interrupted(self, handle: AttemptHandle) -> Interrupted | None:
        """For an attempt that is no longer alive: why it has no result of its own, or None (it ended)."""
        ...

    async def stop(self, handle: AttemptHandle, grace_s: float) -> bool:
        """Ask the attempt to stop (the checkpoint signal), force it after ``grace_s``; True if it ended in time."""
        ...

    def release(self, handle: AttemptHandle) -> None:
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
    def executor(self) -> Executor:
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
