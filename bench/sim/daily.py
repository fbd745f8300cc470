"""Per team and day: GPU-seconds wanted and received, and how fairly a day's GPUs were shared.

Why per day: fair share over time (issue 15) is about who got the GPUs over
hours and days, not at one instant. A team *wants*, at each moment, the GPUs
of its running and pending jobs; it *receives* those it runs. Each day its
entitlement is its fair share of that day's GPU-seconds (guarantee first, the
rest water-filled by weight, never more than it wanted: the same rule the
policy uses for GPUs, applied to a day). Jain's index over the teams'
received / entitled ratios says how evenly the day went (1 = every team got
the same fraction of its entitlement).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from gpupool.policy.fairshare import ShareInput, fair_shares

DAY = 86400.0


class DailyLedger:
    """GPU-seconds per (team, day index), day 0 starting at ``origin``."""

    def __init__(self, origin: float, day_s: float = DAY) -> None:
        self.origin = origin
        self.day_s = day_s
        self.wanted: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.received: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def add(self, book: dict[str, dict[int, float]], team: str, t0: float, t1: float, gpus: float) -> None:
        """Book ``gpus`` held from ``t0`` to ``t1`` into the days they fall in (none before the origin)."""
        t0 = max(t0, self.origin)
        if gpus <= 0 or t1 <= t0:
            return
        days = book[team]
        while t0 < t1:
            k = math.floor((t0 - self.origin) / self.day_s)
            end = min(t1, self.origin + (k + 1) * self.day_s)
            days[k] += gpus * (end - t0)
            t0 = end


def jain(values: list[float]) -> float:
    """Jain's fairness index of ``values``: (sum x)^2 / (n * sum x^2), 1 when all are equal."""
    if not values:
        return 1.0
    square = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * square) if square > 0 else 1.0


def daily_fairness(ledger: DailyLedger, capacity_gpus: int, guarantees: Mapping[str, int],
                   days: int) -> list[float]:
    """Jain's index of received / entitled over the teams that wanted GPUs, for each of the first ``days`` days."""
    out = []
    day_s = ledger.day_s
    for k in range(days):
        wanted = {team: ledger.wanted[team].get(k, 0.0) for team in guarantees}
        inputs = {team: ShareInput(int(guarantees[team] * day_s), None, 1.0, int(wanted[team]))
                  for team in guarantees}
        entitled = fair_shares(int(capacity_gpus * day_s), inputs)
        ratios = [ledger.received[team].get(k, 0.0) / entitled[team]
                  for team in guarantees if wanted[team] > 0 and entitled[team] > 0]
        out.append(jain(ratios))
    return out
