"""Each project's recent GPU use, decayed by a half-life: the history that fair share over time reads.

Why a decayed sum and not a window: it needs one number per project and kind,
updated in O(1) whenever what a project holds changes, and it forgets
smoothly (use a half-life ago counts half). Between two updates a project
holds a constant ``m`` milli-GPU, so the exact update over ``dt`` seconds is

    value <- value * 2^(-dt/H) + m * (H / ln 2) * (1 - 2^(-dt/H))

(the integral of ``m`` weighed by the decay from each instant to the end).
With ``H = 0`` nothing is kept: recent usage is 0 and fair share falls back
to what runs now. Values are milli-GPU-seconds; :func:`gpu_hours` converts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.policy.fairshare import ShareInput, entitlements

Key = tuple[str, str]  # (project, kind)


def gpu_hours(milli_seconds: float) -> float:
    return milli_seconds / 1000.0 / 3600.0


class DecayedUsage:
    """Decayed milli-GPU-seconds per (project, kind), advanced to a time by :meth:`accrue`."""

    def __init__(self, half_life_s: float, values: Mapping[Key, float] | None = None, t: float = 0.0) -> None:
        if half_life_s < 0:
            raise ValueError("the half-life must be >= 0 seconds")
        self.half_life_s = float(half_life_s)
        self.values: dict[Key, float] = dict(values or {}) if half_life_s > 0 else {}
        self.t = float(t)

    def _factor(self, dt: float) -> float:
        return 2.0 ** (-dt / self.half_life_s)

    def accrue(self, now: float, held: Mapping[Key, int]) -> None:
        """Advance to ``now``, ``held`` (milli-GPU per key) having been held since the last call."""
        if self.half_life_s <= 0:
            self.t = now
            return
        dt = now - self.t
        if self.t <= 0 or dt <= 0:  # first call, or a clock step back: start counting from here
            self.t = max(self.t, now)
            return
        decay = self._factor(dt)
        gained = self.half_life_s / math.log(2) * (1.0 - decay)
        for key in list(self.values):
            self.values[key] *= decay
        for key, milli in held.items():
            if milli:
                self.values[key] = self.values.get(key, 0.0) + milli * gained
        self.t = now

    def at(self, now: float) -> dict[Key, float]:
        """The values decayed to ``now`` (without what is held meanwhile: call :meth:`accrue` first)."""
        if self.half_life_s <= 0:
            return {}
        decay = self._factor(max(0.0, now - self.t))
        return {k: v * decay for k, v in self.values.items()}

    def average_milli(self, now: float, kind: str) -> dict[str, float]:
        """Per project, the milli-GPU of ``kind`` it held on average lately: what the policy reads.

        The decayed sum divided by ``H / ln 2`` (what holding ``m`` forever would
        sum to), so holding ``m`` all along gives ``m`` and one half-life of it,
        then nothing, gives ``m / 2``. Empty when no history is kept.
        """
        if self.half_life_s <= 0:
            return {}
        scale = math.log(2) / self.half_life_s
        return {p: v * scale for (p, k), v in self.at(now).items() if k == kind and v > 0}

    def rows(self) -> Iterable[tuple[str, str, float]]:
        """What the store keeps: (project, kind, value) at time :attr:`t`."""
        return ((p, k, v) for (p, k), v in self.values.items())


def used_ratio(share_milli: float, recent_milli: float) -> float | None:
    """Use over the long-run share, from the unrounded figures; None when there is no such number.

    ``recent_milli``: the project's training use as the policy measures it,
    what it runs now plus what it held on average lately (:func:`fair_share_figures`).

    Why not the shown figures: a project whose share is a few micro-GPUs (a
    weight of 1e-9, or one of thousands of personal projects) shows ``0.0``
    GPUs, and dividing by that stopped the service's tick (issue 22). A share
    of 0 has no ratio, and neither has a share so small that the quotient
    overflows a float: both read None (the gauge is then absent, the CLI shows
    no percentage), never an infinity or an error.
    """
    if not share_milli > 0 or not math.isfinite(share_milli) or not math.isfinite(recent_milli):
        return None
    ratio = max(recent_milli, 0.0) / share_milli
    return ratio if math.isfinite(100.0 * ratio) else None


def fair_share_figures(train_capacity_milli: int, projects: Mapping[str, ShareInput],
                       average_train_milli: Mapping[str, float],
                       current_train_milli: Mapping[str, float] | None = None) -> dict[str, tuple[float, float]]:
    """Per project, (long-run share, training use) in milli-GPU, unrounded.

    The use is the policy's measure (``standing`` in the engine: idle GPUs
    beyond guarantees go first to the lowest use over share): what the project
    runs now (``current_train_milli``) plus what it held on average lately.
    Why both: the average alone has a half-life of days, so a project that
    has just started 3 GPUs on a guarantee of 1 read "0%" (issue 22) while the
    policy already ranked it by those 3 GPUs.

    The one source of both the wire ``fair_share`` percentage and the
    used-ratio gauge, so that they agree, and neither divides by a figure that
    was rounded for showing.
    """
    shares = entitlements(train_capacity_milli, projects)
    now = current_train_milli or {}
    return {name: (shares.get(name, 0.0), max(now.get(name, 0.0), 0.0) + average_train_milli.get(name, 0.0))
            for name in projects}


def fair_share_standing(train_capacity_milli: int, projects: Mapping[str, ShareInput],
                        average_train_milli: Mapping[str, float], history: bool,
                        current_train_milli: Mapping[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """Per project, the wire ``fair_share``: its long-run share, its recent training use and the ratio.

    ``gpus``: the project's share of the train pool when every project wants
    all of it (guarantee, then idle GPUs by weight); ``recent_gpus``: the GPUs
    it held on average lately; ``percent``: what it runs now
    (``current_train_milli``) plus ``recent_gpus``, over ``gpus``, as the
    policy ranks projects (:func:`fair_share_figures`), from the unrounded
    figures (:func:`used_ratio`); ``None`` when no history is kept or the
    share has no ratio (a share of 0). The shown figures are rounded to a
    milli-GPU, so a share of a few micro-GPUs shows ``0.0``.
    """
    out: dict[str, dict[str, Any]] = {}
    figures = fair_share_figures(train_capacity_milli, projects, average_train_milli, current_train_milli)
    for name, (share, used) in figures.items():
        ratio = used_ratio(share, used) if history else None
        out[name] = {
            "gpus": round(share / 1000.0, 3),
            "recent_gpus": round(average_train_milli.get(name, 0.0) / 1000.0, 3),
            "percent": round(100.0 * ratio) if ratio is not None else None,
        }
    return out
