"""The local backend: this machine's GPUs (NVML, or simulated from a spec) as the pool, jobs as processes.

The embedded default. One node (or a build node and a train node, with
``build_gpus``), or the nodes of a simulated pool of several
(``--simulate "node-a@rack1=8xA100-80GB;node-b=4xT4"``: every replica of a
gang still runs here, as a local process on its node's simulated GPUs). The
settings come from the app (gpupool.app.backend builds them from the
service's config), so this module needs nothing of the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.backends.local.accounts import RunAs, blocked_at, job_account
from gpupool.backends.local.executor import LocalExecutor
from gpupool.inventory import GpuInfo, GpuSample, Inventory, detect
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL, Gpu, Node
from gpupool.wire.errors import InvalidRequest


@dataclass(frozen=True)
class LocalSettings:
    """What the local backend reads of the service's config (ServiceConfig fields of the same names)."""

    jobs_dir: Path
    node_name: str
    cpu: float  # the host's cores (ServiceConfig.host_cpu())
    memory: int  # the host's memory in bytes (ServiceConfig.host_memory())
    simulate: str | None = None
    default_simulation: str = "2xA100-80GB"
    build_gpus: int | None = None
    run_jobs_as: str = "service"
    allow_root_jobs: bool = False
    job_account_template: str = "{user}"
    allowed_system_accounts: tuple[str, ...] = ()
    job_env_passthrough: tuple[str, ...] = field(default_factory=tuple)
    pause_grace_s: float = 10.0


class LocalBackend:
    """This machine: its GPUs from ``inventory`` (default: NVML or the simulation spec), jobs as processes.

    ``traversable``: jobs run as other Unix accounts (a root service), so the
    executor's job directories must let them in (see gpupool.backends.local.accounts).
    """

    elastic = False  # one machine's GPUs never change while the service runs

    def __init__(self, settings: LocalSettings, inventory: Inventory | None = None, traversable: bool = False) -> None:
        self.settings = settings
        self.inventory = inventory or detect(settings.simulate, settings.default_simulation, settings.node_name)
        self.simulated = bool(self.inventory.simulated)
        self.gpus: dict[str, GpuInfo] = {g.id: g for g in self.inventory.gpus()}
        self.nodes = _nodes(settings, self.gpus, self.inventory)
        self.executor = LocalExecutor(settings.jobs_dir, traversable=traversable, run_jobs_as=settings.run_jobs_as,
                                      allow_root_jobs=settings.allow_root_jobs,
                                      account_template=settings.job_account_template,
                                      allowed_system_accounts=settings.allowed_system_accounts,
                                      env_passthrough=settings.job_env_passthrough,
                                      gang_grace_s=settings.pause_grace_s)  # a failed replica's peers checkpoint

    def sample(self) -> dict[str, GpuSample]:
        return self.inventory.sample()

    def refresh(self) -> bool:
        """One machine's GPUs are read once: the pool never changes."""
        return False

    def admit(self, user: str, workdir: str | None, submit_dir: str | None) -> str | None:
        """The account the job will run as must exist (and may run jobs), and may enter and read its folder.

        Checked at submit, so a user with no account, or a folder the job may
        not enter, is a 4xx that says what to do, not a job that fails at
        start. A job naming no workdir runs where it was submitted from.
        """
        s = self.settings
        run_as = job_account(user, s.run_jobs_as, s.allow_root_jobs, s.job_account_template,
                             s.allowed_system_accounts)
        return _local_workdir(workdir, submit_dir, run_as)

    def health(self) -> dict[str, Any]:
        return {"backend": "local", "ok": True}

    def close(self) -> None:
        self.inventory.close()


def _local_workdir(workdir: str | None, submit_dir: str | None, run_as: RunAs | None) -> str | None:
    """Where a local train job runs: its workdir, else the folder it was submitted from, else None (a fresh one).

    Checked now for the account the job runs as, so a folder it may not
    enter is a 400 that says what to do, not a job that fails at start.
    """
    for given, what in ((workdir, "workdir"), (submit_dir, None)):
        if given is None:
            continue
        where = blocked_at(given, run_as)
        if where is None:
            return given
        account = f"account {run_as.name!r}" if run_as is not None else "the scheduler's account"
        if what is None:
            raise InvalidRequest(f"the job would run in {given} (the folder you submitted from), but its "
                                 f"{account} cannot enter and read {where}; give --workdir DIR (a folder it "
                                 "can use), or submit from one")
        raise InvalidRequest(f"workdir {given}: the job's {account} cannot enter and read {where}")
    return None


def _nodes(settings: LocalSettings, gpus: dict[str, GpuInfo], inventory: Inventory | None = None) -> tuple[Node, ...]:
    """One node serving both pools, or (``build_gpus`` = N) a build-only node of the first N GPUs and a train node;
    a simulated pool of several nodes gives its nodes, with their groups."""
    ordered = sorted(gpus.values(), key=lambda g: g.index)
    cpu_milli = int(settings.cpu * 1000)
    mem_mib = settings.memory // (1024 * 1024)

    def node(name: str, members: list[GpuInfo], pools: frozenset[str], group: str = "") -> Node:
        return Node(name, cpu_milli, mem_mib,
                    tuple(Gpu(g.id, g.index, g.model, g.memory // (1024 * 1024), g.topology_group) for g in members),
                    pools, group)

    sim_nodes = getattr(inventory, "nodes", None) if getattr(inventory, "multi_node", False) else None
    if sim_nodes is not None:
        # A simulated pool of several nodes: each serves both pools (config refuses build_gpus with it).
        return tuple(node(n.name, members, frozenset({BUILD_POOL, TRAIN_POOL}), n.group) for n, members in sim_nodes)
    if settings.build_gpus is None:
        return (node(settings.node_name, ordered, frozenset({BUILD_POOL, TRAIN_POOL})),)
    n = min(settings.build_gpus, len(ordered))
    return (node(f"{settings.node_name}-build", ordered[:n], frozenset({BUILD_POOL})),
            node(settings.node_name, ordered[n:], frozenset({TRAIN_POOL})))
