"""Each project's recent GPU use and its standing against its long-run fair share of the train pool.

A part of the core (gpupool.service.core builds it) read by the jobs API
(``GET /projects``) and the periodic work (``/metrics``), from the book's
decayed usage and what running jobs hold now (docs/design.md, "Pool and
Project": ``recent_gpu_hours`` and ``fair_share``).
"""

from __future__ import annotations

import time
from typing import Any

from gpupool.policy.fairshare import ShareInput
from gpupool.policy.model import TRAIN_POOL
from gpupool.service.book import JobBook
from gpupool.service.pool_state import PoolState
from gpupool.service.usage import fair_share_figures, fair_share_standing, gpu_hours


class Standing:
    """Usage figures of the projects, always counted up to now first."""

    def __init__(self, book: JobBook, pool: PoolState) -> None:
        self.book = book
        self.pool = pool

    def recent_gpu_hours(self) -> dict[str, dict[str, float]]:
        """Each project's decayed GPU-hours by kind, as of now (what it has held, a half-life ago counting half)."""
        now = time.time()
        usage = self.book.usage
        usage.accrue(now, self.book.held)
        out: dict[str, dict[str, float]] = {}
        for (project, kind), value in usage.at(now).items():
            out.setdefault(project, {})[kind] = gpu_hours(value)
        return out

    def fair_share_standing(self) -> dict[str, dict[str, Any]]:
        """Each project's long-run fair share of the train pool and how much of it it uses, now and lately."""
        capacity, inputs = self._share_inputs()
        usage = self.book.usage
        average = usage.average_milli(time.time(), "train")
        return fair_share_standing(capacity, inputs, average, usage.half_life_s > 0, self._train_held())

    def fair_share_figures(self, now: float) -> dict[str, tuple[float, float]]:
        """Each project's (long-run share, training use now plus lately) in milli-GPU, unrounded."""
        capacity, inputs = self._share_inputs()
        return fair_share_figures(capacity, inputs, self.book.usage.average_milli(now, "train"), self._train_held())

    def _train_held(self) -> dict[str, float]:
        """Milli-GPU each project's running training jobs hold now: the policy's "use now"."""
        return {project: float(milli) for (project, kind), milli in self.book.held.items() if kind == "train"}

    def _share_inputs(self) -> tuple[int, dict[str, ShareInput]]:
        """The train pool's capacity and every project's numbers for its long-run share (all of it wanted)."""
        capacity = sum(g.capacity_milli for n in self.pool.nodes if TRAIN_POOL in n.pools for g in n.gpus)
        inputs = {p.name: ShareInput(p.train_guarantee_milli, p.train_limit_milli, p.weight, 0)
                  for p in self.book.projects().values()}
        return capacity, inputs
