"""The one place that picks a backend from the config and builds it, and builds the core on it.

``ServiceConfig.backend`` (``gpupool serve --backend``) names the backend:
``local`` (this machine's GPUs, jobs as processes; gpupool.backends.local) or
``kubernetes`` (a cluster's GPU nodes, jobs as pods; gpupool.backends.kubernetes).
The service core knows neither: it gets a :class:`gpupool.backends.base.Backend`
from here, and each backend gets its own settings dataclass, made here from
the service's config (docs/design.md, "Backends and executors").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.backends.base import Backend
from gpupool.backends.local.backend import LocalBackend, LocalSettings
from gpupool.backends.settings import resolve_mode
from gpupool.inventory import Inventory
from gpupool.service.config import ServiceConfig
from gpupool.service.core import SchedulerCore
from gpupool.service.cycle import PolicyFn

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.backend import KubeSettings
    from gpupool.backends.kubernetes.leader import Leadership


def local_settings(config: ServiceConfig) -> LocalSettings:
    """The local backend's settings from the service's config."""
    return LocalSettings(
        jobs_dir=config.jobs_dir, node_name=config.node_name, cpu=config.host_cpu(), memory=config.host_memory(),
        simulate=config.simulate, default_simulation=config.default_simulation, build_gpus=config.build_gpus,
        run_jobs_as=config.run_jobs_as, allow_root_jobs=config.allow_root_jobs,
        job_account_template=config.job_account_template,
        allowed_system_accounts=tuple(config.allowed_system_accounts),
        job_env_passthrough=tuple(config.job_env_passthrough), pause_grace_s=config.pause_grace_s)


def kube_settings(config: ServiceConfig) -> KubeSettings:
    """The Kubernetes backend's settings from the service's config (the kubernetes client loads only here)."""
    from gpupool.backends.kubernetes.backend import KubeSettings

    return KubeSettings(
        jobs_dir=config.jobs_dir, kubeconfig=config.kubeconfig, namespace=config.namespace, image=config.image,
        kube_scheduler_name=config.kube_scheduler_name, pause_grace_s=config.pause_grace_s,
        kube_workdir_pvc=config.kube_workdir_pvc, kube_start_timeout_s=config.kube_start_timeout_s,
        kube_pod_namespaces=config.kube_pod_namespaces, kube_kernel_home_claim=config.kube_kernel_home_claim,
        kube_kernel_home_path=config.kube_kernel_home_path)


def make_backend(config: ServiceConfig, inventory: Inventory | None = None,
                 leadership: Leadership | None = None) -> Backend:
    """The backend ``config.backend`` names: ``local`` (this machine) or ``kubernetes`` (a cluster).

    Local jobs that run as their owners' accounts (a root service) must pass
    through the executor's job directories: they are made traversable then.
    ``leadership``: the Kubernetes backend's writes are fenced by it (gpupool.app.leading).
    """
    if config.backend == "kubernetes":
        from gpupool.backends.kubernetes.backend import (
            KubeBackend,  # the kubernetes client loads only when asked for
        )

        return KubeBackend(kube_settings(config), leadership=leadership)
    traversable = resolve_mode(config.run_jobs_as) == "owner"
    return LocalBackend(local_settings(config), inventory, traversable=traversable)


def build_core(config: ServiceConfig | None = None, *, inventory: Inventory | None = None,
               backend: Backend | None = None, policy: PolicyFn | None = None,
               leadership: Leadership | None = None) -> SchedulerCore:
    """The service core on the backend the config names (or on ``backend``, tests and benchmarks).

    ``inventory`` replaces the local backend's GPUs (NVML or the simulation
    spec); ``policy`` the policy engine. The backend is built by the core
    once it holds the state directory, so a second service on the same state
    directory is refused before it starts anything. ``leadership``: this
    instance leads (gpupool.app.leading); the backend writes only while it does.
    """
    config = config or ServiceConfig()
    if backend is not None:
        given = backend
        return SchedulerCore(config, lambda: given, policy=policy)
    return SchedulerCore(config, lambda: make_backend(config, inventory, leadership), policy=policy)
