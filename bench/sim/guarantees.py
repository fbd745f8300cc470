"""Guarantee violations: when a project with pending work holds less than it was promised.

Kept apart from the event loop because the definition is easy to get wrong
and is the figure the issue's goal is stated in. Per project, at every event:

* **literal** (the issue's definition): the project has pending jobs and holds
  fewer GPUs than ``min(guarantee, held + pending)``;
* **gang-aware**: the same, but only while some pending job of the project
  would fit inside its guarantee (``held + job <= guarantee``); a 32-GPU job
  of a project guaranteed 22 GPUs can never be covered by that guarantee.

A violation *episode* is a stretch of such time; only the part beyond its
first ``grace`` seconds counts (the stated bound: a job may always wait for
the next scheduling cycle). Besides seconds we count GPU-seconds: the
shortfall ``min(guarantee, held + pending) - held`` integrated over the
counted part, so a team short of one GPU for an hour weighs less than a team
short of 40.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Episode:
    """One literal violation that outlasted the grace: what a reader needs to find out why."""

    start: float
    seconds: float  # beyond the grace
    guarantee: int
    held: int  # GPUs the project held when it began
    pending: dict[int, int]  # its pending jobs then: GPUs (all replicas) -> jobs


@dataclass
class Guard:
    """One project: what it holds and wants (in GPUs, jobs counted whole), and its open episodes."""

    guarantee: int
    held: int = 0
    pending_gpus: int = 0
    pending_sizes: Counter[int] = field(default_factory=Counter)  # job GPUs (all replicas) -> pending jobs
    since: float | None = None
    since_gang: float | None = None
    seconds: float = 0.0
    seconds_gang: float = 0.0
    episodes: int = 0
    episodes_gang: int = 0
    gpu_s: float = 0.0
    gpu_s_gang: float = 0.0
    short_gpus: int = 0  # shortfall since the last check (constant between events)
    opened_with: tuple[int, dict[int, int]] = (0, {})  # held GPUs and pending job sizes when the episode began
    log: list[Episode] = field(default_factory=list)  # the literal episodes that outlasted the grace

    def add_pending(self, gpus: int) -> None:
        self.pending_gpus += gpus
        self.pending_sizes[gpus] += 1

    def drop_pending(self, gpus: int) -> None:
        self.pending_gpus -= gpus
        self.pending_sizes[gpus] -= 1
        if not self.pending_sizes[gpus]:
            del self.pending_sizes[gpus]


class GuaranteeBook:
    """Every project's guard, checked after each batch of events."""

    def __init__(self, guarantees: dict[str, int], grace: float) -> None:
        self.guards = {name: Guard(g) for name, g in guarantees.items()}
        self.grace = grace
        self._last: float | None = None

    def check(self, t: float, closing: bool = False) -> None:
        """Close the interval since the last check (state was constant in it) and open or end episodes at ``t``."""
        last = self._last
        self._last = t
        grace = self.grace
        for guard in self.guards.values():
            if last is not None and guard.short_gpus:
                if guard.since is not None:
                    guard.gpu_s += guard.short_gpus * max(0.0, t - max(last, guard.since + grace))
                if guard.since_gang is not None:
                    guard.gpu_s_gang += guard.short_gpus * max(0.0, t - max(last, guard.since_gang + grace))
            short = short_gang = False
            shortfall = 0
            if guard.pending_gpus and not closing:
                shortfall = max(0, min(guard.guarantee, guard.held + guard.pending_gpus) - guard.held)
                short = shortfall > 0
                short_gang = guard.held + min(guard.pending_sizes) <= guard.guarantee
            guard.short_gpus = shortfall
            if short and guard.since is None:
                guard.since = t
                guard.opened_with = (guard.held, dict(sorted(guard.pending_sizes.items())))
            elif not short and guard.since is not None:
                over = t - guard.since - grace
                if over > 0:
                    guard.seconds += over
                    guard.episodes += 1
                    held, pending = guard.opened_with
                    guard.log.append(Episode(guard.since, over, guard.guarantee, held, pending))
                guard.since = None
            if short_gang and guard.since_gang is None:
                guard.since_gang = t
            elif not short_gang and guard.since_gang is not None:
                over = t - guard.since_gang - grace
                if over > 0:
                    guard.seconds_gang += over
                    guard.episodes_gang += 1
                guard.since_gang = None
