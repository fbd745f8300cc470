"""Fair shares of the training pool: guarantees first, then water-filling by weight.

The engine orders pending training work by how far each project is below its
fair share, and picks reclaim victims from the projects furthest above it, so
the share has to be one well-defined number per project and cycle:

1. every project first gets ``min(guarantee, demand)``;
2. what capacity is left is poured out in proportion to the weights among the
   projects that still want more, each capped at ``min(limit, demand)``; a
   project that reaches its cap drops out and the rest is poured again.

``demand`` is what the project runs plus what it has pending, so idle
capacity goes only to projects that can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ShareInput:
    """One project's numbers for the water-filling, all in milli-GPU."""

    guarantee: int
    limit: int | None
    weight: float
    demand: int  # running + pending training work


def fair_shares(capacity: int, projects: Mapping[str, ShareInput]) -> dict[str, float]:
    """Each project's fair share (milli-GPU, may be fractional) of ``capacity``.

    Deterministic: projects are visited in name order, so the float sums are
    the same for the same input however the mapping was built.
    """
    names = sorted(projects)
    caps: dict[str, float] = {}
    share: dict[str, float] = {}
    for name in names:
        p = projects[name]
        cap = p.demand if p.limit is None else min(p.limit, p.demand)
        caps[name] = float(max(cap, 0))
        share[name] = min(float(max(p.guarantee, 0)), caps[name])
    left = float(capacity) - sum(share.values())
    active = [n for n in names if share[n] < caps[n] and projects[n].weight > 0]
    while left > 1e-9 and active:
        total_weight = sum(projects[n].weight for n in active)
        saturated = [n for n in active if caps[n] - share[n] <= left * projects[n].weight / total_weight]
        if not saturated:
            for n in active:
                share[n] += left * projects[n].weight / total_weight
            left = 0.0
            break
        for n in saturated:
            left -= caps[n] - share[n]
            share[n] = caps[n]
        active = [n for n in active if n not in saturated]
    return share


def entitlements(capacity: int, projects: Mapping[str, ShareInput]) -> dict[str, float]:
    """Each project's fair share when every project wants the whole pool (its ``demand`` is ignored).

    What a project is entitled to in the long run: the measure its recent use
    is compared with when users ask "how much of my share have we used?".
    """
    wanting = {name: ShareInput(p.guarantee, p.limit, p.weight, max(capacity, 0)) for name, p in projects.items()}
    return fair_shares(capacity, wanting)
