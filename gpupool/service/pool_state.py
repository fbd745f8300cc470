"""The pool as the core sees it: the backend's nodes and GPUs, what a request may ask of them, their samples.

One object the core's parts share, so a pool change (a cluster's node
leaving, seen by :meth:`PoolState.follow`) is seen by all of them at once:
the cycle places on ``nodes``, the attempts map GPU ids to their devices,
the jobs API checks requests against ``limits()``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.backends.base import Backend, HoldsOutsideWork, OutsideWork
from gpupool.backends.settings import resolve_mode
from gpupool.inventory import GpuInfo, GpuSample, sim_use
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL, Node, PolicyConfig
from gpupool.service.config import ServiceConfig
from gpupool.service.validation import PoolLimits

log = logging.getLogger("gpupool.service")


class PoolState:
    """The backend's pool now (changed only by :meth:`follow`, on the core's loop) and its GPU samples."""

    def __init__(self, config: ServiceConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.simulated: bool = bool(backend.simulated)
        self.elastic: bool = bool(getattr(backend, "elastic", False))
        self.gpus: dict[str, GpuInfo] = backend.gpus
        self.nodes: tuple[Node, ...] = backend.nodes
        self.outside: OutsideWork | None = backend.other_pods if isinstance(backend, HoldsOutsideWork) else None
        """Other schedulers' work on the pool's nodes (a backend with that capability): capacity no project owns."""
        self.sample: dict[str, GpuSample] = {}
        self.sample_t = 0.0
        self._limits: PoolLimits | None = None
        self.sim_use_dir: Path | None = self._sim_use_dir() if self.simulated else None
        """Where jobs on simulated GPUs report their use (``GPUPOOL_SIM_USE_DIR``; gpupool.inventory.sim_use)."""
        self.reported: Callable[[], dict[str, GpuSample]] | None = None
        """GPU use measured elsewhere and sent to the API (a cluster's node agents: gpupool.service.reported_use)."""

    def _sim_use_dir(self) -> Path | None:
        """``<state dir>/sim-use``: private, or (jobs running as their owners' accounts) open to all, sticky."""
        path = Path(self.config.state_dir) / "sim-use"
        try:
            path.mkdir(exist_ok=True)
            os.chmod(path, 0o1777 if resolve_mode(self.config.run_jobs_as) == "owner" else 0o700)
        except OSError:
            log.warning("cannot prepare %s: simulated jobs cannot report their GPU use", path, exc_info=True)
            return None
        return path

    def follow(self) -> bool:
        """Take the backend's pool changes (a cluster's nodes come and go); True when the pool changed."""
        if not self.backend.refresh():
            return False
        self.gpus, self.nodes = self.backend.gpus, self.backend.nodes
        self._limits = None  # the models and sizes a request may ask for follow the pool
        return True

    def limits(self) -> PoolLimits:
        """What a request may ask for; built once per pool (the inventory is read once; a cluster's changes)."""
        if self._limits is None:
            self._limits = self._build_limits()
        return self._limits

    def _build_limits(self) -> PoolLimits:
        models: dict[str, int] = {}
        for g in self.gpus.values():
            models[g.model] = max(models.get(g.model, 0), g.memory)
        max_gpus = {p: max((len(n.gpus) for n in self.nodes if p in n.pools), default=0) for p in (BUILD_POOL, TRAIN_POOL)}
        train_nodes = tuple(len(n.gpus) for n in self.nodes if TRAIN_POOL in n.pools)
        return PoolLimits(models, max_gpus, self.config.host_cpu(), self.config.host_memory(), len(self.gpus),
                          train_nodes, elastic=self.elastic)

    def policy_config(self) -> PolicyConfig:
        c = self.config
        return PolicyConfig(min_runtime_s=c.min_runtime_s, resume_backoff_s=c.resume_backoff_s,
                            starvation_s=c.starvation_s, placement=c.placement, elastic_pool=self.elastic)

    def outside_holdings(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(holder, GPU ids) of each piece of other schedulers' work, () when there is none."""
        if self.outside is None:
            return ()
        return tuple((h.holder, h.gpu_ids) for h in self.outside.holdings)

    def refresh_sample(self) -> None:
        """Read the GPUs' use now (a failed read leaves no sample rather than a stale one)."""
        try:
            self.sample = self.backend.sample()
            if self.sim_use_dir is not None:  # simulated GPUs: what the jobs report of themselves
                self.sample = {**sim_use.read(self.sim_use_dir, self.gpus), **self.sample}
            if self.reported is not None:
                self.sample = {**self.sample, **self.reported()}
        except Exception:
            log.exception("GPU sampling failed")
            self.sample = {}
        self.sample_t = time.time()

    def health(self) -> dict[str, Any]:
        return self.backend.health()
