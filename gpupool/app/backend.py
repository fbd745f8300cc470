"""The backend seam of the service: the machines the core schedules on, and how it runs jobs there.

The core talks to a backend for two things: the pool (its nodes and GPUs,
with samples of their use) and an executor that starts, watches and stops a
job's attempts. ``LocalBackend`` is the embedded default: this machine's GPUs
(NVML, or simulated from a spec) as one node (or a build node and a train
node, with ``build_gpus``), or the nodes of a simulated pool of several
(``--simulate "node-a@rack1=8xA100-80GB;node-b=4xT4"``: every replica of a
gang still runs here, as a local process on its node's simulated GPUs), and
jobs as local processes. A cluster backend
(Kubernetes nodes, jobs as pods) is the second implementation to come
(issue 14); the core knows neither.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpupool.backends.base import Executor
from gpupool.backends.local.executor import LocalExecutor
from gpupool.inventory import GpuInfo, GpuSample, Inventory, detect
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL, Gpu, Node
from gpupool.service.config import ServiceConfig


class Backend(Protocol):
    """What the core needs of where it runs jobs."""

    simulated: bool
    # Nodes come and go (a cluster): requests are not checked against the pool of the moment, and work no
    # node can hold now waits for one instead of being refused (PolicyConfig.elastic_pool).
    elastic: bool
    gpus: dict[str, GpuInfo]  # by GPU id
    nodes: tuple[Node, ...]  # the policy's view of the same GPUs
    executor: Executor

    def sample(self) -> dict[str, GpuSample]:
        """Utilisation and memory now, per GPU id (empty where nothing is measured)."""
        ...

    def refresh(self) -> bool:
        """Apply the pool changes seen since the last call (on the core's loop); True if ``gpus``/``nodes`` changed."""
        ...

    def health(self) -> dict[str, Any]:
        """How the backend's own machinery is doing, for ``GET /status`` (e.g. an unreachable API server)."""
        ...

    def close(self) -> None:
        """Give back what the backend holds (NVML handles, watches)."""
        ...


class LocalBackend:
    """This machine: its GPUs from ``inventory`` (default: NVML or the simulation spec), jobs as processes.

    ``traversable``: jobs run as other Unix accounts (a root service), so the
    executor's job directories must let them in (see gpupool.backends.local.accounts).
    """

    elastic = False  # one machine's GPUs never change while the service runs

    def __init__(self, config: ServiceConfig, inventory: Inventory | None = None, traversable: bool = False) -> None:
        self.inventory = inventory or detect(config.simulate, config.default_simulation, config.node_name)
        self.simulated = bool(self.inventory.simulated)
        self.gpus: dict[str, GpuInfo] = {g.id: g for g in self.inventory.gpus()}
        self.nodes = _nodes(config, self.gpus, self.inventory)
        self.executor = LocalExecutor(config.jobs_dir, traversable=traversable, run_jobs_as=config.run_jobs_as,
                                      allow_root_jobs=config.allow_root_jobs,
                                      account_template=config.job_account_template,
                                      allowed_system_accounts=config.allowed_system_accounts,
                                      env_passthrough=config.job_env_passthrough,
                                      gang_grace_s=config.pause_grace_s)  # a failed replica's peers checkpoint

    def sample(self) -> dict[str, GpuSample]:
        return self.inventory.sample()

    def refresh(self) -> bool:
        """One machine's GPUs are read once: the pool never changes."""
        return False

    def health(self) -> dict[str, Any]:
        return {"backend": "local", "ok": True}

    def close(self) -> None:
        self.inventory.close()


def make_backend(config: ServiceConfig, inventory: Inventory | None = None, traversable: bool = False) -> Backend:
    """The backend ``config.backend`` names: ``local`` (this machine) or ``kubernetes`` (a cluster)."""
    if config.backend == "kubernetes":
        from gpupool.backends.kubernetes.backend import (
            KubeBackend,  # the kubernetes client loads only when asked for
        )

        return KubeBackend(config)
    return LocalBackend(config, inventory, traversable=traversable)


def _nodes(config: ServiceConfig, gpus: dict[str, GpuInfo], inventory: Inventory | None = None) -> tuple[Node, ...]:
    """One node serving both pools, or (``build_gpus`` = N) a build-only node of the first N GPUs and a train node;
    a simulated pool of several nodes gives its nodes, with their groups."""
    ordered = sorted(gpus.values(), key=lambda g: g.index)
    cpu_milli = int(config.host_cpu() * 1000)
    mem_mib = config.host_memory() // (1024 * 1024)

    def node(name: str, members: list[GpuInfo], pools: frozenset[str], group: str = "") -> Node:
        return Node(name, cpu_milli, mem_mib,
                    tuple(Gpu(g.id, g.index, g.model, g.memory // (1024 * 1024), g.topology_group) for g in members),
                    pools, group)

    sim_nodes = getattr(inventory, "nodes", None) if getattr(inventory, "multi_node", False) else None
    if sim_nodes is not None:
        # A simulated pool of several nodes: each serves both pools (config refuses build_gpus with it).
        return tuple(node(n.name, members, frozenset({BUILD_POOL, TRAIN_POOL}), n.group) for n, members in sim_nodes)
    if config.build_gpus is None:
        return (node(config.node_name, ordered, frozenset({BUILD_POOL, TRAIN_POOL})),)
    n = min(config.build_gpus, len(ordered))
    return (node(f"{config.node_name}-build", ordered[:n], frozenset({BUILD_POOL})),
            node(config.node_name, ordered[n:], frozenset({TRAIN_POOL})))
